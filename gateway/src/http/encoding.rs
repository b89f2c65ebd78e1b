//! `Content-Encoding` of request bodies: gzip, deflate and zstd, decoded with the body
//! limit applied to the decoded bytes too.
//!
//! A compressed body is first read whole up to the limit (as any body), then inflated
//! by a streaming decoder that is stopped one byte past the limit: a 10 KB gzip body
//! that would inflate to 10 MB costs at most `limit + 1` bytes of output before it is
//! refused with 413, never the size it claims. Decoding runs on the blocking pool (it is
//! CPU work), at most [`DECODE_TASKS`] at once, so decoded buffers in memory are bounded
//! by `DECODE_TASKS × (limit + 1)` whatever the number of clients.

use std::io::Read;

use axum::http::{header, HeaderMap};
use bytes::Bytes;
use tokio::sync::Semaphore;

use crate::{Error, Result};

/// Bodies being decoded at once (each holds up to `max_body_bytes + 1` of output).
pub(crate) const DECODE_TASKS: usize = 4;

/// zstd window limit: RFC 8878 §3.1.1.1.2 (the `zstd` content coding) caps the window at
/// 8 MB. The decoder allocates the window a frame declares; without this cap a tiny
/// frame could make it allocate zstd's own default limit of 128 MB.
const ZSTD_WINDOW_LOG_MAX: u32 = 23;

/// One content coding of a request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coding {
    Gzip,
    Deflate,
    Zstd,
}

impl Coding {
    fn name(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Deflate => "deflate",
            Coding::Zstd => "zstd",
        }
    }
}

/// The codings of `Content-Encoding`, in the order the sender applied them (`identity`
/// dropped). An unknown coding is 415: guessing would turn a body we cannot read into
/// "malformed JSON" at best.
pub(crate) fn codings(headers: &HeaderMap) -> Result<Vec<Coding>> {
    let mut out = Vec::new();
    for value in headers.get_all(header::CONTENT_ENCODING) {
        let text = value.to_str().map_err(|_| Error::UnsupportedEncoding(String::from_utf8_lossy(value.as_bytes()).into()))?;
        for token in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            match token.to_ascii_lowercase().as_str() {
                "identity" => {}
                "gzip" | "x-gzip" => out.push(Coding::Gzip),
                "deflate" => out.push(Coding::Deflate),
                "zstd" => out.push(Coding::Zstd),
                _ => return Err(Error::UnsupportedEncoding(token.to_string())),
            }
        }
    }
    // Each layer is bounded, but layers multiply CPU; two is more than any client sends.
    if out.len() > 2 {
        return Err(Error::UnsupportedEncoding(format!("{} stacked codings (at most 2)", out.len())));
    }
    Ok(out)
}

/// Decodes `body` (encoded with `codings`, in that order) on the blocking pool, taking
/// one of `slots` for the time it runs. More than `limit` decoded bytes is 413.
pub(crate) async fn decode(slots: &Semaphore, body: Bytes, codings: Vec<Coding>, limit: usize) -> Result<Bytes> {
    if codings.is_empty() {
        return Ok(body);
    }
    let _slot = slots.acquire().await.map_err(|_| Error::Unavailable("the gateway is stopping".into()))?;
    tokio::task::spawn_blocking(move || {
        codings.iter().rev().try_fold(body, |data, coding| decode_one(*coding, &data, limit).map(Bytes::from))
    })
    .await
    .map_err(|e| Error::Unavailable(format!("decoding task failed: {e}")))?
}

/// Inflates one layer, reading at most `limit + 1` bytes of output.
fn decode_one(coding: Coding, data: &[u8], limit: usize) -> Result<Vec<u8>> {
    let reader: Box<dyn Read + '_> = match coding {
        // Multi-member: `cat a.gz b.gz` is a valid gzip body, and curl users do that.
        Coding::Gzip => Box::new(flate2::read::MultiGzDecoder::new(data)),
        // HTTP's "deflate" is zlib-wrapped (RFC 9110 §8.4.1.2), but some clients send raw
        // deflate; a zlib header is recognisable by its check bits, so accept both.
        Coding::Deflate if is_zlib_header(data) => Box::new(flate2::read::ZlibDecoder::new(data)),
        Coding::Deflate => Box::new(flate2::read::DeflateDecoder::new(data)),
        Coding::Zstd => {
            let mut d = zstd::stream::read::Decoder::with_buffer(data).map_err(|e| corrupt(coding, &e))?;
            d.window_log_max(ZSTD_WINDOW_LOG_MAX).map_err(|e| corrupt(coding, &e))?;
            Box::new(d)
        }
    };
    // Start small: the declared size of a compressed body says nothing about its output.
    let mut out = Vec::with_capacity(data.len().saturating_mul(4).min(limit.saturating_add(1)));
    reader.take(limit as u64 + 1).read_to_end(&mut out).map_err(|e| corrupt(coding, &e))?;
    if out.len() > limit {
        return Err(Error::PayloadTooLarge { limit });
    }
    Ok(out)
}

fn is_zlib_header(data: &[u8]) -> bool {
    matches!(data, [cmf, flg, ..] if cmf & 0x0f == 8 && ((u16::from(*cmf) << 8) | u16::from(*flg)) % 31 == 0)
}

fn corrupt(coding: Coding, e: &dyn std::fmt::Display) -> Error {
    Error::BadRequest { index: None, reason: format!("the body is not valid {}: {e}", coding.name()) }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn headers(encoding: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_ENCODING, encoding.parse().unwrap());
        h
    }

    #[tokio::test]
    async fn each_coding_round_trips_and_the_limit_counts_decoded_bytes() {
        let slots = Semaphore::new(1);
        let text = b"{\"a\":1}\n".repeat(100);
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        zlib.write_all(&text).unwrap();
        let mut raw = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        raw.write_all(&text).unwrap();
        let cases = [
            ("gzip", gzip(&text)),
            ("deflate", zlib.finish().unwrap()),
            ("deflate", raw.finish().unwrap()),
            ("zstd", zstd::encode_all(&text[..], 3).unwrap()),
            ("gzip, zstd", zstd::encode_all(&gzip(&text)[..], 3).unwrap()),
            ("identity", text.clone()),
        ];
        for (encoding, body) in cases {
            let c = codings(&headers(encoding)).unwrap();
            let out = decode(&slots, body.into(), c, text.len()).await.unwrap();
            assert_eq!(&out[..], &text[..], "{encoding}");
        }
        let c = codings(&headers("gzip")).unwrap();
        let e = decode(&slots, gzip(&text).into(), c, text.len() - 1).await.unwrap_err();
        assert_eq!(e.http_status(), 413);
        assert_eq!(codings(&headers("br")).unwrap_err().http_status(), 415);
        assert_eq!(codings(&headers("gzip, gzip, gzip")).unwrap_err().http_status(), 415);
        let e = decode(&slots, Bytes::from_static(b"not gzip"), vec![Coding::Gzip], 100).await.unwrap_err();
        assert_eq!(e.http_status(), 400, "{e}");
        assert!(e.to_string().contains("gzip"), "{e}");
    }

    #[tokio::test]
    async fn a_zstd_frame_declaring_a_huge_window_is_refused() {
        // Window log 27 (128 MiB), above the 8 MiB cap of the HTTP zstd coding.
        let mut e = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        e.window_log(27).unwrap();
        e.long_distance_matching(true).unwrap();
        e.write_all(&vec![7u8; 1 << 20]).unwrap();
        let body = e.finish().unwrap();
        let err = decode(&Semaphore::new(1), body.into(), vec![Coding::Zstd], 64 << 20).await.unwrap_err();
        assert_eq!(err.http_status(), 400, "{err}");
    }
}
