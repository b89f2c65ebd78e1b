//! Test certificates: a CA, a server key store and a client certificate, made with the
//! `openssl` command in a directory, for the TLS tests of the broker, the gateway and the
//! registry.

use std::path::PathBuf;

use anyhow::{bail, Context};

/// A test CA and certificates made with `openssl` in a directory: `ca.pem`, the broker's
/// key store `server-keystore.pem` (key + certificate for 127.0.0.1 / localhost) and a
/// client's `client.pem` / `client.key` (subject `CN=alice,OU=eng,O=Fjord Test`).
pub struct Certs {
    /// Where the files are.
    pub dir: PathBuf,
}

impl Certs {
    /// Makes the CA, the server's key store and the client's certificate in `dir`.
    pub fn create(dir: &std::path::Path) -> anyhow::Result<Self> {
        let certs = Self { dir: dir.to_path_buf() };
        certs.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-noenc",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=Fjord Test CA",
        ])?;
        certs.issue("server", "/CN=localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth")?;
        certs.issue("client", "/O=Fjord Test/OU=eng/CN=alice", "extendedKeyUsage=clientAuth")?;
        let keystore = [std::fs::read(dir.join("server.key"))?, std::fs::read(dir.join("server.pem"))?].concat();
        std::fs::write(dir.join("server-keystore.pem"), keystore)?;
        Ok(certs)
    }

    /// Issues `<name>.key` / `<name>.pem` for `subject`, signed by the CA, with the
    /// X.509 v3 extensions `extensions` (`\n`-separated).
    pub fn issue(&self, name: &str, subject: &str, extensions: &str) -> anyhow::Result<()> {
        let ext = self.dir.join(format!("{name}.ext"));
        std::fs::write(&ext, format!("basicConstraints=CA:FALSE\n{extensions}\n"))?;
        let (key, csr, pem) = (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"));
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-noenc",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            subject,
        ])?;
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            ext.to_str().unwrap(),
        ])
    }

    fn openssl(&self, args: &[&str]) -> anyhow::Result<()> {
        let output = std::process::Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .context("openssl must be installed")?;
        if !output.status.success() {
            bail!("openssl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        }
        Ok(())
    }

    /// The path of `file` in the directory, as text (config values are text).
    pub fn path(&self, file: &str) -> String {
        self.dir.join(file).to_str().unwrap().to_owned()
    }
}
