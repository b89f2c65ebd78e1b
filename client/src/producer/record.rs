//! [`ProducerRecord`]: what an application sends, and the upper bound of its size in a
//! batch that the memory budget charges.

use bytes::Bytes;

/// A record to send.
#[derive(Debug, Clone, Default)]
pub struct ProducerRecord {
    /// Topic.
    pub topic: String,
    /// Explicit partition; `None` lets the partitioner choose.
    pub partition: Option<i32>,
    /// Key (decides the partition when there is no explicit one).
    pub key: Option<Bytes>,
    /// Value; `None` is a null value (a tombstone).
    pub value: Option<Bytes>,
    /// Headers, in order.
    pub headers: Vec<(String, Option<Bytes>)>,
    /// Create time in ms since the epoch; `None` means now.
    pub timestamp: Option<i64>,
}

impl ProducerRecord {
    /// A record with a value and nothing else.
    pub fn new(topic: impl Into<String>, value: impl Into<Bytes>) -> Self {
        Self { topic: topic.into(), value: Some(value.into()), ..Self::default() }
    }

    /// Sets the key.
    pub fn key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets an explicit partition.
    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Adds a header.
    pub fn header(mut self, key: impl Into<String>, value: Option<Bytes>) -> Self {
        self.headers.push((key.into(), value));
        self
    }

    /// Sets the timestamp.
    pub fn timestamp(mut self, timestamp: i64) -> Self {
        self.timestamp = Some(timestamp);
        self
    }

    /// Bytes this record takes inside a batch (upper bound: varints counted at 5/10 bytes).
    pub fn encoded_size(&self) -> usize {
        let nullable = |b: &Option<Bytes>| 5 + b.as_ref().map_or(0, Bytes::len);
        let headers: usize = self.headers.iter().map(|(k, v)| 5 + k.len() + nullable(v)).sum();
        5 + 1 + 10 + 5 + nullable(&self.key) + nullable(&self.value) + 5 + headers
    }
}

#[cfg(test)]
mod tests {
    use fjord_record::{BatchBuilder, BATCH_OVERHEAD};

    use super::*;

    #[test]
    fn encoded_size_is_an_upper_bound() {
        let r = ProducerRecord::new("t", vec![1u8; 200]).key(&b"k"[..]).header("h", Some(Bytes::from_static(b"v")));
        let mut b = BatchBuilder::new(0);
        b.append(0, Some(b"k"), Some(&[1u8; 200]), &[("h", Some(b"v"))]);
        assert!(r.encoded_size() >= b.size() - BATCH_OVERHEAD);
        assert!(r.encoded_size() <= b.size() - BATCH_OVERHEAD + 40);
    }
}
