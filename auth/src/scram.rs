//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), the server side.
//!
//! # Credentials
//! A user's [`ScramCredential`] for one mechanism is what RFC 5802 §3 lets a server keep:
//! `salt`, `iterations`, `StoredKey = H(HMAC(SaltedPassword, "Client Key"))` and
//! `ServerKey = HMAC(SaltedPassword, "Server Key")`, with
//! `SaltedPassword = PBKDF2-HMAC-H(password, salt, iterations)`. The password itself is
//! never kept. As Kafka, the password is used as its UTF-8 bytes, without SASLprep, so
//! the credentials Kafka's tools derive and ours agree.
//!
//! # The exchange
//! [`ScramServer`] is a sans-I/O state machine; the caller moves SASL tokens and looks
//! the user up in between:
//!
//! ```text
//! client-first  n,,n=alice,r=<cnonce>                 → client_first() → "alice"
//!                                                       (caller looks up alice's credential)
//! server-first  r=<cnonce><snonce>,s=<salt>,i=4096   ← server_first(credential)
//! client-final  c=biws,r=<cnonce><snonce>,p=<proof>   → client_final()
//! server-final  v=<server signature>                 ← (authenticated as User:alice)
//! ```
//!
//! Only `n,,` (no channel binding) is accepted, as Kafka. An unknown user gets a
//! server-first made from a fake credential (a salt that is stable per name), so the
//! exchange fails at the proof exactly like a wrong password and a client cannot probe
//! which users exist. Any error leaves the exchange failed: every later message is
//! refused, so a replayed or out-of-order message cannot resume it.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

use crate::{Error, Principal, Result};

/// Kafka's minimum iteration count for both mechanisms (`ScramMechanism.minIterations`).
pub const MIN_ITERATIONS: u32 = 4096;
/// Kafka's maximum iteration count (`ScramMechanism.maxIterations`): bounds the CPU an
/// authentication may cost.
pub const MAX_ITERATIONS: u32 = 16384;
/// Length of generated salts, in bytes.
const SALT_LEN: usize = 32;
/// Random bytes behind the server's half of the nonce.
const SERVER_NONCE_LEN: usize = 24;
/// Longest client message accepted; real ones are a few hundred bytes.
const MAX_MESSAGE_LEN: usize = 8 * 1024;

/// A SCRAM mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScramMechanism {
    /// `SCRAM-SHA-256` (RFC 7677).
    Sha256,
    /// `SCRAM-SHA-512`.
    Sha512,
}

impl ScramMechanism {
    /// Both mechanisms.
    pub const ALL: [ScramMechanism; 2] = [ScramMechanism::Sha256, ScramMechanism::Sha512];

    /// The SASL name, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha256 => "SCRAM-SHA-256",
            Self::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// Kafka's wire code (DescribeUserScramCredentials / AlterUserScramCredentials).
    pub fn code(self) -> i8 {
        match self {
            Self::Sha256 => 1,
            Self::Sha512 => 2,
        }
    }

    /// The mechanism of a Kafka wire code; `None` for 0 (UNKNOWN) and anything else.
    pub fn from_code(code: i8) -> Option<Self> {
        match code {
            1 => Some(Self::Sha256),
            2 => Some(Self::Sha512),
            _ => None,
        }
    }

    /// Length of the hash, and so of StoredKey, ServerKey and proofs.
    pub fn hash_len(self) -> usize {
        match self {
            Self::Sha256 => 32,
            Self::Sha512 => 64,
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Self::Sha256 => Sha256::digest(data).to_vec(),
            Self::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        macro_rules! hmac {
            ($digest:ty) => {{
                let mut mac = <Hmac<$digest> as Mac>::new_from_slice(key).expect("invariant: HMAC takes keys of any length");
                mac.update(data);
                mac.finalize().into_bytes().to_vec()
            }};
        }
        match self {
            Self::Sha256 => hmac!(Sha256),
            Self::Sha512 => hmac!(Sha512),
        }
    }

    /// `Hi()` of RFC 5802: PBKDF2 with HMAC-H, one hash length of output.
    fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut out = vec![0; self.hash_len()];
        match self {
            Self::Sha256 => pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out),
            Self::Sha512 => pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out),
        }
        out
    }
}

impl FromStr for ScramMechanism {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL.into_iter().find(|m| m.name() == s).ok_or_else(|| Error::UnknownMechanism(s.to_string()))
    }
}

impl fmt::Display for ScramMechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a server keeps of a password for one mechanism (RFC 5802 §3).
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredential {
    /// The salt the password was derived with.
    pub salt: Vec<u8>,
    /// PBKDF2 iterations.
    pub iterations: u32,
    /// `H(ClientKey)`: what a client proof is checked against.
    pub stored_key: Vec<u8>,
    /// `HMAC(SaltedPassword, "Server Key")`: signs the server-final message.
    pub server_key: Vec<u8>,
}

impl fmt::Debug for ScramCredential {
    // The keys are password-equivalent for anyone who can also see an exchange: keep them out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramCredential").field("iterations", &self.iterations).finish_non_exhaustive()
    }
}

impl ScramCredential {
    /// Derives the credential of `password` with a fresh random salt.
    pub fn generate(mechanism: ScramMechanism, password: &str, iterations: u32) -> Result<Self> {
        let mut salt = vec![0u8; SALT_LEN];
        rand::fill(&mut salt[..]);
        Self::derive(mechanism, password, salt, iterations)
    }

    /// Derives the credential of `password` with `salt`; `iterations` must be within
    /// [`MIN_ITERATIONS`]..=[`MAX_ITERATIONS`].
    pub fn derive(mechanism: ScramMechanism, password: &str, salt: Vec<u8>, iterations: u32) -> Result<Self> {
        check_iterations(iterations)?;
        let salted = mechanism.salted_password(password.as_bytes(), &salt, iterations);
        Ok(Self::from_salted_password(mechanism, &salted, salt, iterations))
    }

    /// What a client sends to set `password` through a broker (Kafka's
    /// AlterUserScramCredentials upsertion): a fresh random salt and the salted password
    /// `Hi(password, salt, iterations)`, never the password itself. The salted password
    /// is password-equivalent: keep it out of logs.
    pub fn client_salted_password(mechanism: ScramMechanism, password: &str, iterations: u32) -> Result<(Vec<u8>, Vec<u8>)> {
        check_iterations(iterations)?;
        let mut salt = vec![0u8; SALT_LEN];
        rand::fill(&mut salt[..]);
        let salted = mechanism.salted_password(password.as_bytes(), &salt, iterations);
        Ok((salt, salted))
    }

    /// The credential of a salted password a client derived itself (Kafka's
    /// AlterUserScramCredentials sends `SaltedPassword`, salt and iterations, never the
    /// password). Checks the iteration range, a non-empty salt and the hash length.
    pub fn from_client_salted_password(mechanism: ScramMechanism, salted: &[u8], salt: Vec<u8>, iterations: u32) -> Result<Self> {
        check_iterations(iterations)?;
        if salt.is_empty() {
            return Err(Error::InvalidCredential("empty salt"));
        }
        if salted.len() != mechanism.hash_len() {
            return Err(Error::InvalidCredential("salted password length does not match the mechanism"));
        }
        Ok(Self::from_salted_password(mechanism, salted, salt, iterations))
    }

    fn from_salted_password(mechanism: ScramMechanism, salted: &[u8], salt: Vec<u8>, iterations: u32) -> Self {
        let client_key = mechanism.hmac(salted, b"Client Key");
        Self { salt, iterations, stored_key: mechanism.hash(&client_key), server_key: mechanism.hmac(salted, b"Server Key") }
    }

    /// Whether `password` derives to this credential (PLAIN's check). Compares both keys
    /// in constant time.
    pub fn verify_password(&self, mechanism: ScramMechanism, password: &str) -> bool {
        if check_iterations(self.iterations).is_err() {
            return false;
        }
        let derived = Self::derive(mechanism, password, self.salt.clone(), self.iterations);
        derived.is_ok_and(|d| bool::from(d.stored_key.ct_eq(&self.stored_key) & d.server_key.ct_eq(&self.server_key)))
    }

    /// Kafka's stored form: `salt=<b64>,stored_key=<b64>,server_key=<b64>,iterations=<n>`
    /// (`ScramCredentialUtils.credentialToString`).
    pub fn to_kafka_string(&self) -> String {
        format!(
            "salt={},stored_key={},server_key={},iterations={}",
            BASE64.encode(&self.salt),
            BASE64.encode(&self.stored_key),
            BASE64.encode(&self.server_key),
            self.iterations
        )
    }

    /// Parses [`to_kafka_string`](Self::to_kafka_string)'s form (fields in any order)
    /// and checks the key lengths against `mechanism`.
    pub fn from_kafka_string(mechanism: ScramMechanism, s: &str) -> Result<Self> {
        let mut fields = BTreeMap::new();
        for field in s.split(',') {
            let (key, value) = field.split_once('=').ok_or(Error::InvalidCredential("a field is not key=value"))?;
            if fields.insert(key, value).is_some() {
                return Err(Error::InvalidCredential("repeated field"));
            }
        }
        let base64 = |key, what| -> Result<Vec<u8>> {
            let value = fields.get(key).ok_or(Error::InvalidCredential(what))?;
            BASE64.decode(value).map_err(|_| Error::InvalidCredential("a key is not base64"))
        };
        let salt = base64("salt", "missing salt")?;
        let stored_key = base64("stored_key", "missing stored_key")?;
        let server_key = base64("server_key", "missing server_key")?;
        let iterations = fields
            .get("iterations")
            .ok_or(Error::InvalidCredential("missing iterations"))?
            .parse()
            .map_err(|_| Error::InvalidCredential("iterations is not a number"))?;
        if stored_key.len() != mechanism.hash_len() || server_key.len() != mechanism.hash_len() {
            return Err(Error::InvalidCredential("key length does not match the mechanism"));
        }
        if salt.is_empty() {
            return Err(Error::InvalidCredential("empty salt"));
        }
        check_iterations(iterations)?;
        Ok(Self { salt, iterations, stored_key, server_key })
    }

    /// A credential no password matches, stable per user name within this process, given
    /// to unknown users so they fail like a wrong password (see the module docs).
    pub(crate) fn fake(mechanism: ScramMechanism, username: &str) -> Self {
        static KEY: OnceLock<[u8; 32]> = OnceLock::new();
        let key = KEY.get_or_init(|| {
            let mut key = [0u8; 32];
            rand::fill(&mut key[..]);
            key
        });
        let mut salt = mechanism.hmac(key, username.as_bytes());
        salt.truncate(SALT_LEN);
        let mut unmatchable = vec![0u8; mechanism.hash_len()];
        rand::fill(&mut unmatchable[..]);
        Self { salt, iterations: MIN_ITERATIONS, stored_key: unmatchable.clone(), server_key: unmatchable }
    }
}

fn check_iterations(iterations: u32) -> Result<()> {
    if (MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
        Ok(())
    } else {
        Err(Error::InvalidIterations { iterations, min: MIN_ITERATIONS, max: MAX_ITERATIONS })
    }
}

/// Where a [`ScramServer`] is in the exchange.
#[derive(Debug)]
enum State {
    AwaitingClientFirst,
    /// Client-first parsed; waiting for the caller's credential lookup.
    AwaitingCredential {
        username: String,
        client_first_bare: String,
        client_nonce: String,
        gs2_header: String,
    },
    AwaitingClientFinal {
        username: String,
        /// `client-first-bare "," server-first`: the auth message up to client-final.
        auth_prefix: String,
        nonce: String,
        /// Length of the client's half of `nonce`.
        client_nonce_len: usize,
        gs2_header: String,
        credential: ScramCredential,
        /// The credential is [`ScramCredential::fake`]: fail at the proof whatever it is.
        known_user: bool,
    },
    Complete {
        username: String,
    },
    Failed,
}

impl State {
    fn describe(&self) -> &'static str {
        match self {
            State::AwaitingClientFirst => "waiting for client-first",
            State::AwaitingCredential { .. } => "waiting for the credential lookup",
            State::AwaitingClientFinal { .. } => "waiting for client-final",
            State::Complete { .. } => "complete",
            State::Failed => "failed",
        }
    }
}

/// The server side of one SCRAM exchange (see the module docs for the sequence).
#[derive(Debug)]
pub struct ScramServer {
    mechanism: ScramMechanism,
    state: State,
    /// Fixed server nonce for the RFC test vectors; random otherwise.
    #[cfg(test)]
    server_nonce: Option<String>,
}

impl ScramServer {
    /// A new exchange for `mechanism`, waiting for client-first.
    pub fn new(mechanism: ScramMechanism) -> Self {
        Self {
            mechanism,
            state: State::AwaitingClientFirst,
            #[cfg(test)]
            server_nonce: None,
        }
    }

    /// The mechanism of this exchange.
    pub fn mechanism(&self) -> ScramMechanism {
        self.mechanism
    }

    /// Takes client-first and returns the user name to look up.
    pub fn client_first(&mut self, message: &[u8]) -> Result<String> {
        let parsed = match std::mem::replace(&mut self.state, State::Failed) {
            State::AwaitingClientFirst => parse_client_first(message)?,
            other => return Err(self.unexpected(other)),
        };
        let username = parsed.username.clone();
        self.state = State::AwaitingCredential {
            username: parsed.username,
            client_first_bare: parsed.client_first_bare,
            client_nonce: parsed.client_nonce,
            gs2_header: parsed.gs2_header,
        };
        Ok(username)
    }

    /// Returns server-first, given the user's credential for this mechanism (`None` when
    /// the user or its credential for this mechanism does not exist).
    pub fn server_first(&mut self, credential: Option<ScramCredential>) -> Result<Vec<u8>> {
        let (username, client_first_bare, client_nonce, gs2_header) = match std::mem::replace(&mut self.state, State::Failed) {
            State::AwaitingCredential { username, client_first_bare, client_nonce, gs2_header } => {
                (username, client_first_bare, client_nonce, gs2_header)
            }
            other => return Err(self.unexpected(other)),
        };
        // A stored credential that breaks the mechanism's rules (hand-edited, or another
        // mechanism's) fails like an unknown user rather than panicking later.
        let known_user = credential.as_ref().is_some_and(|c| {
            c.stored_key.len() == self.mechanism.hash_len() && check_iterations(c.iterations).is_ok() && !c.salt.is_empty()
        });
        let credential = match credential {
            Some(c) if known_user => c,
            _ => ScramCredential::fake(self.mechanism, &username),
        };
        let client_nonce_len = client_nonce.len();
        let nonce = format!("{client_nonce}{}", self.new_server_nonce());
        let server_first = format!("r={nonce},s={},i={}", BASE64.encode(&credential.salt), credential.iterations);
        let auth_prefix = format!("{client_first_bare},{server_first}");
        self.state =
            State::AwaitingClientFinal { username, auth_prefix, nonce, client_nonce_len, gs2_header, credential, known_user };
        Ok(server_first.into_bytes())
    }

    /// Takes client-final, checks the nonce, the channel binding and the proof, and
    /// returns server-final. On success the exchange is [complete](Self::principal).
    pub fn client_final(&mut self, message: &[u8]) -> Result<Vec<u8>> {
        let (username, auth_prefix, nonce, client_nonce_len, gs2_header, credential, known_user) =
            match std::mem::replace(&mut self.state, State::Failed) {
                State::AwaitingClientFinal {
                    username,
                    auth_prefix,
                    nonce,
                    client_nonce_len,
                    gs2_header,
                    credential,
                    known_user,
                } => (username, auth_prefix, nonce, client_nonce_len, gs2_header, credential, known_user),
                other => return Err(self.unexpected(other)),
            };
        let parsed = parse_client_final(message)?;
        if BASE64.decode(parsed.channel_binding).map_err(|_| malformed_final("channel binding is not base64"))?
            != gs2_header.as_bytes()
        {
            return Err(Error::ChannelBinding);
        }
        // librdkafka before 2.6.1 (Debian's kcat among them) sends its own nonce again in
        // front of the combined one (confluentinc/librdkafka#4895); Kafka 3.x accepts that
        // form, so we do too, and only that form: it still carries this exchange's server
        // nonce, so a replay from another exchange fails as before.
        let librdkafka_doubled = parsed.nonce.len() == client_nonce_len + nonce.len()
            && parsed.nonce.split_at(client_nonce_len) == (&nonce[..client_nonce_len], &nonce[..]);
        if parsed.nonce != nonce && !librdkafka_doubled {
            return Err(Error::NonceMismatch);
        }
        let proof = BASE64.decode(parsed.proof).map_err(|_| malformed_final("proof is not base64"))?;
        if proof.len() != self.mechanism.hash_len() {
            return Err(malformed_final("proof has the wrong length"));
        }
        let auth_message = format!("{auth_prefix},{}", parsed.without_proof);
        let client_signature = self.mechanism.hmac(&credential.stored_key, auth_message.as_bytes());
        let client_key: Vec<u8> = proof.iter().zip(&client_signature).map(|(p, s)| p ^ s).collect();
        let matches = bool::from(self.mechanism.hash(&client_key).ct_eq(&credential.stored_key));
        if !(matches && known_user) {
            return Err(Error::AuthenticationFailed);
        }
        let server_signature = self.mechanism.hmac(&credential.server_key, auth_message.as_bytes());
        self.state = State::Complete { username };
        Ok(format!("v={}", BASE64.encode(server_signature)).into_bytes())
    }

    /// Whether the exchange succeeded.
    pub fn is_complete(&self) -> bool {
        matches!(self.state, State::Complete { .. })
    }

    /// `User:<name>` once the exchange is complete.
    pub fn principal(&self) -> Option<Principal> {
        match &self.state {
            State::Complete { username } => Some(Principal::user(username.clone())),
            _ => None,
        }
    }

    fn unexpected(&mut self, state: State) -> Error {
        let error = Error::UnexpectedMessage { state: state.describe() };
        self.state = State::Failed;
        error
    }

    fn new_server_nonce(&self) -> String {
        #[cfg(test)]
        if let Some(nonce) = &self.server_nonce {
            return nonce.clone();
        }
        let mut bytes = [0u8; SERVER_NONCE_LEN];
        rand::fill(&mut bytes[..]);
        BASE64.encode(bytes)
    }
}

/// The client side of one SCRAM exchange, for Fjord's own connections (a broker's
/// replica fetchers on a SASL inter-broker listener):
/// [`new`](Self::new), which gives client-first, then [`client_final`](Self::client_final) with
/// server-first, then [`verify_server_final`](Self::verify_server_final).
pub struct ScramClient {
    mechanism: ScramMechanism,
    password: String,
    client_first_bare: String,
    client_nonce: String,
    /// The ServerSignature expected in server-final, once client-final is built.
    expected_server_signature: Option<Vec<u8>>,
}

impl fmt::Debug for ScramClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramClient").field("mechanism", &self.mechanism).finish_non_exhaustive()
    }
}

impl ScramClient {
    /// A new exchange as `user` with `password`; returns it and client-first.
    pub fn new(mechanism: ScramMechanism, user: &str, password: &str) -> (Self, Vec<u8>) {
        let mut bytes = [0u8; SERVER_NONCE_LEN];
        rand::fill(&mut bytes[..]);
        let client_nonce = BASE64.encode(bytes);
        let client_first_bare = format!("n={},r={client_nonce}", user.replace('=', "=3D").replace(',', "=2C"));
        let first = format!("n,,{client_first_bare}").into_bytes();
        let client =
            Self { mechanism, password: password.to_owned(), client_first_bare, client_nonce, expected_server_signature: None };
        (client, first)
    }

    /// Client-final for the server's server-first.
    pub fn client_final(&mut self, server_first: &[u8]) -> Result<Vec<u8>> {
        let bad = |reason| Error::Malformed { message: "server-first", reason };
        let text = std::str::from_utf8(server_first).map_err(|_| bad("not UTF-8"))?;
        let mut fields = text.split(',');
        let nonce = fields.next().and_then(|f| f.strip_prefix("r=")).ok_or(bad("no r=<nonce>"))?;
        let salt = fields.next().and_then(|f| f.strip_prefix("s=")).ok_or(bad("no s=<salt>"))?;
        let iterations = fields.next().and_then(|f| f.strip_prefix("i=")).ok_or(bad("no i=<iterations>"))?;
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err(Error::NonceMismatch);
        }
        let salt = BASE64.decode(salt).map_err(|_| bad("salt is not base64"))?;
        let iterations: u32 = iterations.parse().map_err(|_| bad("iterations is not a number"))?;
        check_iterations(iterations)?;
        let m = self.mechanism;
        let salted = m.salted_password(self.password.as_bytes(), &salt, iterations);
        let client_key = m.hmac(&salted, b"Client Key");
        let without_proof = format!("c=biws,r={nonce}");
        let auth = format!("{},{text},{without_proof}", self.client_first_bare);
        let signature = m.hmac(&m.hash(&client_key), auth.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        self.expected_server_signature = Some(m.hmac(&m.hmac(&salted, b"Server Key"), auth.as_bytes()));
        Ok(format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes())
    }

    /// Checks server-final: the server proves it knows the credential too.
    pub fn verify_server_final(&self, server_final: &[u8]) -> Result<()> {
        let expected =
            self.expected_server_signature.as_ref().ok_or(Error::UnexpectedMessage { state: "before client-final" })?;
        let text =
            std::str::from_utf8(server_final).map_err(|_| Error::Malformed { message: "server-final", reason: "not UTF-8" })?;
        let signature = text
            .strip_prefix("v=")
            .and_then(|v| BASE64.decode(v).ok())
            .ok_or(Error::Malformed { message: "server-final", reason: "expected v=<signature>" })?;
        if bool::from(signature.ct_eq(expected)) {
            Ok(())
        } else {
            Err(Error::AuthenticationFailed)
        }
    }
}

struct ClientFirst {
    username: String,
    gs2_header: String,
    client_first_bare: String,
    client_nonce: String,
}

fn malformed_first(reason: &'static str) -> Error {
    Error::Malformed { message: "SCRAM client-first", reason }
}

fn malformed_final(reason: &'static str) -> Error {
    Error::Malformed { message: "SCRAM client-final", reason }
}

/// `gs2-header client-first-bare` (RFC 5802 §7).
fn parse_client_first(message: &[u8]) -> Result<ClientFirst> {
    if message.len() > MAX_MESSAGE_LEN {
        return Err(malformed_first("longer than 8 KiB"));
    }
    let text = std::str::from_utf8(message).map_err(|_| malformed_first("not UTF-8"))?;
    let (flag, rest) = text.split_once(',').ok_or_else(|| malformed_first("no GS2 header"))?;
    match flag {
        "n" => {}
        "y" => return Err(Error::ChannelBinding),
        f if f.starts_with("p=") => return Err(Error::ChannelBinding),
        _ => return Err(malformed_first("GS2 channel binding flag is not n, y or p=")),
    }
    let (authzid, bare) = rest.split_once(',').ok_or_else(|| malformed_first("GS2 header is not terminated"))?;
    let authzid = match authzid {
        "" => None,
        a => Some(decode_saslname(a.strip_prefix("a=").ok_or_else(|| malformed_first("authzid is not a=<name>"))?)?),
    };
    let gs2_header = text[..text.len() - bare.len()].to_string();
    let mut attributes = bare.split(',');
    let user = attributes.next().unwrap_or_default();
    if user.starts_with("m=") {
        return Err(malformed_first("mandatory extensions are not supported"));
    }
    let username = decode_saslname(user.strip_prefix("n=").ok_or_else(|| malformed_first("no n=<user>"))?)?;
    let client_nonce = attributes.next().and_then(|r| r.strip_prefix("r=")).ok_or_else(|| malformed_first("no r=<nonce>"))?;
    check_nonce(client_nonce).map_err(malformed_first)?;
    // Optional extensions (Kafka's `tokenauth=true`): accepted, and ignored, which for a
    // token-auth client means a failed proof rather than a bypass.
    for extension in attributes {
        let (key, _) = extension.split_once('=').ok_or_else(|| malformed_first("an extension is not key=value"))?;
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(malformed_first("an extension name is not alphanumeric"));
        }
    }
    if let Some(authzid) = authzid {
        if authzid != username {
            return Err(Error::AuthzidMismatch { authzid });
        }
    }
    Ok(ClientFirst { username, gs2_header, client_first_bare: bare.to_string(), client_nonce: client_nonce.to_string() })
}

struct ClientFinal<'a> {
    channel_binding: &'a str,
    nonce: &'a str,
    proof: &'a str,
    without_proof: &'a str,
}

/// `c=<binding>,r=<nonce>[,extensions],p=<proof>` (RFC 5802 §7).
fn parse_client_final(message: &[u8]) -> Result<ClientFinal<'_>> {
    if message.len() > MAX_MESSAGE_LEN {
        return Err(malformed_final("longer than 8 KiB"));
    }
    let text = std::str::from_utf8(message).map_err(|_| malformed_final("not UTF-8"))?;
    let (without_proof, proof) = text.rsplit_once(",p=").ok_or_else(|| malformed_final("no p=<proof> at the end"))?;
    let mut attributes = without_proof.split(',');
    let channel_binding =
        attributes.next().and_then(|c| c.strip_prefix("c=")).ok_or_else(|| malformed_final("does not start with c="))?;
    let nonce = attributes.next().and_then(|r| r.strip_prefix("r=")).ok_or_else(|| malformed_final("no r=<nonce>"))?;
    for extension in attributes {
        if !extension.contains('=') {
            return Err(malformed_final("an extension is not key=value"));
        }
    }
    if proof.contains(',') {
        return Err(malformed_final("p=<proof> is not the last attribute"));
    }
    Ok(ClientFinal { channel_binding, nonce, proof, without_proof })
}

/// Printable ASCII except `,` (RFC 5802 `printable`), non-empty.
fn check_nonce(nonce: &str) -> Result<(), &'static str> {
    if nonce.is_empty() {
        return Err("empty nonce");
    }
    if !nonce.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',') {
        return Err("nonce has a character outside printable ASCII");
    }
    Ok(())
}

/// Decodes a `saslname`: `=2C` is `,`, `=3D` is `=`, any other `=` is an error.
fn decode_saslname(name: &str) -> Result<String> {
    if name.is_empty() {
        return Err(malformed_first("empty user name"));
    }
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find('=') {
        out.push_str(&rest[..at]);
        match rest.get(at..at + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(malformed_first("user name has a bad =XX escape")),
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The client side of an exchange, enough to drive the server in tests.
    pub(crate) struct TestClient {
        pub(crate) mechanism: ScramMechanism,
        pub(crate) client_first_bare: String,
    }

    impl TestClient {
        pub(crate) fn new(mechanism: ScramMechanism, user: &str, nonce: &str) -> (Self, Vec<u8>) {
            let bare = format!("n={},r={nonce}", user.replace('=', "=3D").replace(',', "=2C"));
            let first = format!("n,,{bare}").into_bytes();
            (Self { mechanism, client_first_bare: bare }, first)
        }

        /// Client-final for `server_first` with `password`, and the expected server-final.
        pub(crate) fn client_final(&self, server_first: &[u8], password: &str) -> (Vec<u8>, Vec<u8>) {
            let server_first = std::str::from_utf8(server_first).unwrap();
            let mut fields = server_first.split(',');
            let nonce = fields.next().unwrap().strip_prefix("r=").unwrap();
            let salt = BASE64.decode(fields.next().unwrap().strip_prefix("s=").unwrap()).unwrap();
            let iterations: u32 = fields.next().unwrap().strip_prefix("i=").unwrap().parse().unwrap();
            let m = self.mechanism;
            let salted = m.salted_password(password.as_bytes(), &salt, iterations);
            let client_key = m.hmac(&salted, b"Client Key");
            let without_proof = format!("c=biws,r={nonce}");
            let auth = format!("{},{server_first},{without_proof}", self.client_first_bare);
            let signature = m.hmac(&m.hash(&client_key), auth.as_bytes());
            let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
            let server_signature = m.hmac(&m.hmac(&salted, b"Server Key"), auth.as_bytes());
            (
                format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes(),
                format!("v={}", BASE64.encode(server_signature)).into_bytes(),
            )
        }
    }

    /// RFC 7677 §3, the SCRAM-SHA-256 example, byte for byte.
    #[test]
    fn rfc7677_sha256_test_vector() {
        let salt = BASE64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let credential = ScramCredential::derive(ScramMechanism::Sha256, "pencil", salt, 4096).unwrap();
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        server.server_nonce = Some("%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into());
        assert_eq!(server.client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO").unwrap(), "user");
        let server_first = server.server_first(Some(credential)).unwrap();
        assert_eq!(
            String::from_utf8(server_first).unwrap(),
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let server_final = server
            .client_final(
                b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            )
            .unwrap();
        assert_eq!(String::from_utf8(server_final).unwrap(), "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
        assert_eq!(server.principal(), Some(Principal::user("user")));
        // Nothing more is accepted once complete.
        assert!(matches!(server.client_final(b"c=biws,r=x,p=AA=="), Err(Error::UnexpectedMessage { state: "complete" })));
    }

    fn exchange(mechanism: ScramMechanism, user: &str, stored: Option<&str>, password: &str) -> Result<Principal> {
        let credential = stored.map(|p| ScramCredential::generate(mechanism, p, MIN_ITERATIONS).unwrap());
        let (client, first) = TestClient::new(mechanism, user, "fyko+d2lbbFgONRv9qkxdawL");
        let mut server = ScramServer::new(mechanism);
        assert_eq!(server.client_first(&first)?, user);
        let server_first = server.server_first(credential)?;
        let (client_final, expected_final) = client.client_final(&server_first, password);
        assert_eq!(server.client_final(&client_final)?, expected_final);
        Ok(server.principal().unwrap())
    }

    #[test]
    fn both_mechanisms_authenticate_the_right_password_only() {
        for m in ScramMechanism::ALL {
            assert_eq!(exchange(m, "alice", Some("s3cret"), "s3cret").unwrap(), Principal::user("alice"));
            assert_eq!(exchange(m, "a,b=c", Some("pw"), "pw").unwrap(), Principal::user("a,b=c"));
            assert!(matches!(exchange(m, "alice", Some("s3cret"), "wrong"), Err(Error::AuthenticationFailed)));
            // An unknown user fails at the same step with the same error.
            assert!(matches!(exchange(m, "nobody", None, "s3cret"), Err(Error::AuthenticationFailed)));
        }
    }

    #[test]
    fn the_client_half_authenticates_against_the_server_half() {
        for m in ScramMechanism::ALL {
            let credential = ScramCredential::generate(m, "pw", MIN_ITERATIONS).unwrap();
            let (mut client, first) = ScramClient::new(m, "a,b", "pw");
            let mut server = ScramServer::new(m);
            assert_eq!(server.client_first(&first).unwrap(), "a,b");
            let server_first = server.server_first(Some(credential.clone())).unwrap();
            let server_final = server.client_final(&client.client_final(&server_first).unwrap()).unwrap();
            client.verify_server_final(&server_final).unwrap();
            assert_eq!(server.principal(), Some(Principal::user("a,b")));
            // A wrong password fails at the server; a forged server-final at the client.
            let (mut client, first) = ScramClient::new(m, "a,b", "wrong");
            let mut server = ScramServer::new(m);
            server.client_first(&first).unwrap();
            let server_first = server.server_first(Some(credential)).unwrap();
            assert!(matches!(
                server.client_final(&client.client_final(&server_first).unwrap()),
                Err(Error::AuthenticationFailed)
            ));
            assert!(client.verify_server_final(b"v=AAAA").is_err());
        }
    }

    #[test]
    fn the_doubled_client_nonce_of_old_librdkafka_is_accepted_and_nothing_else() {
        let m = ScramMechanism::Sha256;
        let credential = ScramCredential::generate(m, "pw", MIN_ITERATIONS).unwrap();
        let (client, first) = TestClient::new(m, "alice", "cnonce");
        let attempt = |client_final: &dyn Fn(&str) -> String| {
            let mut server = ScramServer::new(m);
            server.client_first(&first).unwrap();
            let server_first = String::from_utf8(server.server_first(Some(credential.clone())).unwrap()).unwrap();
            let nonce = server_first.split(',').next().unwrap().strip_prefix("r=").unwrap().to_owned();
            // The proof covers the nonce as sent, so each form is signed as sent.
            let sent = client_final(&nonce);
            let salt = server_first.split(',').nth(1).unwrap().strip_prefix("s=").unwrap();
            let salt = BASE64.decode(salt).unwrap();
            let salted = m.salted_password(b"pw", &salt, MIN_ITERATIONS);
            let client_key = m.hmac(&salted, b"Client Key");
            let without_proof = format!("c=biws,r={sent}");
            let auth = format!("{},{server_first},{without_proof}", client.client_first_bare);
            let signature = m.hmac(&m.hash(&client_key), auth.as_bytes());
            let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
            server.client_final(format!("{without_proof},p={}", BASE64.encode(proof)).as_bytes()).map(|_| ())
        };
        attempt(&|nonce| nonce.to_owned()).unwrap();
        attempt(&|nonce| format!("cnonce{nonce}")).unwrap();
        for other in [|n: &str| format!("xnonce{n}"), |n: &str| format!("cnoncecnonce{n}"), |n: &str| format!("{n}x")] {
            assert!(matches!(attempt(&other), Err(Error::NonceMismatch)));
        }
    }

    #[test]
    fn unknown_users_get_a_stable_salt() {
        let first = |_| {
            let mut server = ScramServer::new(ScramMechanism::Sha256);
            server.client_first(b"n,,n=ghost,r=abc").unwrap();
            let reply = String::from_utf8(server.server_first(None).unwrap()).unwrap();
            reply.split(',').nth(1).unwrap().to_string()
        };
        assert_eq!(first(1), first(2));
    }

    #[test]
    fn malformed_client_first_gets_a_precise_error() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "no GS2 header"),
            (b"x,,n=u,r=a", "GS2 channel binding flag is not n, y or p="),
            (b"n,n=u,r=a", "authzid is not a=<name>"),
            (b"n,,r=a", "no n=<user>"),
            (b"n,,m=ext,n=u,r=a", "mandatory extensions are not supported"),
            (b"n,,n=u", "no r=<nonce>"),
            (b"n,,n=u,r=", "empty nonce"),
            (b"n,,n=u,r=a b", "nonce has a character outside printable ASCII"),
            (b"n,,n=,r=a", "empty user name"),
            (b"n,,n=a=2X,r=a", "user name has a bad =XX escape"),
            (b"n,,n=u,r=a,junk", "an extension is not key=value"),
            (b"n,,n=\xff,r=a", "not UTF-8"),
        ];
        for (message, reason) in cases {
            let mut server = ScramServer::new(ScramMechanism::Sha256);
            match server.client_first(message) {
                Err(Error::Malformed { reason: r, .. }) => assert_eq!(r, *reason, "{:?}", String::from_utf8_lossy(message)),
                other => panic!("{:?}: {other:?}", String::from_utf8_lossy(message)),
            }
            // A failed exchange stays failed.
            assert!(matches!(server.client_first(b"n,,n=u,r=a"), Err(Error::UnexpectedMessage { state: "failed" })));
        }
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        assert!(matches!(server.client_first(b"y,,n=u,r=a"), Err(Error::ChannelBinding)));
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        assert!(matches!(server.client_first(b"p=tls-unique,,n=u,r=a"), Err(Error::ChannelBinding)));
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        assert!(matches!(server.client_first(b"n,a=admin,n=u,r=a"), Err(Error::AuthzidMismatch { .. })));
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        assert_eq!(server.client_first(b"n,a=u,n=u,r=a").unwrap(), "u");
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        assert!(matches!(server.client_first(&vec![b'n'; MAX_MESSAGE_LEN + 1]), Err(Error::Malformed { .. })));
    }

    /// Drives an exchange to the point where client-final is due.
    fn at_client_final(password: &str) -> (ScramServer, TestClient, Vec<u8>) {
        let credential = ScramCredential::generate(ScramMechanism::Sha256, password, MIN_ITERATIONS).unwrap();
        let (client, first) = TestClient::new(ScramMechanism::Sha256, "alice", "cnonce");
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        server.client_first(&first).unwrap();
        let server_first = server.server_first(Some(credential)).unwrap();
        (server, client, server_first)
    }

    #[test]
    fn client_final_checks_nonce_binding_and_proof() {
        let (mut server, client, server_first) = at_client_final("pw");
        let (good, _) = client.client_final(&server_first, "pw");
        let good = String::from_utf8(good).unwrap();

        let bad_nonce = good.replacen(",r=cnonce", ",r=cnonceX", 1);
        assert!(matches!(server.client_final(bad_nonce.as_bytes()), Err(Error::NonceMismatch)));
        // The failure is final: even the right message is now refused.
        assert!(matches!(server.client_final(good.as_bytes()), Err(Error::UnexpectedMessage { state: "failed" })));

        let (mut server, client, server_first) = at_client_final("pw");
        let (good, _) = client.client_final(&server_first, "pw");
        let good = String::from_utf8(good).unwrap();
        let other_binding = good.replacen("c=biws", "c=eSws", 1); // "y,,"
        assert!(matches!(server.client_final(other_binding.as_bytes()), Err(Error::ChannelBinding)));

        for (message, reason) in [
            ("c=biws,r=x", "no p=<proof> at the end"),
            ("r=x,c=biws,p=AA==", "does not start with c="),
            ("c=biws,p=AA==", "no r=<nonce>"),
            ("c=biws,r=x,oops,p=AA==", "an extension is not key=value"),
            ("c=!!,r=x,p=AA==", "channel binding is not base64"),
        ] {
            let (mut server, _, _) = at_client_final("pw");
            match server.client_final(message.as_bytes()) {
                Err(Error::Malformed { reason: r, .. }) => assert_eq!(r, reason, "{message}"),
                other => panic!("{message}: {other:?}"),
            }
        }
        let (mut server, client, server_first) = at_client_final("pw");
        let (good, _) = client.client_final(&server_first, "pw");
        let (without_proof, _) = std::str::from_utf8(&good).unwrap().rsplit_once(",p=").unwrap();
        let short = format!("{without_proof},p=AAAA");
        assert!(matches!(
            server.client_final(short.as_bytes()),
            Err(Error::Malformed { reason: "proof has the wrong length", .. })
        ));
    }

    #[test]
    fn replayed_and_out_of_order_messages_are_refused() {
        // client-final before server-first.
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        assert!(matches!(server.client_final(b"c=biws,r=a,p=AA=="), Err(Error::UnexpectedMessage { .. })));
        // client-first twice.
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        server.client_first(b"n,,n=u,r=a").unwrap();
        assert!(matches!(server.client_first(b"n,,n=u,r=a"), Err(Error::UnexpectedMessage { .. })));
        // server-first before client-first.
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        assert!(matches!(server.server_first(None), Err(Error::UnexpectedMessage { .. })));

        // A client-final captured from one successful exchange, replayed into a new one
        // with the same client nonce: the server's half of the nonce differs.
        let (mut server, client, server_first) = at_client_final("pw");
        let (captured, _) = client.client_final(&server_first, "pw");
        server.client_final(&captured).unwrap();
        let (mut replayed, _, _) = at_client_final("pw");
        assert!(matches!(replayed.client_final(&captured), Err(Error::NonceMismatch)));
    }

    #[test]
    fn credentials_round_trip_kafkas_string_form() {
        // A password with a space: base64 of the random salt and keys can hold any short
        // alphanumeric run ("pw" showed up once), never a space.
        for m in ScramMechanism::ALL {
            let credential = ScramCredential::generate(m, "pass word", 8192).unwrap();
            let text = credential.to_kafka_string();
            assert!(!text.contains("pass word"));
            assert_eq!(ScramCredential::from_kafka_string(m, &text).unwrap(), credential);
            assert!(credential.verify_password(m, "pass word"));
            assert!(!credential.verify_password(m, "pass Word"));
        }
        let sha256 = ScramCredential::generate(ScramMechanism::Sha256, "pw", 4096).unwrap().to_kafka_string();
        assert!(ScramCredential::from_kafka_string(ScramMechanism::Sha512, &sha256).is_err());
        assert!(matches!(
            ScramCredential::generate(ScramMechanism::Sha256, "pw", 4095),
            Err(Error::InvalidIterations { iterations: 4095, .. })
        ));
        assert!(ScramCredential::generate(ScramMechanism::Sha256, "pw", MAX_ITERATIONS + 1).is_err());
        for bad in ["", "salt=AA==", "salt=AA==,salt=AA==", "salt=*,stored_key=,server_key=,iterations=4096"] {
            assert!(matches!(ScramCredential::from_kafka_string(ScramMechanism::Sha256, bad), Err(Error::InvalidCredential(_))));
        }
        let salt = b"salt".to_vec();
        let salted = ScramMechanism::Sha512.salted_password(b"pw", &salt, 4096);
        let from_client =
            ScramCredential::from_client_salted_password(ScramMechanism::Sha512, &salted, salt.clone(), 4096).unwrap();
        assert_eq!(from_client, ScramCredential::derive(ScramMechanism::Sha512, "pw", salt.clone(), 4096).unwrap());
        assert!(ScramCredential::from_client_salted_password(ScramMechanism::Sha256, &salted, salt.clone(), 4096).is_err());
        assert!(ScramCredential::from_client_salted_password(ScramMechanism::Sha512, &salted, Vec::new(), 4096).is_err());
        assert!(ScramCredential::from_client_salted_password(ScramMechanism::Sha512, &salted, salt, 100).is_err());
        assert_eq!("SCRAM-SHA-512".parse::<ScramMechanism>().unwrap(), ScramMechanism::Sha512);
        assert!("SCRAM-SHA-1".parse::<ScramMechanism>().is_err());
        assert!(!format!("{:?}", ScramCredential::generate(ScramMechanism::Sha256, "pw", 4096).unwrap()).contains("key"));
    }
}
