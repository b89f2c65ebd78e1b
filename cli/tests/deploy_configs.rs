//! The broker configs in deploy/ are read by `fjord broker --config`: every key in them
//! must be one the broker knows, with a valid value, or the cluster would not start.

use std::path::{Path, PathBuf};

use fjord_broker::BrokerConfig;

fn configs(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy").join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

#[test]
fn deploy_broker_configs_parse_and_validate() {
    for dir in ["cluster", "systemd", "secure"] {
        let files = configs(dir);
        assert_eq!(files.len(), 3, "three broker configs in deploy/{dir}");
        for (i, file) in files.iter().enumerate() {
            let text = std::fs::read_to_string(file).unwrap();
            let config = BrokerConfig::from_toml(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            config.validate().unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            assert_eq!(config.broker_id, i as i32 + 1, "{} is broker-{}.toml", file.display(), i + 1);
            assert_eq!(config.default_replication_factor, 3, "{}", file.display());
            assert!(config.zookeeper_connect.as_deref().is_some_and(|c| c.ends_with("/fjord")), "{}", file.display());
        }
    }
}

/// A plaintext listener has no authentication: the shipped layouts must not open one on
/// every interface (the operator widens it knowingly, reading the comment beside it).
#[test]
fn deploy_configs_open_no_plaintext_listener_on_every_interface() {
    for dir in ["cluster", "systemd", "secure"] {
        for file in configs(dir) {
            let text = std::fs::read_to_string(&file).unwrap();
            for line in text.lines().filter(|l| l.trim_start().starts_with("\"listeners\"")) {
                let wide = ["PLAINTEXT://0.0.0.0:", "PLAINTEXT://[::]:", "PLAINTEXT://:"].iter().any(|w| line.contains(w));
                assert!(!wide, "{}: {line}", file.display());
            }
        }
    }
}

/// deploy/secure: every listener SASL_SSL, the inter-broker one on the private network,
/// ACLs on, no password in the file.
#[test]
fn the_secure_layout_has_nothing_in_the_clear() {
    for file in configs("secure") {
        let text = std::fs::read_to_string(&file).unwrap();
        let config = BrokerConfig::from_toml(&text).unwrap();
        assert!(config.authorizer_enable, "{}", file.display());
        assert!(config.inter_broker_sasl_password.is_none(), "{}: a password in the file", file.display());
        assert!(config.ssl.keystore_location.is_some() && config.ssl.truststore_location.is_some(), "{}", file.display());
        for listener in config.listeners.iter() {
            assert_eq!(
                config.listener_security_protocol_map.get(&listener.name).map(|p| p.name()),
                Some("SASL_SSL"),
                "{}: {}",
                file.display(),
                listener.name
            );
        }
        let internal = config.listeners.get("INTERNAL").unwrap();
        assert!(!internal.address.ip().is_unspecified(), "{}: INTERNAL on every interface", file.display());
        assert_eq!(config.inter_broker_listener(), "INTERNAL", "{}", file.display());
    }
}
