//! How a key, value or header is shown: Avro decoded through the registry (Confluent
//! framing), JSON pretty-printed, UTF-8 text as is, anything else as hex. Everything shown
//! is bounded, so one large record cannot make a large page.

use std::fmt::Write;

use fjord_schema_registry::RegistryClient;

/// Characters of text (or pretty JSON) shown of one value; the rest is cut with a note.
pub(crate) const MAX_TEXT_CHARS: usize = 16 * 1024;
/// Bytes shown as hex of one binary value.
pub(crate) const MAX_HEX_BYTES: usize = 1024;

/// A value as the page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shown {
    /// No value (a null key, a tombstone).
    Null,
    /// Avro, decoded with the writer's schema, as pretty JSON.
    Avro { schema_id: i32, json: String },
    /// Confluent-framed but not decodable: why, and the bytes.
    BadAvro { schema_id: i32, error: String, hex: String },
    /// JSON object or array, pretty-printed.
    Json(String),
    /// UTF-8 text.
    Text(String),
    /// Binary: a hex dump of the first bytes.
    Hex(String),
}

impl Shown {
    /// The short label of the format (`avro`, `json`, `text`, `hex`, `null`).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Shown::Null => "null",
            Shown::Avro { .. } => "avro",
            Shown::BadAvro { .. } => "avro?",
            Shown::Json(_) => "json",
            Shown::Text(_) => "text",
            Shown::Hex(_) => "hex",
        }
    }
}

/// Shows `bytes` without the registry: JSON, text or hex.
pub(crate) fn plain(bytes: Option<&[u8]>) -> Shown {
    let Some(b) = bytes else { return Shown::Null };
    let trimmed = b.iter().position(|c| !c.is_ascii_whitespace()).map(|i| &b[i..]).unwrap_or_default();
    if matches!(trimmed.first(), Some(b'{' | b'[')) {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(b) {
            if let Ok(pretty) = serde_json::to_string_pretty(&v) {
                return Shown::Json(cut(pretty, b.len()));
            }
        }
    }
    match std::str::from_utf8(b) {
        Ok(s) if s.chars().all(|c| !c.is_control() || matches!(c, '\n' | '\r' | '\t')) => {
            Shown::Text(cut(s.to_string(), b.len()))
        }
        _ => Shown::Hex(hex(b)),
    }
}

/// Shows a value: Avro through `registry` when it is Confluent-framed (magic byte 0 and a
/// schema id), else as [`plain`].
pub(crate) async fn value(registry: Option<&RegistryClient>, bytes: Option<&[u8]>) -> Shown {
    match (registry, bytes) {
        (Some(registry), Some(b)) if b.len() >= 5 && b[0] == 0 => {
            let schema_id = i32::from_be_bytes([b[1], b[2], b[3], b[4]]);
            let decoded = tokio::time::timeout(std::time::Duration::from_secs(5), registry.deserialize(b)).await;
            match decoded {
                Ok(Ok(d)) => match serde_json::Value::try_from(d.value) {
                    Ok(json) => {
                        Shown::Avro { schema_id, json: cut(serde_json::to_string_pretty(&json).unwrap_or_default(), b.len()) }
                    }
                    Err(e) => Shown::BadAvro { schema_id, error: format!("not representable as JSON: {e}"), hex: hex(b) },
                },
                Ok(Err(e)) => Shown::BadAvro { schema_id, error: e.to_string(), hex: hex(b) },
                Err(_) => {
                    Shown::BadAvro { schema_id, error: "the schema registry did not answer within 5 s".into(), hex: hex(b) }
                }
            }
        }
        (_, b) => plain(b),
    }
}

/// `s` cut to [`MAX_TEXT_CHARS`] characters, with a note of the full size.
fn cut(mut s: String, total_bytes: usize) -> String {
    if let Some((i, _)) = s.char_indices().nth(MAX_TEXT_CHARS) {
        s.truncate(i);
        let _ = write!(s, "\n… cut: the value has {total_bytes} bytes");
    }
    s
}

/// A hex dump (offset, 16 bytes a line) of the first [`MAX_HEX_BYTES`].
pub(crate) fn hex(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len().min(MAX_HEX_BYTES) * 3 + 16);
    for (line, chunk) in b[..b.len().min(MAX_HEX_BYTES)].chunks(16).enumerate() {
        let _ = write!(out, "{:04x} ", line * 16);
        for byte in chunk {
            let _ = write!(out, " {byte:02x}");
        }
        out.push('\n');
    }
    if b.len() > MAX_HEX_BYTES {
        let _ = write!(out, "… cut: the value has {} bytes", b.len());
    }
    out
}

/// A header value: text when it is, else hex.
pub(crate) fn header(bytes: Option<&[u8]>) -> String {
    match plain(bytes) {
        Shown::Null => "null".into(),
        Shown::Json(s) | Shown::Text(s) => s,
        Shown::Hex(h) => h,
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_pretty_text_is_text_and_binary_is_hex() {
        assert_eq!(plain(None), Shown::Null);
        assert_eq!(plain(Some(br#"{"a":1}"#)), Shown::Json("{\n  \"a\": 1\n}".into()));
        assert_eq!(plain(Some(b"{not json")), Shown::Text("{not json".into()));
        assert_eq!(plain(Some(b"hello\tworld\n")), Shown::Text("hello\tworld\n".into()));
        assert_eq!(plain(Some(b"42")), Shown::Text("42".into()), "a JSON scalar reads better as text");
        assert_eq!(plain(Some(&[0xff, 0x00, 0x41])), Shown::Hex("0000  ff 00 41\n".into()));
        assert_eq!(plain(Some(b"a\x00b")).kind(), "hex", "control characters are binary");
    }

    #[test]
    fn large_values_are_cut_with_their_size() {
        let big = "x".repeat(MAX_TEXT_CHARS + 10);
        let Shown::Text(s) = plain(Some(big.as_bytes())) else { panic!("text") };
        assert!(s.ends_with(&format!("cut: the value has {} bytes", big.len())), "{}", &s[s.len() - 60..]);
        let bin = vec![0xfeu8; MAX_HEX_BYTES * 4];
        let h = hex(&bin);
        assert_eq!(h.lines().count(), MAX_HEX_BYTES / 16 + 1);
        assert!(h.ends_with(&format!("the value has {} bytes", bin.len())));
    }

    #[tokio::test]
    async fn framed_values_without_a_registry_are_not_decoded() {
        // Magic byte and schema id, but no registry configured: shown as bytes.
        assert_eq!(value(None, Some(&[0, 0, 0, 0, 1, 2])).await.kind(), "hex");
    }
}
