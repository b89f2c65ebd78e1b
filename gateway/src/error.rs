//! The gateway's one error type, and how each failure maps to an HTTP status (with a
//! Confluent-style `error_code`) and to a gRPC status code.

use std::time::Duration;

use fjord_client::ResponseError;

/// Everything a gateway request (or the gateway's startup) can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A [`GatewayConfig`](crate::GatewayConfig) setting that cannot work.
    #[error("invalid gateway config: {0}")]
    Config(String),
    /// Serving HTTP or gRPC failed (accept, bind, transport).
    #[error("gateway server: {0}")]
    Serve(String),
    /// The request body or a record in it is not well-formed (bad JSON, bad base64, a
    /// missing field). `index` is the record (v2) or line (NDJSON, 0-based) at fault.
    #[error("{}{reason}", at(*index))]
    BadRequest {
        /// Record or line index, when one record is at fault.
        index: Option<usize>,
        /// What is wrong.
        reason: String,
    },
    /// The request is well-formed but cannot be produced as asked (e.g. a key field that
    /// is missing, a record larger than the broker accepts).
    #[error("{}{reason}", at(*index))]
    Unprocessable {
        /// Record or line index, when one record is at fault.
        index: Option<usize>,
        /// What is wrong.
        reason: String,
    },
    /// A value does not match its Avro schema; `path` names the field (`$.address.zip`).
    #[error("{}value does not match schema {schema_id} at {path}: {reason}", at(Some(*index)))]
    AvroMismatch {
        /// Record or line index.
        index: usize,
        /// Registry id of the schema.
        schema_id: i32,
        /// JSON path of the offending field.
        path: String,
        /// What is wrong there.
        reason: String,
    },
    /// The registry has no schema with this id.
    #[error("schema {0} not found")]
    UnknownSchema(i32),
    /// The registry refused the schema or is unreachable.
    #[error("schema registry: {0}")]
    Registry(#[source] fjord_schema_registry::Error),
    /// Avro was asked for but the gateway runs without `--registry`.
    #[error("Avro needs a schema registry, and this gateway has none configured (--registry)")]
    NoRegistry,
    /// A `Content-Type` the endpoint does not take.
    #[error("unsupported content type {0:?}; expected one of application/vnd.kafka.{{json,binary,avro}}.v2+json")]
    UnsupportedMediaType(String),
    /// A `Content-Encoding` the gateway cannot decode (it takes gzip, deflate, zstd).
    #[error("unsupported content encoding {0:?}; the gateway decodes gzip, deflate and zstd")]
    UnsupportedEncoding(String),
    /// The body (as sent, or once decoded) is larger than `max_body_bytes`.
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// The request's origin may not call the gateway, or not for this topic (CORS), or
    /// its principal lacks the ACL (Write on the topic to publish, Read to pull).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// No credentials where they are required, or wrong ones (401 with
    /// `WWW-Authenticate`; gRPC UNAUTHENTICATED).
    #[error("unauthorized: {reason}")]
    Unauthenticated {
        /// What is missing or wrong (never the password).
        reason: String,
        /// The `WWW-Authenticate` challenge (`Basic realm="..."`).
        challenge: String,
    },
    /// The topic does not exist (and the broker does not auto-create it).
    #[error("topic {0} not found")]
    UnknownTopic(String),
    /// The topic has no such partition.
    #[error("partition {partition} of topic {topic} not found")]
    UnknownPartition {
        /// Topic.
        topic: String,
        /// Partition asked for.
        partition: i32,
    },
    /// The fetch offset is outside the partition's log.
    #[error("offset {offset} is out of range for {topic}-{partition}")]
    OffsetOutOfRange {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset asked for.
        offset: i64,
    },
    /// The gateway's producer buffer is full: the caller should retry after `retry_after`.
    #[error("producer buffer is full ({used} of {capacity} bytes in use); retry after {retry_after:?}")]
    BufferFull {
        /// Bytes waiting for acknowledgement now.
        used: usize,
        /// The configured bound.
        capacity: usize,
        /// Suggested pause.
        retry_after: Duration,
    },
    /// The client (principal, or IP address when anonymous) is over its requests/s or
    /// bytes/s limit: it should retry after `retry_after`.
    #[error("{client} is over its limit of {limit}; retry after {retry_after:?}")]
    RateLimited {
        /// The client as the limits key it.
        client: String,
        /// The limit it is over (`10 requests/s`).
        limit: String,
        /// When its allowance covers another request.
        retry_after: Duration,
    },
    /// The brokers did not answer within the bounded wait.
    #[error("broker unavailable: {0}")]
    Unavailable(String),
    /// An atomic publish failed and its transaction was aborted: none of the request's
    /// events is or will be visible to read_committed consumers. Status, code and record
    /// index are the cause's.
    #[error("atomic publish aborted, none of its events will be visible to read_committed consumers: {0}")]
    Aborted(Box<Error>),
    /// The broker or the client library failed in a way not listed above.
    #[error("broker: {0}")]
    Broker(#[source] fjord_client::Error),
}

fn at(index: Option<usize>) -> String {
    index.map(|i| format!("record {i}: ")).unwrap_or_default()
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<fjord_client::Error> for Error {
    /// Sorts client failures into what the caller can act on: unknown names are 404,
    /// a full buffer is 429, anything that says "the brokers are not there" is 503.
    fn from(e: fjord_client::Error) -> Self {
        use fjord_client::Error as C;
        match e {
            C::UnknownTopic(topic) => Error::UnknownTopic(topic),
            C::UnknownPartition { topic, partition } => Error::UnknownPartition { topic, partition },
            C::Kafka { code: ResponseError::UnknownTopicOrPartition, context, .. } => Error::UnknownTopic(context),
            // The caller's own ACL was checked already: the brokers refused the gateway's
            // identity, e.g. a missing topic it may not create (auto-creation needs Create).
            C::Kafka { code: ResponseError::TopicAuthorizationFailed, context, .. } => Error::Forbidden(format!(
                "{context}: the brokers refused the gateway (a missing topic is created only with Create on it)"
            )),
            // The brokers refused the records themselves (a timestamp beyond the topic's
            // message.timestamp.after.max.ms, a keyless record on a compacted topic):
            // the caller's to fix, not the gateway's failure.
            C::Kafka { code: code @ (ResponseError::InvalidTimestamp | ResponseError::InvalidRecord), context, message } => {
                Error::Unprocessable {
                    index: None,
                    reason: format!("{context}: {}", message.unwrap_or_else(|| format!("{code:?}"))),
                }
            }
            C::BufferFull { buffer_memory, .. } => {
                Error::BufferFull { used: buffer_memory, capacity: buffer_memory, retry_after: Duration::from_secs(1) }
            }
            e if e.is_retriable() || matches!(e, C::BootstrapUnreachable { .. } | C::DeliveryTimeout(_)) => {
                Error::Unavailable(e.to_string())
            }
            e => Error::Broker(e),
        }
    }
}

impl From<fjord_schema_registry::Error> for Error {
    fn from(e: fjord_schema_registry::Error) -> Self {
        match e {
            fjord_schema_registry::Error::UnknownId(id) => Error::UnknownSchema(id),
            e => Error::Registry(e),
        }
    }
}

impl Error {
    /// The HTTP status of this failure.
    pub fn http_status(&self) -> u16 {
        match self {
            Error::Aborted(cause) => cause.http_status(),
            Error::BadRequest { .. } => 400,
            Error::Unprocessable { .. } | Error::AvroMismatch { .. } => 422,
            Error::UnknownSchema(_) | Error::UnknownTopic(_) | Error::UnknownPartition { .. } => 404,
            Error::Registry(e) => match e {
                fjord_schema_registry::Error::InvalidSchema(_)
                | fjord_schema_registry::Error::UnsupportedSchema(_)
                | fjord_schema_registry::Error::SchemaLimit { .. } => 422,
                fjord_schema_registry::Error::Incompatible { .. } => 409,
                fjord_schema_registry::Error::Registry { status, .. } if (400..500).contains(status) => 422,
                _ => 503,
            },
            Error::NoRegistry => 422,
            Error::UnsupportedMediaType(_) | Error::UnsupportedEncoding(_) => 415,
            Error::PayloadTooLarge { .. } => 413,
            Error::Forbidden(_) => 403,
            Error::Unauthenticated { .. } => 401,
            Error::OffsetOutOfRange { .. } => 416,
            Error::BufferFull { .. } | Error::RateLimited { .. } => 429,
            Error::Unavailable(_) => 503,
            Error::Config(_) | Error::Serve(_) | Error::Broker(_) => 500,
        }
    }

    /// Confluent REST Proxy style code: the status times 100 plus a detail digit
    /// (40401 topic not found, 40402 partition not found, 40403 schema not found,
    /// 41501 unsupported content encoding, 42201 invalid schema, 42202 invalid record,
    /// 42203 Avro mismatch, 42901 a client over its rate limit; 42900 is the full buffer).
    pub fn error_code(&self) -> u32 {
        let detail = match self {
            Error::Aborted(cause) => return cause.error_code(),
            Error::UnknownTopic(_) => 1,
            Error::UnknownPartition { .. } => 2,
            Error::UnknownSchema(_) => 3,
            Error::Registry(_) if self.http_status() == 422 => 1,
            Error::Unprocessable { .. } | Error::NoRegistry => 2,
            Error::AvroMismatch { .. } => 3,
            Error::UnsupportedEncoding(_) => 1,
            Error::RateLimited { .. } => 1,
            _ => 0,
        };
        u32::from(self.http_status()) * 100 + detail
    }

    /// The record or line at fault, when one is.
    pub fn record_index(&self) -> Option<usize> {
        match self {
            Error::BadRequest { index, .. } | Error::Unprocessable { index, .. } => *index,
            Error::AvroMismatch { index, .. } => Some(*index),
            Error::Aborted(cause) => cause.record_index(),
            _ => None,
        }
    }

    /// How long a throttled caller should wait.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::BufferFull { retry_after, .. } | Error::RateLimited { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// The gRPC status code of this failure.
    pub fn grpc_code(&self) -> tonic::Code {
        use tonic::Code;
        match self.http_status() {
            400 | 413 | 415 | 422 => Code::InvalidArgument,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::NotFound,
            409 => Code::FailedPrecondition,
            416 => Code::OutOfRange,
            429 => Code::ResourceExhausted,
            503 => Code::Unavailable,
            _ => Code::Internal,
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        let mut status = tonic::Status::new(e.grpc_code(), e.to_string());
        if let Some(after) = e.retry_after() {
            // `grpc-retry-pushback-ms` is what gRPC's own retry throttling reads;
            // `retry-after` mirrors the HTTP header for hand-written clients.
            let ms = after.as_millis().to_string();
            if let Ok(v) = ms.parse() {
                status.metadata_mut().insert("grpc-retry-pushback-ms", v);
            }
            if let Ok(v) = after.as_millis().div_ceil(1000).max(1).to_string().parse() {
                status.metadata_mut().insert("retry-after", v);
            }
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_codes() {
        let cases: Vec<(Error, u16, u32, tonic::Code)> = vec![
            (Error::BadRequest { index: Some(3), reason: "x".into() }, 400, 40000, tonic::Code::InvalidArgument),
            (Error::UnknownTopic("t".into()), 404, 40401, tonic::Code::NotFound),
            (Error::UnknownPartition { topic: "t".into(), partition: 9 }, 404, 40402, tonic::Code::NotFound),
            (Error::UnknownSchema(7), 404, 40403, tonic::Code::NotFound),
            (
                Error::AvroMismatch { index: 1, schema_id: 1, path: "$.a".into(), reason: "r".into() },
                422,
                42203,
                tonic::Code::InvalidArgument,
            ),
            (Error::PayloadTooLarge { limit: 1 }, 413, 41300, tonic::Code::InvalidArgument),
            (
                Error::BufferFull { used: 1, capacity: 1, retry_after: Duration::from_secs(1) },
                429,
                42900,
                tonic::Code::ResourceExhausted,
            ),
            (
                Error::RateLimited { client: "User:a".into(), limit: "1 requests/s".into(), retry_after: Duration::from_secs(1) },
                429,
                42901,
                tonic::Code::ResourceExhausted,
            ),
            (Error::Unavailable("down".into()), 503, 50300, tonic::Code::Unavailable),
            (Error::Unauthenticated { reason: "r".into(), challenge: "c".into() }, 401, 40100, tonic::Code::Unauthenticated),
            (Error::Forbidden("f".into()), 403, 40300, tonic::Code::PermissionDenied),
            (Error::Aborted(Box::new(Error::Unavailable("down".into()))), 503, 50300, tonic::Code::Unavailable),
            (
                Error::Aborted(Box::new(Error::Unprocessable { index: Some(2), reason: "r".into() })),
                422,
                42202,
                tonic::Code::InvalidArgument,
            ),
        ];
        for (e, status, code, grpc) in cases {
            assert_eq!((e.http_status(), e.error_code(), e.grpc_code()), (status, code, grpc), "{e}");
        }
    }

    #[test]
    fn client_errors_sort_into_actionable_statuses() {
        let e: Error = fjord_client::Error::UnknownTopic("t".into()).into();
        assert_eq!(e.http_status(), 404);
        let e: Error = fjord_client::Error::DeliveryTimeout(Duration::from_secs(1)).into();
        assert_eq!(e.http_status(), 503);
        let e: Error = fjord_client::Error::LeaderNotAvailable("t-0".into()).into();
        assert_eq!(e.http_status(), 503);
        let e: Error = fjord_client::Error::Kafka {
            code: ResponseError::TopicAuthorizationFailed,
            context: "metadata for topic t".into(),
            message: None,
        }
        .into();
        assert_eq!(e.http_status(), 403);
        let e: Error = fjord_client::Error::Kafka {
            code: ResponseError::InvalidTimestamp,
            context: "produce to t-0".into(),
            message: Some("timestamp outside message.timestamp.after.max.ms".into()),
        }
        .into();
        assert_eq!((e.http_status(), e.error_code()), (422, 42202), "{e}");
        assert!(e.to_string().contains("message.timestamp.after.max.ms"), "{e}");
    }

    #[test]
    fn messages_name_the_record_and_grpc_carries_pushback() {
        let e = Error::BadRequest { index: Some(4), reason: "bad base64".into() };
        assert_eq!(e.to_string(), "record 4: bad base64");
        assert_eq!(e.record_index(), Some(4));
        let status: tonic::Status = Error::BufferFull { used: 9, capacity: 9, retry_after: Duration::from_millis(1500) }.into();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(status.metadata().get("grpc-retry-pushback-ms").unwrap(), "1500");
        assert_eq!(status.metadata().get("retry-after").unwrap(), "2", "whole seconds, rounded up as the HTTP header");
    }
}
