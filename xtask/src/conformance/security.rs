//! The suite's security scenario: a SCRAM user made before the brokers start, and the
//! TLS files (a CA, the brokers' certificate, the client's in several encodings).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// The security scenario's SCRAM user, created before the brokers start.
pub(super) const SCRAM_USER: &str = "conformance";
pub(super) const SCRAM_PASSWORD: &str = "conformance-secret";
/// The password of the client's PKCS#12 keystore (`ssl.key.password`).
pub(super) const CLIENT_KEYSTORE_PASSWORD: &str = "conformance-keystore";

/// `fjord users add` of [`SCRAM_USER`] (both SCRAM mechanisms; PLAIN checks the same
/// credential), on the store `store_args` name (`--data-dir D` or `--zookeeper Z`).
pub(super) fn add_scram_user(root: &Path, store_args: &[&std::ffi::OsStr]) -> Result<()> {
    use std::io::Write;
    let mut child = Command::new(root.join("target/debug/fjord"))
        .args(["users", "add", SCRAM_USER, "--mechanism", "SCRAM-SHA-256", "--mechanism", "SCRAM-SHA-512", "--password-stdin"])
        .args(store_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .context("starting fjord users add")?;
    child.stdin.take().expect("piped").write_all(format!("{SCRAM_PASSWORD}\n").as_bytes())?;
    let status = child.wait()?;
    if !status.success() {
        bail!("fjord users add {SCRAM_USER} failed ({status})");
    }
    Ok(())
}

/// The files of the security scenario, made with `openssl` for one run in `dir`: a CA,
/// the brokers' certificate for 127.0.0.1 signed by it, and a client key and certificate
/// in the encodings 0097 loads them in (PEM, DER, PKCS#12 with the CA), where the suite's
/// own cluster tool (trivup) puts them too. The listeners ask for no client certificate:
/// on SASL_SSL, SASL says who the client is.
pub(super) struct TlsFixtures {
    dir: PathBuf,
}

impl TlsFixtures {
    pub(super) fn make(dir: &Path) -> Result<Self> {
        super::fresh_dir(dir)?;
        let openssl = |args: &[&str]| -> Result<()> {
            let output =
                Command::new("openssl").args(args).current_dir(dir).stdin(Stdio::null()).output().context("running openssl")?;
            if !output.status.success() {
                bail!("openssl {} failed: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
            }
            Ok(())
        };
        let ec_key = |name: &str| openssl(&["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", name]);
        ec_key("ca.key")?;
        openssl(&[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-subj",
            "/CN=fjord conformance CA",
            "-days",
            "30",
            "-out",
            "ca.pem",
        ])?;
        // Each certificate: a request, signed by the CA with the extensions in a file
        // (a leaf, with the names librdkafka checks the broker's against).
        let sign = |name: &str, subject: &str, extensions: &str| -> Result<()> {
            ec_key(&format!("{name}.key"))?;
            openssl(&["req", "-new", "-key", &format!("{name}.key"), "-subj", subject, "-out", &format!("{name}.csr")])?;
            fs::write(dir.join(format!("{name}.ext")), extensions)?;
            openssl(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "30",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.pem"),
            ])
        };
        sign(
            "server",
            "/CN=localhost",
            "basicConstraints=critical,CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        )?;
        sign("client", &format!("/CN={SCRAM_USER}"), "basicConstraints=critical,CA:FALSE\nextendedKeyUsage=clientAuth\n")?;
        // The broker's keystore: its key and certificate in one PEM file.
        let keystore = [fs::read(dir.join("server.key"))?, fs::read(dir.join("server.pem"))?].concat();
        fs::write(dir.join("server-keystore.pem"), keystore)?;
        openssl(&["x509", "-in", "client.pem", "-outform", "DER", "-out", "client.der"])?;
        openssl(&["pkey", "-in", "client.key", "-outform", "DER", "-out", "client.key.der"])?;
        openssl(&["x509", "-in", "ca.pem", "-outform", "DER", "-out", "ca.der"])?;
        let password = format!("pass:{CLIENT_KEYSTORE_PASSWORD}");
        openssl(&[
            "pkcs12",
            "-export",
            "-in",
            "client.pem",
            "-inkey",
            "client.key",
            "-certfile",
            "ca.pem",
            "-passout",
            &password,
            "-out",
            "client.p12",
        ])?;
        Ok(Self { dir: dir.to_owned() })
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// A broker's keys for a PLAINTEXT listener at `plaintext` (the brokers' own
    /// traffic, the topic tool stand-in's) and a SASL_SSL one at `sasl_ssl`.
    pub(super) fn broker_settings(&self, plaintext: &str, sasl_ssl: &str) -> Vec<(String, String)> {
        [
            ("listeners", format!("PLAINTEXT://{plaintext},SASL_SSL://{sasl_ssl}")),
            ("inter.broker.listener.name", "PLAINTEXT".into()),
            ("ssl.keystore.type", "PEM".into()),
            ("ssl.keystore.location", self.path("server-keystore.pem")),
            ("ssl.truststore.location", self.path("ca.pem")),
            ("ssl.client.auth", "none".into()),
            ("sasl.enabled.mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN".into()),
            // KIP-368 sessions, so that 0142 re-authenticates (it skips itself where a
            // broker reports 0); other tests' clients re-authenticate every 10 s too.
            ("connections.max.reauth.ms", "10000".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// The tests' `test.conf`: every client of every test connects over SASL_SSL as
    /// [`SCRAM_USER`], trusting the CA, with the client key and certificate set (0097
    /// swaps them for other encodings and other keys).
    pub(super) fn client_conf(&self, bootstrap: &str) -> String {
        format!(
            "bootstrap.servers={bootstrap}\nsecurity.protocol=SASL_SSL\nsasl.mechanisms=SCRAM-SHA-256\n\
             sasl.username={SCRAM_USER}\nsasl.password={SCRAM_PASSWORD}\nssl.ca.location={}\n\
             ssl.certificate.location={}\nssl.key.location={}\nssl.key.password={CLIENT_KEYSTORE_PASSWORD}\n",
            self.path("ca.pem"),
            self.path("client.pem"),
            self.path("client.key"),
        )
    }

    /// The `SSL_*` variables 0097 reads (as trivup sets them): the client's keystore
    /// and its password, its certificate, key and CA in each encoding, and the client
    /// authentication the listeners ask for.
    pub(super) fn test_env(&self) -> Vec<(String, String)> {
        [
            ("SSL_pkcs", self.path("client.p12")),
            ("SSL_password", CLIENT_KEYSTORE_PASSWORD.to_owned()),
            ("SSL_pub_der", self.path("client.der")),
            ("SSL_pub_pem", self.path("client.pem")),
            ("SSL_priv_der", self.path("client.key.der")),
            ("SSL_priv_pem", self.path("client.key")),
            ("SSL_ca_der", self.path("ca.der")),
            ("SSL_all_cas_pem", self.path("ca.pem")),
            ("SSL_client_auth", "none".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}
