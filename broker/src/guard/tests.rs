use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::{CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};

use super::*;
use crate::codec::{LEGACY_PRODUCE, SUPPORTED_APIS};

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

/// A Fetch topic as version `v` names it: by name, or from v13 by id.
fn fetch_topic(v: i16) -> FetchTopic {
    if v >= 13 {
        FetchTopic::default().with_topic_id(uuid::Uuid::from_u128(0x1234))
    } else {
        FetchTopic::default().with_topic(TopicName(s("topic-a")))
    }
}

/// A request with every array populated (two elements where possible).
fn sample(key: ApiKey, v: i16) -> Vec<u8> {
    let mut buf = BytesMut::new();
    let name = || TopicName(s("topic-a"));
    let result = match key {
        ApiKey::Produce => ProduceRequest::default()
            .with_acks(-1)
            .with_topic_data(vec![
                TopicProduceData::default().with_name(name()).with_partition_data(vec![
                    PartitionProduceData::default().with_index(1).with_records(Some(bytes::Bytes::from_static(b"batch"))),
                    PartitionProduceData::default().with_index(2).with_records(None),
                ]),
                TopicProduceData::default().with_name(name()),
            ])
            .encode(&mut buf, v),
        ApiKey::Fetch => FetchRequest::default()
            .with_session_id(if v >= 7 { 3 } else { 0 })
            .with_rack_id(if v >= 11 { s("rack") } else { s("") })
            .with_topics(vec![fetch_topic(v).with_partitions(vec![
                FetchPartition::default().with_partition(0).with_fetch_offset(7).with_partition_max_bytes(100),
                FetchPartition::default().with_partition(1),
            ])])
            .with_forgotten_topics_data(match v {
                13.. => vec![ForgottenTopic::default().with_topic_id(uuid::Uuid::from_u128(7)).with_partitions(vec![1, 2])],
                7.. => vec![ForgottenTopic::default().with_topic(name()).with_partitions(vec![1, 2])],
                _ => vec![],
            })
            .encode(&mut buf, v),
        ApiKey::ListOffsets => ListOffsetsRequest::default()
            .with_topics(vec![ListOffsetsTopic::default().with_name(name()).with_partitions(vec![
                ListOffsetsPartition::default().with_timestamp(-1),
                ListOffsetsPartition::default().with_partition_index(3).with_timestamp(123),
            ])])
            .encode(&mut buf, v),
        ApiKey::Metadata => MetadataRequest::default()
            .with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(name())),
                MetadataRequestTopic::default().with_name(Some(TopicName(s("b")))),
            ]))
            .encode(&mut buf, v),
        ApiKey::ApiVersions => ApiVersionsRequest::default()
            .with_client_software_name(s("kcat"))
            .with_client_software_version(s("1.7"))
            .encode(&mut buf, v),
        ApiKey::CreateTopics => CreateTopicsRequest::default()
            .with_topics(vec![CreatableTopic::default()
                .with_name(name())
                .with_assignments(vec![CreatableReplicaAssignment::default().with_broker_ids(vec![BrokerId(0), BrokerId(1)])])
                .with_configs(vec![
                    CreatableTopicConfig::default().with_name(s("retention.ms")).with_value(Some(s("1"))),
                    CreatableTopicConfig::default().with_name(s("x")).with_value(None),
                ])])
            .encode(&mut buf, v),
        ApiKey::DeleteTopics => if v >= 6 {
            DeleteTopicsRequest::default().with_topics(vec![DeleteTopicState::default().with_name(Some(name()))])
        } else {
            DeleteTopicsRequest::default().with_topic_names(vec![name(), TopicName(s("b"))])
        }
        .encode(&mut buf, v),
        ApiKey::DescribeConfigs => DescribeConfigsRequest::default()
            .with_resources(vec![
                DescribeConfigsResource::default().with_resource_name(s("t")).with_configuration_keys(Some(vec![s("a")])),
                DescribeConfigsResource::default().with_resource_name(s("u")).with_configuration_keys(None),
            ])
            .encode(&mut buf, v),
        ApiKey::AlterConfigs => AlterConfigsRequest::default()
            .with_resources(vec![
                alter_configs_request::AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s("t"))
                    .with_configs(vec![
                        alter_configs_request::AlterableConfig::default().with_name(s("retention.ms")).with_value(Some(s("1"))),
                        alter_configs_request::AlterableConfig::default().with_name(s("flush.ms")).with_value(None),
                    ]),
                alter_configs_request::AlterConfigsResource::default().with_resource_type(4).with_resource_name(s("0")),
            ])
            .with_validate_only(true)
            .encode(&mut buf, v),
        ApiKey::IncrementalAlterConfigs => IncrementalAlterConfigsRequest::default()
            .with_resources(vec![incremental_alter_configs_request::AlterConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(s("t"))
                .with_configs(vec![
                    incremental_alter_configs_request::AlterableConfig::default()
                        .with_name(s("cleanup.policy"))
                        .with_config_operation(2)
                        .with_value(Some(s("compact"))),
                    incremental_alter_configs_request::AlterableConfig::default()
                        .with_name(s("flush.ms"))
                        .with_config_operation(1),
                ])])
            .encode(&mut buf, v),
        ApiKey::FindCoordinator => if v >= 4 {
            FindCoordinatorRequest::default().with_coordinator_keys(vec![s("g1"), s("g2")])
        } else {
            FindCoordinatorRequest::default().with_key(s("group"))
        }
        .encode(&mut buf, v),
        ApiKey::JoinGroup => JoinGroupRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_session_timeout_ms(10_000)
            .with_member_id(s("m"))
            .with_group_instance_id(if v >= 5 { Some(s("i")) } else { None })
            .with_protocol_type(s("consumer"))
            .with_protocols(vec![
                join_group_request::JoinGroupRequestProtocol::default()
                    .with_name(s("range"))
                    .with_metadata(Bytes::from_static(b"meta")),
                join_group_request::JoinGroupRequestProtocol::default().with_name(s("roundrobin")),
            ])
            .with_reason(if v >= 8 { Some(s("why")) } else { None })
            .encode(&mut buf, v),
        ApiKey::SyncGroup => SyncGroupRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_member_id(s("m"))
            .with_protocol_type(if v >= 5 { Some(s("consumer")) } else { None })
            .with_assignments(vec![sync_group_request::SyncGroupRequestAssignment::default()
                .with_member_id(s("m"))
                .with_assignment(Bytes::from_static(b"assignment"))])
            .encode(&mut buf, v),
        ApiKey::Heartbeat => {
            HeartbeatRequest::default().with_group_id(GroupId(s("g"))).with_member_id(s("m")).encode(&mut buf, v)
        }
        ApiKey::LeaveGroup => if v >= 3 {
            LeaveGroupRequest::default()
                .with_group_id(GroupId(s("g")))
                .with_members(vec![leave_group_request::MemberIdentity::default().with_member_id(s("m"))])
        } else {
            LeaveGroupRequest::default().with_group_id(GroupId(s("g"))).with_member_id(s("m"))
        }
        .encode(&mut buf, v),
        ApiKey::OffsetCommit => OffsetCommitRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_member_id(s("m"))
            .with_topics(vec![offset_commit_request::OffsetCommitRequestTopic::default().with_name(name()).with_partitions(
                vec![offset_commit_request::OffsetCommitRequestPartition::default()
                    .with_committed_offset(42)
                    .with_committed_metadata(Some(s("md")))],
            )])
            .encode(&mut buf, v),
        ApiKey::OffsetFetch => if v >= 8 {
            OffsetFetchRequest::default().with_groups(vec![offset_fetch_request::OffsetFetchRequestGroup::default()
                .with_group_id(GroupId(s("g")))
                .with_topics(Some(vec![offset_fetch_request::OffsetFetchRequestTopics::default()
                    .with_name(name())
                    .with_partition_indexes(vec![0, 1])]))])
        } else {
            OffsetFetchRequest::default().with_group_id(GroupId(s("g"))).with_topics(Some(vec![
                offset_fetch_request::OffsetFetchRequestTopic::default().with_name(name()).with_partition_indexes(vec![0, 1]),
            ]))
        }
        .encode(&mut buf, v),
        ApiKey::ListGroups => {
            ListGroupsRequest::default().with_states_filter(if v >= 4 { vec![s("Stable")] } else { vec![] }).encode(&mut buf, v)
        }
        ApiKey::DescribeGroups => DescribeGroupsRequest::default().with_groups(vec![GroupId(s("g"))]).encode(&mut buf, v),
        ApiKey::DeleteGroups => DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s("g"))]).encode(&mut buf, v),
        ApiKey::InitProducerId => InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(s("tx"))))
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(ProducerId(if v >= 3 { 7 } else { -1 }))
            .encode(&mut buf, v),
        ApiKey::OffsetForLeaderEpoch => OffsetForLeaderEpochRequest::default()
            .with_replica_id(BrokerId(if v >= 3 { 2 } else { -1 }))
            .with_topics(vec![offset_for_leader_epoch_request::OffsetForLeaderTopic::default()
                .with_topic(name())
                .with_partitions(vec![offset_for_leader_epoch_request::OffsetForLeaderPartition::default()
                    .with_partition(1)
                    .with_current_leader_epoch(4)
                    .with_leader_epoch(3)])])
            .encode(&mut buf, v),
        ApiKey::ElectLeaders => ElectLeadersRequest::default()
            .with_election_type(if v >= 1 { 1 } else { 0 })
            .with_topic_partitions(Some(vec![
                elect_leaders_request::TopicPartitions::default().with_topic(name()).with_partitions(vec![0, 1]),
                elect_leaders_request::TopicPartitions::default().with_topic(name()),
            ]))
            .with_timeout_ms(30_000)
            .encode(&mut buf, v),
        ApiKey::CreateAcls => CreateAclsRequest::default()
            .with_creations(vec![create_acls_request::AclCreation::default()
                .with_resource_type(2)
                .with_resource_name(s("topic-a"))
                .with_resource_pattern_type(3)
                .with_principal(StrBytes::from_static_str("User:a"))
                .with_host(StrBytes::from_static_str("*"))
                .with_operation(3)
                .with_permission_type(3)])
            .encode(&mut buf, v),
        ApiKey::DescribeAcls => DescribeAclsRequest::default()
            .with_resource_type_filter(2)
            .with_resource_name_filter(Some(s("topic-a")))
            .with_pattern_type_filter(2)
            .with_principal_filter(Some(StrBytes::from_static_str("User:a")))
            .with_operation(1)
            .with_permission_type(1)
            .encode(&mut buf, v),
        ApiKey::DeleteAcls => DeleteAclsRequest::default()
            .with_filters(vec![
                delete_acls_request::DeleteAclsFilter::default()
                    .with_resource_type_filter(1)
                    .with_resource_name_filter(Some(s("topic-a")))
                    .with_pattern_type_filter(1),
                delete_acls_request::DeleteAclsFilter::default().with_host_filter(Some(StrBytes::from_static_str("*"))),
            ])
            .encode(&mut buf, v),
        ApiKey::DescribeUserScramCredentials => DescribeUserScramCredentialsRequest::default()
            .with_users(Some(vec![describe_user_scram_credentials_request::UserName::default().with_name(s("user"))]))
            .encode(&mut buf, v),
        ApiKey::AlterUserScramCredentials => AlterUserScramCredentialsRequest::default()
            .with_deletions(vec![alter_user_scram_credentials_request::ScramCredentialDeletion::default()
                .with_name(s("user"))
                .with_mechanism(1)])
            .with_upsertions(vec![alter_user_scram_credentials_request::ScramCredentialUpsertion::default()
                .with_name(s("user"))
                .with_mechanism(2)
                .with_iterations(4096)
                .with_salt(Bytes::from_static(b"salt"))
                .with_salted_password(Bytes::from_static(&[7; 64]))])
            .encode(&mut buf, v),
        ApiKey::SaslHandshake => SaslHandshakeRequest::default().with_mechanism(s("SCRAM-SHA-256")).encode(&mut buf, v),
        ApiKey::SaslAuthenticate => {
            SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from_static(b"n,,n=alice,r=abc")).encode(&mut buf, v)
        }
        ApiKey::DescribeCluster => DescribeClusterRequest::default()
            .with_include_cluster_authorized_operations(true)
            .with_endpoint_type(if v >= 1 { 2 } else { 1 })
            .encode(&mut buf, v),
        ApiKey::WriteTxnMarkers => WriteTxnMarkersRequest::default()
            .with_markers(vec![write_txn_markers_request::WritableTxnMarker::default()
                .with_producer_id(ProducerId(7))
                .with_producer_epoch(2)
                .with_transaction_result(true)
                .with_topics(vec![write_txn_markers_request::WritableTxnMarkerTopic::default()
                    .with_name(name())
                    .with_partition_indexes(vec![0, 3])])
                .with_coordinator_epoch(5)])
            .encode(&mut buf, v),
        ApiKey::DescribeProducers => DescribeProducersRequest::default()
            .with_topics(vec![describe_producers_request::TopicRequest::default()
                .with_name(name())
                .with_partition_indexes(vec![0, 2])])
            .encode(&mut buf, v),
        ApiKey::DescribeLogDirs => DescribeLogDirsRequest::default()
            .with_topics(Some(vec![
                describe_log_dirs_request::DescribableLogDirTopic::default().with_topic(name()).with_partitions(vec![0, 2]),
                describe_log_dirs_request::DescribableLogDirTopic::default().with_topic(TopicName(s("b"))),
            ]))
            .encode(&mut buf, v),
        ApiKey::AlterReplicaLogDirs => AlterReplicaLogDirsRequest::default()
            .with_dirs(vec![
                alter_replica_log_dirs_request::AlterReplicaLogDir::default().with_path(s("/data/a")).with_topics(vec![
                    alter_replica_log_dirs_request::AlterReplicaLogDirTopic::default()
                        .with_name(name())
                        .with_partitions(vec![0, 2]),
                    alter_replica_log_dirs_request::AlterReplicaLogDirTopic::default().with_name(TopicName(s("b"))),
                ]),
                alter_replica_log_dirs_request::AlterReplicaLogDir::default().with_path(s("/data/b")),
            ])
            .encode(&mut buf, v),
        ApiKey::DescribeTopicPartitions => DescribeTopicPartitionsRequest::default()
            .with_topics(vec![
                describe_topic_partitions_request::TopicRequest::default().with_name(name()),
                describe_topic_partitions_request::TopicRequest::default().with_name(TopicName(s("b"))),
            ])
            .with_response_partition_limit(2)
            .with_cursor(Some(
                describe_topic_partitions_request::Cursor::default().with_topic_name(name()).with_partition_index(3),
            ))
            .encode(&mut buf, v),
        ApiKey::ListConfigResources => ListConfigResourcesRequest::default()
            .with_resource_types(if v >= 1 { vec![2, 4] } else { Vec::new() })
            .encode(&mut buf, v),
        ApiKey::UpdateFeatures => UpdateFeaturesRequest::default()
            .with_timeout_ms(1000)
            .with_feature_updates(vec![
                update_features_request::FeatureUpdateKey::default().with_feature(s("f")).with_max_version_level(2),
                update_features_request::FeatureUpdateKey::default()
                    .with_feature(s("g"))
                    .with_allow_downgrade(v == 0)
                    .with_upgrade_type(if v >= 1 { 2 } else { 1 }),
            ])
            .with_validate_only(v >= 1)
            .encode(&mut buf, v),
        ApiKey::OffsetDelete => OffsetDeleteRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_topics(vec![offset_delete_request::OffsetDeleteRequestTopic::default()
                .with_name(name())
                .with_partitions(vec![offset_delete_request::OffsetDeleteRequestPartition::default().with_partition_index(3)])])
            .encode(&mut buf, v),
        ApiKey::DeleteRecords => DeleteRecordsRequest::default()
            .with_topics(vec![delete_records_request::DeleteRecordsTopic::default().with_name(name()).with_partitions(vec![
                delete_records_request::DeleteRecordsPartition::default().with_partition_index(1).with_offset(42),
            ])])
            .with_timeout_ms(30_000)
            .encode(&mut buf, v),
        ApiKey::AlterPartitionReassignments => AlterPartitionReassignmentsRequest::default()
            .with_timeout_ms(30_000)
            .with_topics(vec![alter_partition_reassignments_request::ReassignableTopic::default()
                .with_name(name())
                .with_partitions(vec![
                    alter_partition_reassignments_request::ReassignablePartition::default()
                        .with_partition_index(1)
                        .with_replicas(Some(vec![BrokerId(2), BrokerId(3)])),
                    alter_partition_reassignments_request::ReassignablePartition::default().with_partition_index(2),
                ])])
            .encode(&mut buf, v),
        ApiKey::ListPartitionReassignments => ListPartitionReassignmentsRequest::default()
            .with_timeout_ms(30_000)
            .with_topics(Some(vec![
                list_partition_reassignments_request::ListPartitionReassignmentsTopics::default()
                    .with_name(name())
                    .with_partition_indexes(vec![0, 1]),
                list_partition_reassignments_request::ListPartitionReassignmentsTopics::default().with_name(name()),
            ]))
            .encode(&mut buf, v),
        ApiKey::CreatePartitions => CreatePartitionsRequest::default()
            .with_topics(vec![
                create_partitions_request::CreatePartitionsTopic::default()
                    .with_name(name())
                    .with_count(4)
                    .with_assignments(Some(vec![create_partitions_request::CreatePartitionsAssignment::default()
                        .with_broker_ids(vec![BrokerId(1), BrokerId(2)])])),
                create_partitions_request::CreatePartitionsTopic::default().with_name(name()).with_count(2),
            ])
            .with_timeout_ms(30_000)
            .with_validate_only(true)
            .encode(&mut buf, v),
        ApiKey::AddPartitionsToTxn if v >= 4 => AddPartitionsToTxnRequest::default()
            .with_transactions(vec![
                add_partitions_to_txn_request::AddPartitionsToTxnTransaction::default()
                    .with_transactional_id(TransactionalId(s("tx")))
                    .with_producer_id(ProducerId(7))
                    .with_verify_only(true)
                    .with_topics(vec![add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
                        .with_name(name())
                        .with_partitions(vec![0, 1])]),
                add_partitions_to_txn_request::AddPartitionsToTxnTransaction::default()
                    .with_transactional_id(TransactionalId(s("ty"))),
            ])
            .encode(&mut buf, v),
        ApiKey::AddPartitionsToTxn => AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(s("tx")))
            .with_v3_and_below_producer_id(ProducerId(7))
            .with_v3_and_below_topics(vec![
                add_partitions_to_txn_request::AddPartitionsToTxnTopic::default().with_name(name()).with_partitions(vec![0, 1]),
                add_partitions_to_txn_request::AddPartitionsToTxnTopic::default().with_name(name()),
            ])
            .encode(&mut buf, v),
        ApiKey::AddOffsetsToTxn => AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(s("tx")))
            .with_producer_id(ProducerId(7))
            .with_group_id(GroupId(s("g")))
            .encode(&mut buf, v),
        ApiKey::EndTxn => EndTxnRequest::default()
            .with_transactional_id(TransactionalId(s("tx")))
            .with_producer_id(ProducerId(7))
            .with_committed(true)
            .encode(&mut buf, v),
        ApiKey::TxnOffsetCommit => TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(s("tx")))
            .with_group_id(GroupId(s("g")))
            .with_producer_id(ProducerId(7))
            .with_member_id(if v >= 3 { s("m") } else { s("") })
            .with_group_instance_id(if v >= 3 { Some(s("i")) } else { None })
            .with_topics(vec![txn_offset_commit_request::TxnOffsetCommitRequestTopic::default()
                .with_name(name())
                .with_partitions(vec![
                    txn_offset_commit_request::TxnOffsetCommitRequestPartition::default()
                        .with_partition_index(1)
                        .with_committed_offset(5)
                        .with_committed_metadata(Some(s("meta"))),
                    txn_offset_commit_request::TxnOffsetCommitRequestPartition::default(),
                ])])
            .encode(&mut buf, v),
        ApiKey::DescribeTransactions => DescribeTransactionsRequest::default()
            .with_transactional_ids(vec![TransactionalId(s("a")), TransactionalId(s("b"))])
            .encode(&mut buf, v),
        ApiKey::ListTransactions => ListTransactionsRequest::default()
            .with_state_filters(vec![s("Ongoing")])
            .with_producer_id_filters(vec![ProducerId(1), ProducerId(2)])
            .with_duration_filter(if v >= 1 { 1000 } else { -1 })
            .encode(&mut buf, v),
        ApiKey::DescribeClientQuotas => DescribeClientQuotasRequest::default()
            .with_components(vec![
                describe_client_quotas_request::ComponentData::default()
                    .with_entity_type(s("user"))
                    .with_match_type(0)
                    .with_match(Some(s("alice"))),
                describe_client_quotas_request::ComponentData::default().with_entity_type(s("client-id")).with_match_type(1),
            ])
            .with_strict(true)
            .encode(&mut buf, v),
        ApiKey::AlterClientQuotas => AlterClientQuotasRequest::default()
            .with_entries(vec![alter_client_quotas_request::EntryData::default()
                .with_entity(vec![
                    alter_client_quotas_request::EntityData::default().with_entity_type(s("user")).with_entity_name(Some(s("a"))),
                    alter_client_quotas_request::EntityData::default().with_entity_type(s("client-id")),
                ])
                .with_ops(vec![alter_client_quotas_request::OpData::default()
                    .with_key(s("producer_byte_rate"))
                    .with_value(1024.0)
                    .with_remove(false)])])
            .with_validate_only(true)
            .encode(&mut buf, v),
        other => panic!("no sample for {other:?}"),
    };
    result.unwrap_or_else(|e| panic!("{key:?} v{v} does not encode: {e}"));
    buf.to_vec()
}

#[test]
fn accepts_what_the_codec_encodes_for_every_advertised_version() {
    for &(key, min, max) in SUPPORTED_APIS {
        let min = if key == ApiKey::Produce { *LEGACY_PRODUCE.end() + 1 } else { min };
        for v in min..=max {
            let body = sample(key, v);
            assert!(check_body(key, v, &body).is_ok(), "{key:?} v{v}");
            // Every strict prefix ends inside some field.
            for cut in 0..body.len() {
                assert!(check_body(key, v, &body[..cut]).is_err(), "{key:?} v{v} prefix of {cut} bytes");
            }
        }
    }
}

#[test]
fn counts_elements_and_refuses_more_than_a_million() {
    // Metadata v1: `n` empty topic names, two bytes each.
    let names = |n: i32| {
        let mut body = n.to_be_bytes().to_vec();
        body.resize(4 + 2 * n as usize, 0);
        body
    };
    assert_eq!(check_body(ApiKey::Metadata, 1, &names(3)), Ok(3));
    assert_eq!(check_body(ApiKey::Metadata, 1, &names(1_000_000)), Ok(MAX_REQUEST_ELEMENTS));
    assert!(check_body(ApiKey::Metadata, 1, &names(1_000_001)).is_err());
    // Tagged fields count too (Metadata v9: no topics, then 1,000,001 empty tagged fields).
    let mut body = vec![0x00, 0x01, 0x00, 0x00]; // null topics, auto-create, two flags
    let mut count = 1_000_001u32;
    while count >= 0x80 {
        body.push((count as u8) | 0x80);
        count >>= 7;
    }
    body.push(count as u8);
    body.resize(body.len() + 2 * 1_000_001, 0); // each: tag 0, size 0
    assert!(check_body(ApiKey::Metadata, 9, &body).is_err());
}

#[test]
fn refuses_arrays_longer_than_the_request() {
    // Metadata v1: a topics array of 2^31-1 elements in a 4-byte body.
    assert!(check_body(ApiKey::Metadata, 1, &i32::MAX.to_be_bytes()).is_err());
    // Flexible: a compact array count of u32::MAX - 1.
    assert!(check_body(ApiKey::Metadata, 9, &[0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
    assert!(check_body(ApiKey::Metadata, 1, &(-2i32).to_be_bytes()).is_err());
    assert!(check_body(ApiKey::Metadata, 1, &(-1i32).to_be_bytes()).is_ok(), "null means all topics");
    // AlterConfigs v0: one topic resource whose configs array claims 2^31-1 entries.
    let mut body = 1i32.to_be_bytes().to_vec();
    body.push(2);
    body.extend(1i16.to_be_bytes());
    body.push(b't');
    body.extend(i32::MAX.to_be_bytes());
    body.push(0);
    assert_eq!(check_body(ApiKey::AlterConfigs, 0, &body), Err("array claims more elements than the message has bytes"));
    // IncrementalAlterConfigs v1 (flexible): a compact resources count of u32::MAX - 1.
    assert!(check_body(ApiKey::IncrementalAlterConfigs, 1, &[0xff, 0xff, 0xff, 0xff, 0x0f, 0]).is_err());
}
