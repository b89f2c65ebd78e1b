//! Property tests of the NDJSON parser over hostile bodies: whatever the bytes, it never
//! panics, and in dead-letter mode every non-blank line ends up exactly once, either as an
//! event carrying the line's exact bytes or handed to the dead-letter callback.

use proptest::prelude::*;

use super::produce::parse_ndjson_with;

/// Valid lines, broken ones and raw bytes, joined by `\n` or `\r\n`.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let line = prop_oneof![
        "[a-z]{0,8}".prop_map(|u| format!("{{\"user\":\"{u}\",\"page\":\"/p\"}}").into_bytes()),
        "\\{\"user\":[0-9a-z\"\\[\\]{},:]{0,12}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..24),
        Just(b"   ".to_vec()),
    ];
    (proptest::collection::vec((line, any::<bool>()), 0..24)).prop_map(|lines| {
        let mut body = Vec::new();
        for (line, crlf) in lines {
            body.extend(line);
            body.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
        }
        body
    })
}

proptest! {
    #[test]
    fn every_line_is_an_event_or_a_dead_letter_exactly_once(body in body()) {
        let mut dead = Vec::new();
        let events = parse_ndjson_with(&body, Some("user"), None, None, |index, line, _| {
            dead.push((index, line.to_vec()));
            Ok(())
        })
        .expect("dead-letter mode refuses no line");
        let lines: Vec<&[u8]> = body
            .split(|&b| b == b'\n')
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
            .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
            .collect();
        prop_assert_eq!(events.len() + dead.len(), lines.len());
        let mut kept = events.iter().map(|e| e.value.as_deref().unwrap_or_default().to_vec());
        let mut set_aside = dead.iter().map(|(_, line)| line.clone());
        let (mut next_kept, mut next_dead) = (kept.next(), set_aside.next());
        for line in lines {
            // Order is kept on both sides: each line is the next of one of them.
            if next_kept.as_deref() == Some(line) {
                next_kept = kept.next();
            } else {
                prop_assert_eq!(next_dead.as_deref(), Some(line));
                next_dead = set_aside.next();
            }
        }
    }

    #[test]
    fn reject_mode_never_panics_on_raw_bytes(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_ndjson_with(&body, Some("user"), None, None, |_, _, e| Err(e));
    }
}
