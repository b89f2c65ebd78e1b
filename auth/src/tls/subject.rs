//! The subject of an X.509 certificate as an RFC 2253 string, the way Kafka names a
//! TLS client (`X500Principal.getName()`): `CN=alice,OU=eng,O=Example,C=NO`, the RDNs
//! in reverse order of the DER encoding, attribute types by their RFC 2253 keywords or
//! dotted OIDs, values escaped, values of types that are no strings as `#` + hex DER.
//!
//! Why a DER walk of our own: only the subject is needed, a path of six TLVs into the
//! certificate; an X.509 crate would bring a full ASN.1 stack for it. Anything that does
//! not walk is an error (the handshake already verified the certificate's signature, so
//! this is a certificate the trust store vouches for).

use std::fmt::Write as _;

/// Universal DER tags used on the way to the subject.
const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const INTEGER: u8 = 0x02;
const OID: u8 = 0x06;
const VERSION: u8 = 0xA0;

/// The subject of the DER certificate `der`, RFC 2253; `None` if it does not parse.
pub(crate) fn subject_rfc2253(der: &[u8]) -> Option<String> {
    let (tag, certificate, _) = tlv(der)?;
    (tag == SEQUENCE).then_some(())?;
    let (tag, mut tbs, _) = tlv(certificate)?;
    (tag == SEQUENCE).then_some(())?;
    let mut next = |expected: Option<u8>| -> Option<(u8, &[u8], &[u8])> {
        let (tag, content, rest) = tlv(tbs)?;
        let whole = &tbs[..tbs.len() - rest.len()];
        tbs = rest;
        expected.is_none_or(|e| e == tag).then_some((tag, content, whole))
    };
    let (tag, _, _) = next(None)?;
    if tag == VERSION {
        next(Some(INTEGER))?; // serial number
    } else if tag != INTEGER {
        return None;
    }
    next(Some(SEQUENCE))?; // signature algorithm
    next(Some(SEQUENCE))?; // issuer
    next(Some(SEQUENCE))?; // validity
    let (_, subject, _) = next(Some(SEQUENCE))?;
    name_rfc2253(subject)
}

/// A Name's RDN sequence (the content of its SEQUENCE) as RFC 2253.
fn name_rfc2253(mut rdns: &[u8]) -> Option<String> {
    let mut parts = Vec::new();
    while !rdns.is_empty() {
        let (tag, mut set, rest) = tlv(rdns)?;
        (tag == SET).then_some(())?;
        rdns = rest;
        let mut attributes = Vec::new();
        while !set.is_empty() {
            let (tag, attribute, rest) = tlv(set)?;
            (tag == SEQUENCE).then_some(())?;
            set = rest;
            let (tag, oid, value) = tlv(attribute)?;
            (tag == OID).then_some(())?;
            let oid = dotted(oid)?;
            let (value_tag, content, after) = tlv(value)?;
            after.is_empty().then_some(())?;
            let keyword = keyword(&oid);
            let text = match (keyword, string_value(value_tag, content)) {
                (Some(_), Some(text)) => escape(&text),
                _ => format!("#{}", hex(value)),
            };
            attributes.push(format!("{}={text}", keyword.map_or(oid.clone(), str::to_owned)));
        }
        parts.push(attributes.join("+"));
    }
    parts.reverse();
    Some(parts.join(","))
}

/// One TLV: (tag, content, what follows). Single-byte tags, definite lengths (DER).
fn tlv(bytes: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = bytes.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        (1..=4).contains(&count).then_some(())?;
        let (bytes, after) = (rest.get(..count)?, rest.get(count..)?);
        rest = after;
        bytes.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b))
    };
    Some((tag, rest.get(..len)?, rest.get(len..)?))
}

fn dotted(oid: &[u8]) -> Option<String> {
    let (&first, rest) = oid.split_first()?;
    let mut text = format!("{}.{}", first / 40, first % 40);
    let mut arc: u64 = 0;
    for &b in rest {
        arc = arc.checked_mul(128)? | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            let _ = write!(text, ".{arc}");
            arc = 0;
        }
    }
    Some(text)
}

/// The RFC 2253 keyword of an attribute type, as Java writes them.
fn keyword(oid: &str) -> Option<&'static str> {
    Some(match oid {
        "2.5.4.3" => "CN",
        "2.5.4.6" => "C",
        "2.5.4.7" => "L",
        "2.5.4.8" => "ST",
        "2.5.4.9" => "STREET",
        "2.5.4.10" => "O",
        "2.5.4.11" => "OU",
        "0.9.2342.19200300.100.1.25" => "DC",
        "0.9.2342.19200300.100.1.1" => "UID",
        _ => return None,
    })
}

/// The text of a directory string value.
fn string_value(tag: u8, content: &[u8]) -> Option<String> {
    match tag {
        // UTF8String, PrintableString, IA5String, NumericString, VisibleString
        0x0C | 0x13 | 0x16 | 0x12 | 0x1A => std::str::from_utf8(content).ok().map(str::to_owned),
        // TeletexString: Latin-1 in practice
        0x14 => Some(content.iter().map(|&b| char::from(b)).collect()),
        // BMPString: UTF-16BE
        0x1E if content.len().is_multiple_of(2) => {
            char::decode_utf16(content.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]]))).collect::<Result<_, _>>().ok()
        }
        _ => None,
    }
}

/// RFC 2253 escaping of an attribute value.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == '#' || c == ' '))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tlv_of(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        if content.len() < 0x80 {
            out.push(content.len() as u8);
        } else {
            out.extend([0x82, (content.len() >> 8) as u8, content.len() as u8]);
        }
        out.extend_from_slice(content);
        out
    }

    fn attribute(oid: &[u8], tag: u8, value: &[u8]) -> Vec<u8> {
        tlv_of(SET, &tlv_of(SEQUENCE, &[tlv_of(OID, oid), tlv_of(tag, value)].concat()))
    }

    fn certificate(subject_rdns: &[Vec<u8>]) -> Vec<u8> {
        let tbs = [
            tlv_of(VERSION, &tlv_of(INTEGER, &[2])),
            tlv_of(INTEGER, &[1, 2, 3]),
            tlv_of(SEQUENCE, &tlv_of(OID, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02])),
            tlv_of(SEQUENCE, &attribute(&[0x55, 0x04, 0x03], 0x0C, b"Test CA")),
            tlv_of(SEQUENCE, &[0u8; 30]),
            tlv_of(SEQUENCE, &subject_rdns.concat()),
            tlv_of(SEQUENCE, &[0u8; 200]), // public key info: long-form length
        ]
        .concat();
        tlv_of(SEQUENCE, &[tlv_of(SEQUENCE, &tbs), tlv_of(SEQUENCE, &[]), tlv_of(0x03, &[0])].concat())
    }

    #[test]
    fn subjects_are_rfc2253_in_reverse_order_and_escaped() {
        let der = certificate(&[
            attribute(&[0x55, 0x04, 0x06], 0x13, b"NO"),
            attribute(&[0x55, 0x04, 0x0A], 0x0C, b"Example, Inc"),
            attribute(&[0x55, 0x04, 0x03], 0x0C, b"alice"),
        ]);
        assert_eq!(subject_rfc2253(&der).unwrap(), "CN=alice,O=Example\\, Inc,C=NO");
        // An unknown attribute type is its OID with the value as hex DER (as Java writes
        // emailAddress).
        let der = certificate(&[attribute(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x01], 0x16, b"a@b")]);
        assert_eq!(subject_rfc2253(&der).unwrap(), "1.2.840.113549.1.9.1=#1603614062");
        assert_eq!(subject_rfc2253(&certificate(&[])).unwrap(), "");
    }

    #[test]
    fn anything_that_does_not_walk_is_none() {
        let der = certificate(&[attribute(&[0x55, 0x04, 0x03], 0x0C, b"alice")]);
        for cut in [0, 1, 5, 20, der.len() - 3] {
            assert_eq!(subject_rfc2253(&der[..cut]), None, "cut at {cut}");
        }
        assert_eq!(subject_rfc2253(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(subject_rfc2253(b"garbage"), None);
    }
}
