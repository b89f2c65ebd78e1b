//! SASL on SASL_PLAINTEXT and SASL_SSL listeners, as Kafka's `SaslServerAuthenticator`:
//! SaslHandshake (v0-1) picks a mechanism of `sasl.enabled.mechanisms`, then the
//! mechanism's tokens go back and forth, in SaslAuthenticate requests (v0-2, after a v1
//! handshake) or as bare length-prefixed tokens (after a v0 handshake). SCRAM-SHA-256,
//! SCRAM-SHA-512 and PLAIN are checked against the SCRAM credentials in the metadata
//! store (`fjord_auth`); nothing else is answered until the exchange succeeds.
//!
//! A failed exchange is answered SASL_AUTHENTICATION_FAILED after
//! `connection.failed.authentication.delay.ms` (slowing password guessing) and its
//! connection is closed; so is one that sends a SASL request out of order
//! (ILLEGAL_SASL_STATE) or asks for a mechanism that is not enabled
//! (UNSUPPORTED_SASL_MECHANISM), as Kafka does.
//!
//! Re-authentication (KIP-368): with `connections.max.reauth.ms` set, a session lasts
//! that long (announced in the last SaslAuthenticate, v1+). A SaslHandshake v1+ on the
//! authenticated connection starts a new exchange with the first mechanism while other
//! requests are still served; it must end as the same principal, which renews the
//! session, or fails and closes like a first authentication. The connection of a session
//! that expired is closed at its next request other than SaslHandshake/SaslAuthenticate
//! (see `connection::read_requests`).

use std::time::Duration;

use bytes::Bytes;
use fjord_auth::plain::PlainMessage;
use fjord_auth::{store, Principal, ScramMechanism, ScramServer};
use kafka_protocol::messages::{
    ResponseKind, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;

use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::Broker;
use crate::metrics::ConnectionEvent;

/// A SASL mechanism this broker implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    Scram(ScramMechanism),
    /// `PLAIN`, checked against the user's SCRAM credential.
    Plain,
}

impl Mechanism {
    /// The SASL name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Scram(m) => m.name(),
            Self::Plain => "PLAIN",
        }
    }

    /// The mechanism named `name` (exactly, as SASL names are).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "PLAIN" => Some(Self::Plain),
            _ => ScramMechanism::ALL.into_iter().find(|m| m.name() == name).map(Self::Scram),
        }
    }
}

/// Parses `sasl.enabled.mechanisms` (`SCRAM-SHA-256,SCRAM-SHA-512,PLAIN`).
pub(crate) fn parse_mechanisms(value: &str) -> Result<Vec<Mechanism>, String> {
    let mut mechanisms = Vec::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let mechanism = Mechanism::parse(name)
            .ok_or_else(|| format!("{name} is not supported (SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN are)"))?;
        if !mechanisms.contains(&mechanism) {
            mechanisms.push(mechanism);
        }
    }
    if mechanisms.is_empty() {
        return Err("no mechanism enabled".into());
    }
    Ok(mechanisms)
}

/// Where a connection's SASL exchange is.
#[derive(Debug, Default)]
pub(crate) enum SaslState {
    /// Waiting for SaslHandshake.
    #[default]
    Handshake,
    /// A mechanism was chosen; its tokens come in SaslAuthenticate requests, or bare
    /// (`raw`, after a v0 handshake).
    Authenticating { raw: bool, exchange: Exchange },
    /// Authenticated, or failed (the connection is closing).
    Finished,
}

#[derive(Debug)]
pub(crate) enum Exchange {
    /// SCRAM; `answered_first` once server-first went out (the next token is client-final).
    Scram {
        server: Box<ScramServer>,
        answered_first: bool,
    },
    Plain,
}

/// What a token did to the exchange.
pub(crate) enum Step {
    /// Send this token back; more are expected.
    Continue(Bytes),
    /// Authenticated as the principal; send this last token back.
    Done(Bytes, Principal),
}

/// Why an exchange failed (logged with the client's address; the client sees Kafka's
/// generic message).
pub(crate) type Failure = String;

impl Broker {
    /// One client token of the exchange in `session`.
    pub(crate) async fn sasl_token(&self, session: &mut Session, token: &[u8]) -> Result<Step, Failure> {
        let SaslState::Authenticating { exchange, .. } = &mut session.sasl else {
            return Err("no exchange in progress".into());
        };
        match exchange {
            Exchange::Plain => {
                let message = PlainMessage::parse(token).map_err(|e| e.to_string())?;
                let credentials = store::user_credentials(&**self.topics.store(), &message.username)
                    .await
                    .map_err(|e| format!("reading the credentials of {}: {e}", message.username))?;
                // PBKDF2 of the password: thousands of HMACs, off the network workers.
                let principal = tokio::task::spawn_blocking(move || {
                    let credential = credentials.iter().next_back().map(|(m, c)| (*m, c));
                    message.verify(credential)
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
                Ok(Step::Done(Bytes::new(), principal))
            }
            Exchange::Scram { server, answered_first } if !*answered_first => {
                let user = server.client_first(token).map_err(|e| e.to_string())?;
                let credential = store::credential(&**self.topics.store(), &user, server.mechanism())
                    .await
                    .map_err(|e| format!("reading the credentials of {user}: {e}"))?;
                *answered_first = true;
                server.server_first(credential).map(|t| Step::Continue(Bytes::from(t))).map_err(|e| e.to_string())
            }
            Exchange::Scram { server, .. } => {
                let last = server.client_final(token).map_err(|e| e.to_string())?;
                let principal = server.principal().ok_or("the exchange did not complete")?;
                Ok(Step::Done(Bytes::from(last), principal))
            }
        }
    }
}

impl Broker {
    /// SaslHandshake: picks the mechanism. v0 means the tokens follow bare.
    pub(crate) fn sasl_handshake(&self, request: SaslHandshakeRequest, version: i16, session: &mut Session) -> ResponseKind {
        let enabled = &self.config.sasl_enabled_mechanisms;
        let names = enabled.iter().map(|m| StrBytes::from_static_str(m.name())).collect();
        let response = SaslHandshakeResponse::default().with_mechanisms(names);
        // A v1+ handshake on an authenticated connection starts a re-authentication
        // (KIP-368); bare v0 tokens cannot be told apart from requests once authenticated.
        let reauthenticating = session.authenticated && version >= 1 && matches!(session.sasl, SaslState::Finished);
        if !session.listener.protocol.sasl() || !(matches!(session.sasl, SaslState::Handshake) || reauthenticating) {
            session.close = true;
            tracing::warn!(peer = %session.peer, listener = %session.listener.name, "SaslHandshake out of place; closing");
            return ResponseKind::SaslHandshake(response.with_error_code(error_code::ILLEGAL_SASL_STATE));
        }
        let requested = request.mechanism.as_str();
        let Some(mechanism) = Mechanism::parse(requested).filter(|m| enabled.contains(m)) else {
            session.close = true;
            self.metrics.connection_event(ConnectionEvent::AuthenticationFailed);
            tracing::warn!(peer = %session.peer, mechanism = requested, "SASL mechanism not enabled; closing");
            return ResponseKind::SaslHandshake(response.with_error_code(error_code::UNSUPPORTED_SASL_MECHANISM));
        };
        if reauthenticating && session.mechanism != Some(mechanism) {
            session.close = true;
            self.metrics.connection_event(ConnectionEvent::AuthenticationFailed);
            let first = session.mechanism.map_or("?", Mechanism::name);
            tracing::warn!(peer = %session.peer, mechanism = requested, first, "re-authentication with another SASL mechanism; closing");
            return ResponseKind::SaslHandshake(response.with_error_code(error_code::UNSUPPORTED_SASL_MECHANISM));
        }
        let exchange = match mechanism {
            Mechanism::Scram(m) => Exchange::Scram { server: Box::new(ScramServer::new(m)), answered_first: false },
            Mechanism::Plain => Exchange::Plain,
        };
        session.sasl = SaslState::Authenticating { raw: version == 0, exchange };
        session.mechanism = Some(mechanism);
        ResponseKind::SaslHandshake(response.with_error_code(error_code::NONE))
    }

    /// SaslAuthenticate: one token of the exchange the handshake started.
    pub(crate) async fn sasl_authenticate(
        &self,
        request: SaslAuthenticateRequest,
        version: i16,
        session: &mut Session,
    ) -> ResponseKind {
        let response = SaslAuthenticateResponse::default();
        if !matches!(session.sasl, SaslState::Authenticating { raw: false, .. }) {
            session.close = true;
            tracing::warn!(peer = %session.peer, listener = %session.listener.name, "SaslAuthenticate out of place; closing");
            return ResponseKind::SaslAuthenticate(
                response
                    .with_error_code(error_code::ILLEGAL_SASL_STATE)
                    .with_error_message(Some(StrBytes::from_static_str("unexpected SaslAuthenticate request"))),
            );
        }
        match self.sasl_step(&request.auth_bytes, session).await {
            Ok(token) => {
                let mut response = response.with_auth_bytes(token);
                // The last token: tell the client how long its session lasts (v1+ has
                // the field; a v0 client is closed at expiry without knowing).
                if version >= 1 && matches!(session.sasl, SaslState::Finished) {
                    response.session_lifetime_ms = session_lifetime_ms(self.config.connections_max_reauth);
                }
                ResponseKind::SaslAuthenticate(response)
            }
            Err(message) => ResponseKind::SaslAuthenticate(
                response.with_error_code(error_code::SASL_AUTHENTICATION_FAILED).with_error_message(Some(message)),
            ),
        }
    }

    /// A bare token after a v0 handshake: the token to send back, or `None` when the
    /// exchange failed (v0 has no error frame: the connection is closed).
    pub(crate) async fn sasl_raw_token(&self, token: &[u8], session: &mut Session) -> Option<Bytes> {
        self.sasl_step(token, session).await.ok()
    }

    /// One token through the exchange; on failure, the client's error message after the
    /// failed-authentication delay, with the connection marked for closing.
    async fn sasl_step(&self, token: &[u8], session: &mut Session) -> Result<Bytes, StrBytes> {
        let reauthenticating = session.authenticated;
        let reason = match self.sasl_token(session, token).await {
            Ok(Step::Continue(token)) => return Ok(token),
            Ok(Step::Done(_, principal)) if reauthenticating && principal != session.principal => {
                format!("cannot change principals during re-authentication from {}: {principal}", session.principal)
            }
            Ok(Step::Done(token, principal)) => {
                tracing::debug!(peer = %session.peer, %principal, reauthenticating, "SASL authentication succeeded");
                session.principal = principal;
                session.authenticated = true;
                session.sasl = SaslState::Finished;
                session.session_expiry = session_expiry(tokio::time::Instant::now(), self.config.connections_max_reauth);
                return Ok(token);
            }
            Err(reason) => reason,
        };
        let mechanism = session.mechanism.map_or("?", Mechanism::name);
        session.sasl = SaslState::Finished;
        session.close = true;
        self.metrics.connection_event(ConnectionEvent::AuthenticationFailed);
        tracing::warn!(peer = %session.peer, listener = %session.listener.name, mechanism, reauthenticating, reason, "SASL authentication failed; closing");
        tokio::time::sleep(self.config.failed_authentication_delay).await;
        Err(StrBytes::from_string(format!(
            "Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
        )))
    }
}

/// When a session authenticated at `now` ends: `connections.max.reauth.ms` later, or
/// never when that is zero.
fn session_expiry(now: tokio::time::Instant, max_reauth: Duration) -> Option<tokio::time::Instant> {
    (!max_reauth.is_zero()).then(|| now + max_reauth)
}

/// SaslAuthenticate's `session_lifetime_ms`: zero when sessions do not expire.
fn session_lifetime_ms(max_reauth: Duration) -> i64 {
    i64::try_from(max_reauth.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enabled_mechanisms_are_the_three_implemented() {
        let all = parse_mechanisms("SCRAM-SHA-512, PLAIN,SCRAM-SHA-256,PLAIN").unwrap();
        let names: Vec<&str> = all.iter().map(|m| m.name()).collect();
        assert_eq!(names, ["SCRAM-SHA-512", "PLAIN", "SCRAM-SHA-256"]);
        for bad in ["GSSAPI", "", "scram-sha-256", "OAUTHBEARER,PLAIN"] {
            assert!(parse_mechanisms(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sessions_expire_only_when_connections_max_reauth_ms_is_set() {
        let now = tokio::time::Instant::now();
        assert_eq!(session_expiry(now, Duration::ZERO), None);
        assert_eq!(session_expiry(now, Duration::from_secs(3)), Some(now + Duration::from_secs(3)));
        assert_eq!(session_lifetime_ms(Duration::ZERO), 0);
        assert_eq!(session_lifetime_ms(Duration::from_secs(3)), 3000);
    }
}
