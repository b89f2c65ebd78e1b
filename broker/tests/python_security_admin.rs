//! Kafka's security admin APIs through confluent-kafka's AdminClient (librdkafka):
//! CreateAcls, DescribeAcls (ANY and MATCH filters), DeleteAcls,
//! AlterUserScramCredentials and DescribeUserScramCredentials; then the stored
//! credential is checked against the password the client salted. The registry's Subject
//! ACLs in the same store are neither shown nor deleted by ANY filters.

mod common;

use std::time::Duration;

use common::{run_python, TestBroker};
use fjord_auth::scram::ScramMechanism;
use fjord_auth::{AccessControlEntry, AclBinding, Operation, PatternType, Permission, ResourcePattern, ResourceType};

const SCRIPT: &str = r#"
import sys
from confluent_kafka import KafkaException
from confluent_kafka.admin import (AdminClient, AclBinding, AclBindingFilter, ResourceType, ResourcePatternType,
    AclOperation, AclPermissionType, UserScramCredentialUpsertion, UserScramCredentialDeletion,
    ScramCredentialInfo, ScramMechanism)

a = AdminClient({'bootstrap.servers': sys.argv[1]})
T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.BROKER
LIT, PRE = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
acls = [
    AclBinding(T, 'orders', LIT, 'User:alice', '*', AclOperation.READ, ALLOW),
    AclBinding(T, 'ord', PRE, 'User:carol', '*', AclOperation.DESCRIBE, ALLOW),
    AclBinding(G, 'team-', PRE, 'User:alice', '*', AclOperation.READ, ALLOW),
    AclBinding(T, 'orders', LIT, 'User:bob', '10.0.0.1', AclOperation.WRITE, DENY),
    AclBinding(T, '*', LIT, 'User:*', '*', AclOperation.DESCRIBE_CONFIGS, ALLOW),
]
for f in a.create_acls(acls).values():
    f.result()
key = lambda b: (b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation, b.permission_type)

def describe(restype, name, pattern, principal=None):
    f = AclBindingFilter(restype, name, pattern, principal, None, AclOperation.ANY, AclPermissionType.ANY)
    return sorted(map(key, a.describe_acls(f).result()))

# ANY lists Kafka's resource types only: the registry's Subject ACLs in the store (which a
# Kafka client could only show as UNKNOWN) are not among them.
everything = describe(ResourceType.ANY, None, ResourcePatternType.ANY)
assert not any(b[0] == ResourceType.UNKNOWN for b in everything), everything
assert everything == sorted(map(key, acls)), everything
# MATCH: what applies to topic 'orders': the literal name, the literal '*', the prefix 'ord'.
assert describe(T, 'orders', ResourcePatternType.MATCH) == sorted(map(key, [acls[0], acls[1], acls[3], acls[4]]))
# ANY with a name: that exact name, whatever the pattern type.
assert describe(T, 'orders', ResourcePatternType.ANY) == sorted(map(key, [acls[0], acls[3]]))
assert describe(ResourceType.ANY, None, ResourcePatternType.ANY, 'User:alice') == sorted(map(key, [acls[0], acls[2]]))

# A cluster ACL must name kafka-cluster: refused, nothing else in the request is lost.
bad = AclBinding(ResourceType.BROKER, 'not-the-cluster', LIT, 'User:x', '*', AclOperation.ALTER, ALLOW)
good = AclBinding(ResourceType.BROKER, 'kafka-cluster', LIT, 'User:admin', '*', AclOperation.ALTER, ALLOW)
results = a.create_acls([bad, good])
try:
    results[bad].result()
    raise AssertionError('a cluster ACL on another name was accepted')
except KafkaException as e:
    assert e.args[0].code() == 42, e  # INVALID_REQUEST
results[good].result()

bob = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, 'User:bob', None, AclOperation.ANY, AclPermissionType.ANY)
cluster = AclBindingFilter(C, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY)
# bob's ANY filter deletes his Kafka ACL, not his Subject ACL.
deleted = a.delete_acls([bob, cluster])
assert list(map(key, deleted[bob].result())) == [key(acls[3])], deleted[bob].result()
assert list(map(key, deleted[cluster].result())) == [key(good)], deleted[cluster].result()
assert describe(ResourceType.ANY, None, ResourcePatternType.ANY) == sorted(map(key, [acls[0], acls[1], acls[2], acls[4]]))

# SCRAM credentials: the client salts the password; the broker keeps derived keys only.
M256, M512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
for f in a.alter_user_scram_credentials([
    UserScramCredentialUpsertion('alice', ScramCredentialInfo(M512, 8192), b'alice-secret', b'salt-of-alice'),
    UserScramCredentialUpsertion('alice', ScramCredentialInfo(M256, 4096), b'alice-secret'),
    UserScramCredentialUpsertion('bob', ScramCredentialInfo(M256, 4096), b'bob-secret'),
]).values():
    f.result()
described = a.describe_user_scram_credentials(['alice'])['alice'].result()
assert sorted((i.mechanism, i.iterations) for i in described.scram_credential_infos) == [(M256, 4096), (M512, 8192)], described
everyone = a.describe_user_scram_credentials().result()
assert sorted(everyone) == ['alice', 'bob'], everyone
try:
    a.describe_user_scram_credentials(['nobody'])['nobody'].result()
    raise AssertionError('an unknown user was described')
except KafkaException as e:
    assert e.args[0].code() == 91, e  # RESOURCE_NOT_FOUND

results = a.alter_user_scram_credentials([
    UserScramCredentialDeletion('bob', M256),
    UserScramCredentialDeletion('carol', M256),
    UserScramCredentialUpsertion('dave', ScramCredentialInfo(M256, 100), b'too-few-iterations'),
])
results['bob'].result()
for user, code in [('carol', 91), ('dave', 93)]:  # RESOURCE_NOT_FOUND, UNACCEPTABLE_CREDENTIAL
    try:
        results[user].result()
        raise AssertionError(user)
    except KafkaException as e:
        assert e.args[0].code() == code, (user, e)
assert sorted(a.describe_user_scram_credentials().result()) == ['alice']
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confluent_kafka_manages_acls_and_scram_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // The registry's ACLs on subjects (not a Kafka resource type), in the store as its
    // tools write them: Kafka's ANY filters neither show nor delete them.
    std::fs::create_dir_all(&data).unwrap();
    let subjects = [("orders-value", "User:bob"), ("payments-value", "User:alice")].map(|(subject, principal)| AclBinding {
        pattern: ResourcePattern::new(ResourceType::Subject, subject, PatternType::Literal).unwrap(),
        entry: AccessControlEntry::new(principal.parse().unwrap(), "*", Operation::Describe, Permission::Allow).unwrap(),
    });
    {
        let store = fjord_coord::EmbeddedStore::open(&data.join(fjord_broker::server::METADATA_DIR)).unwrap();
        fjord_auth::store::create_acls(&store, &subjects).await.unwrap();
    }
    let broker = TestBroker::start_in(data.clone(), |_| {}).await.unwrap();
    run_python(SCRIPT, &[&broker.bootstrap()], Duration::from_secs(60)).await;
    broker.stop().await.unwrap();

    // What the store holds derives from the password the client salted, and is not it.
    let store = fjord_coord::EmbeddedStore::open(&data.join(fjord_broker::server::METADATA_DIR)).unwrap();
    let credentials = fjord_auth::store::user_credentials(&store, "alice").await.unwrap();
    assert_eq!(credentials.len(), 2);
    assert_eq!(credentials[&ScramMechanism::Sha512].salt, b"salt-of-alice");
    for (mechanism, credential) in &credentials {
        assert!(credential.verify_password(*mechanism, "alice-secret"), "{mechanism}");
        assert!(!credential.verify_password(*mechanism, "alice-secreT"), "{mechanism}");
    }
    let acls = fjord_auth::store::read_acls(&store).await.unwrap();
    assert_eq!(acls.values().map(|entries| entries.len()).sum::<usize>(), 4 + subjects.len());
    for subject in &subjects {
        assert!(acls[&subject.pattern].contains(&subject.entry), "a Kafka ANY filter deleted {subject}");
    }
}
