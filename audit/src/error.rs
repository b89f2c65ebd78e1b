//! The crate's one error type.

/// What can go wrong counting, publishing or reporting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The brokers refused or could not be reached.
    #[error(transparent)]
    Client(#[from] fjord_client::Error),
    /// `--topics` is not a valid regular expression.
    #[error("invalid topic regex: {0}")]
    InvalidRegex(String),
    /// A setting is out of range (window length, tolerance, a time).
    #[error("invalid setting: {0}")]
    InvalidConfig(String),
    /// Encoding the JSON report failed (not expected: the report is plain data).
    #[error("encoding the report")]
    Encode(#[from] serde_json::Error),
    /// Reading a topic took longer than the configured bound.
    #[error("reading {topic} did not reach its high watermark within {timeout:?}")]
    ReadTimeout {
        /// The topic being read.
        topic: String,
        /// The bound.
        timeout: std::time::Duration,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
