//! The crate's one error type and how each failure is shown: a page with the message and
//! an HTTP status, never a blank page.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use fjord_auth::Operation;

/// Why a console page or action failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The brokers answered with an error (or could not be reached).
    #[error("the brokers could not {what}: {source}")]
    Broker {
        /// What the console asked.
        what: &'static str,
        /// The client's error.
        #[source]
        source: fjord_client::Error,
    },
    /// The brokers did not answer within the console's bound.
    #[error("the brokers did not {what} within {timeout:?}")]
    Timeout {
        /// What the console asked.
        what: &'static str,
        /// The bound.
        timeout: Duration,
    },
    /// The schema registry failed or could not be reached.
    #[error("the schema registry at {url} could not be read: {reason}")]
    Registry {
        /// Its base URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// No registry URL is configured.
    #[error("no schema registry is configured for the gateway (registry_url)")]
    NoRegistry,
    /// The audit report could not be computed.
    #[error("the audit report could not be read: {0}")]
    Audit(#[from] fjord_audit::Error),
    /// A loader destination could not be read.
    #[error("the loader destination {dest} could not be read: {reason}")]
    Loader {
        /// Its URL.
        dest: String,
        /// What went wrong (with its causes).
        reason: String,
    },
    /// A form field or query parameter is not valid.
    #[error("{field}: {reason}")]
    BadInput {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// No such topic, group or subject.
    #[error("{kind} {name:?} does not exist")]
    NotFound {
        /// `topic`, `group`, `subject`.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// The ACLs refuse the caller this operation.
    #[error("{principal} may not {operation} {kind} {name:?}")]
    Forbidden {
        /// Who asked.
        principal: String,
        /// What.
        operation: Operation,
        /// `topic`, `group`, `cluster`.
        kind: &'static str,
        /// On what.
        name: String,
    },
    /// Credentials missing or wrong (Basic is on).
    #[error("{reason}")]
    Unauthenticated {
        /// Why.
        reason: String,
        /// The `WWW-Authenticate` value, so the browser asks for credentials.
        challenge: String,
    },
    /// The credentials could not be checked (the metadata store is unreachable).
    #[error("credentials could not be checked: {0}")]
    AuthUnavailable(String),
    /// A state-changing request from another site's page (cross-site request forgery).
    #[error("refused a cross-site request from origin {origin:?}")]
    CrossSite {
        /// The `Origin` it came with.
        origin: String,
    },
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The HTTP status of the page showing this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Error::Broker { source: fjord_client::Error::UnknownTopic(_), .. } | Error::NotFound { .. } => StatusCode::NOT_FOUND,
            Error::Broker { .. } | Error::Registry { .. } | Error::Audit(_) | Error::Loader { .. } => StatusCode::BAD_GATEWAY,
            Error::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Error::NoRegistry | Error::AuthUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::BadInput { .. } => StatusCode::BAD_REQUEST,
            Error::Forbidden { .. } | Error::CrossSite { .. } => StatusCode::FORBIDDEN,
            Error::Unauthenticated { .. } => StatusCode::UNAUTHORIZED,
        }
    }

    pub(crate) fn broker(what: &'static str) -> impl FnOnce(fjord_client::Error) -> Error {
        move |source| Error::Broker { what, source }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(error = %self, "console page failed");
        }
        let body = crate::layout::error_page(status, &self.to_string());
        let mut response = (status, body).into_response();
        if let Error::Unauthenticated { challenge, .. } = &self {
            if let Ok(v) = HeaderValue::from_str(challenge) {
                response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
            }
        }
        response
    }
}
