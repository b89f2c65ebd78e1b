use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, Message, StrBytes};
use uuid::Uuid;

use super::*;

/// The walk with the answers' element limit, as the client and the broker run it.
fn check_response(api: i16, v: i16, body: &[u8]) -> Walk {
    walk_answer(api, v, body, MAX_RESPONSE_ELEMENTS).map(|_| ())
}

fn walk(api: i16, v: i16, body: &[u8], max_elements: u64) -> Walk<Walker<'_>> {
    walk_answer(api, v, body, max_elements)
}

/// Each row of [`WALKED`] as the codec crate's key, checking the numeric keys' names.
fn walked() -> impl Iterator<Item = (ApiKey, i16, i16)> {
    WALKED.iter().map(|&(api, min, max)| (ApiKey::try_from(api).unwrap_or_else(|()| panic!("api {api}")), min, max))
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

fn topic(name: &str) -> TopicName {
    TopicName(s(name))
}

/// Two unknown tagged fields, for the structs of flexible versions that carry them here.
fn unknown_tags() -> BTreeMap<i32, Bytes> {
    BTreeMap::from([(90, Bytes::from_static(b"x")), (91, Bytes::from_static(&[0xff; 3]))])
}

/// An answer of API `key` at version `v`, encoded by the codec crate, with every array
/// holding two elements where the version has it (nested ones too) and nullable fields
/// set: an empty answer would walk whatever the schema said.
fn sample(key: ApiKey, v: i16) -> Vec<u8> {
    let mut buf = BytesMut::new();
    let result = match key {
        ApiKey::ApiVersions => ApiVersionsResponse::default()
            .with_api_keys(vec![
                api_versions_response::ApiVersion::default().with_api_key(0).with_min_version(3).with_max_version(9),
                api_versions_response::ApiVersion::default().with_api_key(18).with_max_version(4),
            ])
            .encode(&mut buf, v),
        ApiKey::Metadata => {
            let broker = |id: i32| {
                let broker = metadata_response::MetadataResponseBroker::default()
                    .with_node_id(BrokerId(id))
                    .with_host(s("broker.example"))
                    .with_port(9092);
                if v >= 1 {
                    broker.with_rack(Some(s("rack-a")))
                } else {
                    broker
                }
            };
            let partition = |index: i32| {
                let mut partition = metadata_response::MetadataResponsePartition::default()
                    .with_partition_index(index)
                    .with_leader_id(BrokerId(1001))
                    .with_replica_nodes(vec![BrokerId(1001), BrokerId(1002)])
                    .with_isr_nodes(vec![BrokerId(1002), BrokerId(1001)]);
                if v >= 5 {
                    partition = partition.with_offline_replicas(vec![BrokerId(1003), BrokerId(1004)]);
                }
                if v >= 7 {
                    partition = partition.with_leader_epoch(70005);
                }
                partition
            };
            let topic_of = |name: &str| {
                let mut topic = metadata_response::MetadataResponseTopic::default()
                    .with_name(Some(topic(name)))
                    .with_partitions(vec![partition(700), partition(701)]);
                if v >= 1 {
                    topic = topic.with_is_internal(true);
                }
                if v >= 8 {
                    topic = topic.with_topic_authorized_operations(0x0f);
                }
                if v >= 9 {
                    topic = topic.with_unknown_tagged_fields(unknown_tags());
                }
                if v >= 10 {
                    topic = topic.with_topic_id(Uuid::from_u128(0xabc));
                }
                topic
            };
            let mut response = MetadataResponse::default()
                .with_brokers(vec![broker(1), broker(2)])
                .with_topics(vec![topic_of("topic-a"), topic_of("topic-b")]);
            if v >= 1 {
                response = response.with_controller_id(BrokerId(1001));
            }
            if v >= 2 {
                response = response.with_cluster_id(Some(s("cluster")));
            }
            if v >= 3 {
                response = response.with_throttle_time_ms(10);
            }
            if (8..=10).contains(&v) {
                response = response.with_cluster_authorized_operations(0x0f);
            }
            response.encode(&mut buf, v)
        }
        ApiKey::Produce => {
            let partition = |index: i32| {
                let mut partition = produce_response::PartitionProduceResponse::default()
                    .with_index(index)
                    .with_base_offset(100)
                    .with_log_append_time_ms(-1);
                if v >= 5 {
                    partition = partition.with_log_start_offset(7);
                }
                if v >= 8 {
                    partition = partition
                        .with_record_errors(vec![
                            produce_response::BatchIndexAndErrorMessage::default()
                                .with_batch_index(1)
                                .with_batch_index_error_message(Some(s("bad record"))),
                            produce_response::BatchIndexAndErrorMessage::default().with_batch_index(2),
                        ])
                        .with_error_message(Some(s("invalid record")));
                }
                partition
            };
            ProduceResponse::default()
                .with_responses(vec![
                    produce_response::TopicProduceResponse::default()
                        .with_name(topic("topic-a"))
                        .with_partition_responses(vec![partition(700), partition(701)]),
                    produce_response::TopicProduceResponse::default()
                        .with_name(topic("topic-b"))
                        .with_partition_responses(vec![partition(702), partition(703)]),
                ])
                .with_throttle_time_ms(3)
                .encode(&mut buf, v)
        }
        ApiKey::Fetch => {
            let partition = |index: i32, with_everything: bool| {
                let mut partition = fetch_response::PartitionData::default()
                    .with_partition_index(index)
                    .with_high_watermark(100)
                    .with_last_stable_offset(90);
                if with_everything {
                    partition = partition
                        .with_aborted_transactions(Some(vec![
                            fetch_response::AbortedTransaction::default().with_producer_id(ProducerId(7)).with_first_offset(3),
                            fetch_response::AbortedTransaction::default().with_producer_id(ProducerId(8)).with_first_offset(4),
                        ]))
                        .with_records(Some(Bytes::from_static(b"record batches, not walked")));
                } else {
                    partition = partition.with_aborted_transactions(None).with_records(None);
                }
                if v >= 5 {
                    partition = partition.with_log_start_offset(2);
                }
                if v >= 11 {
                    partition = partition.with_preferred_read_replica(BrokerId(1002));
                }
                if v >= 12 && with_everything {
                    // Known tagged fields, which the decoder reads by their schemas.
                    partition = partition
                        .with_diverging_epoch(fetch_response::EpochEndOffset::default().with_epoch(4).with_end_offset(50))
                        .with_current_leader(
                            fetch_response::LeaderIdAndEpoch::default().with_leader_id(BrokerId(1002)).with_leader_epoch(70005),
                        )
                        .with_snapshot_id(fetch_response::SnapshotId::default().with_end_offset(9).with_epoch(1))
                        .with_unknown_tagged_fields(unknown_tags());
                }
                partition
            };
            let mut response = FetchResponse::default().with_throttle_time_ms(1).with_responses(vec![
                fetch_response::FetchableTopicResponse::default()
                    .with_topic(topic("topic-a"))
                    .with_partitions(vec![partition(700, true), partition(701, false)]),
                fetch_response::FetchableTopicResponse::default()
                    .with_topic(topic("topic-b"))
                    .with_partitions(vec![partition(700, false), partition(701, true)]),
            ]);
            if v >= 7 {
                response = response.with_error_code(0).with_session_id(12);
            }
            if v >= 12 {
                response = response.with_unknown_tagged_fields(unknown_tags());
            }
            response.encode(&mut buf, v)
        }
        ApiKey::ListOffsets => {
            let partition = |index: i32| {
                let partition = list_offsets_response::ListOffsetsPartitionResponse::default()
                    .with_partition_index(index)
                    .with_timestamp(5)
                    .with_offset(70);
                if v >= 4 {
                    partition.with_leader_epoch(70002)
                } else {
                    partition
                }
            };
            let response = ListOffsetsResponse::default().with_topics(vec![
                list_offsets_response::ListOffsetsTopicResponse::default()
                    .with_name(topic("topic-a"))
                    .with_partitions(vec![partition(700), partition(701)]),
                list_offsets_response::ListOffsetsTopicResponse::default()
                    .with_name(topic("topic-b"))
                    .with_partitions(vec![partition(700), partition(701)]),
            ]);
            if v >= 2 { response.with_throttle_time_ms(4) } else { response }.encode(&mut buf, v)
        }
        ApiKey::FindCoordinator => {
            let mut response = FindCoordinatorResponse::default()
                .with_error_code(15)
                .with_node_id(BrokerId(1002))
                .with_host(s("host"))
                .with_port(9093);
            if v >= 1 {
                response = response.with_throttle_time_ms(1).with_error_message(Some(s("not available")));
            }
            response.encode(&mut buf, v)
        }
        ApiKey::JoinGroup => {
            let member = |id: &str| {
                let member = join_group_response::JoinGroupResponseMember::default()
                    .with_member_id(s(id))
                    .with_metadata(Bytes::from_static(b"subscription"));
                if v >= 5 {
                    member.with_group_instance_id(Some(s("instance")))
                } else {
                    member
                }
            };
            let mut response = JoinGroupResponse::default()
                .with_generation_id(3)
                .with_protocol_name(Some(s("range")))
                .with_leader(s("m1"))
                .with_member_id(s("m1"))
                .with_members(vec![member("m1"), member("m2")]);
            if v >= 2 {
                response = response.with_throttle_time_ms(1);
            }
            if v >= 7 {
                response = response.with_protocol_type(Some(s("consumer")));
            }
            response.encode(&mut buf, v)
        }
        ApiKey::SyncGroup => {
            let mut response = SyncGroupResponse::default().with_assignment(Bytes::from_static(b"assignment"));
            if v >= 1 {
                response = response.with_throttle_time_ms(1);
            }
            if v >= 5 {
                response = response.with_protocol_type(Some(s("consumer"))).with_protocol_name(Some(s("range")));
            }
            response.encode(&mut buf, v)
        }
        ApiKey::Heartbeat => {
            let response = HeartbeatResponse::default().with_error_code(27);
            if v >= 1 { response.with_throttle_time_ms(1) } else { response }.encode(&mut buf, v)
        }
        ApiKey::LeaveGroup => {
            let mut response = LeaveGroupResponse::default();
            if v >= 1 {
                response = response.with_throttle_time_ms(1);
            }
            if v >= 3 {
                response = response.with_members(vec![
                    leave_group_response::MemberResponse::default()
                        .with_member_id(s("m1"))
                        .with_group_instance_id(Some(s("instance"))),
                    leave_group_response::MemberResponse::default().with_member_id(s("m2")).with_group_instance_id(None),
                ]);
            }
            response.encode(&mut buf, v)
        }
        ApiKey::OffsetCommit => {
            let partitions = || {
                vec![
                    offset_commit_response::OffsetCommitResponsePartition::default().with_partition_index(700),
                    offset_commit_response::OffsetCommitResponsePartition::default().with_partition_index(701).with_error_code(3),
                ]
            };
            let response = OffsetCommitResponse::default().with_topics(vec![
                offset_commit_response::OffsetCommitResponseTopic::default()
                    .with_name(topic("topic-a"))
                    .with_partitions(partitions()),
                offset_commit_response::OffsetCommitResponseTopic::default()
                    .with_name(topic("topic-b"))
                    .with_partitions(partitions()),
            ]);
            if v >= 3 { response.with_throttle_time_ms(1) } else { response }.encode(&mut buf, v)
        }
        ApiKey::OffsetFetch => {
            let partition = |index: i32, metadata: Option<StrBytes>| {
                let partition = offset_fetch_response::OffsetFetchResponsePartition::default()
                    .with_partition_index(index)
                    .with_committed_offset(42)
                    .with_metadata(metadata);
                if v >= 5 {
                    partition.with_committed_leader_epoch(3)
                } else {
                    partition
                }
            };
            let topic_of = |name: &str| {
                offset_fetch_response::OffsetFetchResponseTopic::default()
                    .with_name(topic(name))
                    .with_partitions(vec![partition(700, Some(s("md"))), partition(701, None)])
            };
            let mut response = OffsetFetchResponse::default().with_topics(vec![topic_of("topic-a"), topic_of("topic-b")]);
            if v >= 2 {
                response = response.with_error_code(16);
            }
            if v >= 3 {
                response = response.with_throttle_time_ms(1);
            }
            response.encode(&mut buf, v)
        }
        ApiKey::ListGroups => {
            let group = |id: &str| {
                let group =
                    list_groups_response::ListedGroup::default().with_group_id(GroupId(s(id))).with_protocol_type(s("consumer"));
                if v >= 4 {
                    group.with_group_state(s("Stable"))
                } else {
                    group
                }
            };
            let response = ListGroupsResponse::default().with_groups(vec![group("g1"), group("g2")]);
            if v >= 1 { response.with_throttle_time_ms(1) } else { response }.encode(&mut buf, v)
        }
        ApiKey::DescribeGroups => {
            let member = |id: &str| {
                let member = describe_groups_response::DescribedGroupMember::default()
                    .with_member_id(s(id))
                    .with_client_id(s("client"))
                    .with_client_host(s("/10.0.0.1"))
                    .with_member_metadata(Bytes::from_static(b"metadata"))
                    .with_member_assignment(Bytes::from_static(b"assignment"));
                if v >= 4 {
                    member.with_group_instance_id(Some(s("instance")))
                } else {
                    member
                }
            };
            let group = |id: &str| {
                let group = describe_groups_response::DescribedGroup::default()
                    .with_group_id(GroupId(s(id)))
                    .with_group_state(s("Stable"))
                    .with_protocol_type(s("consumer"))
                    .with_protocol_data(s("range"))
                    .with_members(vec![member("m1"), member("m2")]);
                if v >= 3 {
                    group.with_authorized_operations(0x0f)
                } else {
                    group
                }
            };
            let response = DescribeGroupsResponse::default().with_groups(vec![group("g1"), group("g2")]);
            if v >= 1 { response.with_throttle_time_ms(1) } else { response }.encode(&mut buf, v)
        }
        ApiKey::InitProducerId => InitProducerIdResponse::default()
            .with_throttle_time_ms(1)
            .with_producer_id(ProducerId(7))
            .with_producer_epoch(2)
            .encode(&mut buf, v),
        ApiKey::AddPartitionsToTxn => {
            let topic_of = |name: &str| {
                add_partitions_to_txn_response::AddPartitionsToTxnTopicResult::default()
                    .with_name(topic(name))
                    .with_results_by_partition(vec![
                        add_partitions_to_txn_response::AddPartitionsToTxnPartitionResult::default().with_partition_index(700),
                        add_partitions_to_txn_response::AddPartitionsToTxnPartitionResult::default()
                            .with_partition_index(701)
                            .with_partition_error_code(48),
                    ])
            };
            if v >= 4 {
                // The broker-to-broker form: results by transaction.
                let transaction = |id: &str| {
                    add_partitions_to_txn_response::AddPartitionsToTxnResult::default()
                        .with_transactional_id(TransactionalId(s(id)))
                        .with_topic_results(vec![
                            topic_of("topic-a"),
                            topic_of("topic-b").with_unknown_tagged_fields(unknown_tags()),
                        ])
                };
                AddPartitionsToTxnResponse::default()
                    .with_throttle_time_ms(1)
                    .with_error_code(51)
                    .with_results_by_transaction(vec![transaction("txn-a"), transaction("txn-b")])
                    .with_unknown_tagged_fields(unknown_tags())
                    .encode(&mut buf, v)
            } else {
                AddPartitionsToTxnResponse::default()
                    .with_throttle_time_ms(1)
                    .with_results_by_topic_v3_and_below(vec![topic_of("topic-a"), topic_of("topic-b")])
                    .encode(&mut buf, v)
            }
        }
        ApiKey::OffsetForLeaderEpoch => {
            let topic_of = |name: &str| {
                let partition = |index: i32| {
                    offset_for_leader_epoch_response::EpochEndOffset::default()
                        .with_error_code(74)
                        .with_partition(index)
                        .with_leader_epoch(70005)
                        .with_end_offset(1 << 40)
                };
                let topic = offset_for_leader_epoch_response::OffsetForLeaderTopicResult::default()
                    .with_topic(topic(name))
                    .with_partitions(vec![partition(700), partition(701)]);
                if v >= 4 {
                    topic.with_unknown_tagged_fields(unknown_tags())
                } else {
                    topic
                }
            };
            OffsetForLeaderEpochResponse::default()
                .with_throttle_time_ms(1)
                .with_topics(vec![topic_of("topic-a"), topic_of("topic-b")])
                .encode(&mut buf, v)
        }
        ApiKey::AddOffsetsToTxn => {
            AddOffsetsToTxnResponse::default().with_throttle_time_ms(1).with_error_code(47).encode(&mut buf, v)
        }
        ApiKey::EndTxn => EndTxnResponse::default().with_throttle_time_ms(1).with_error_code(48).encode(&mut buf, v),
        ApiKey::TxnOffsetCommit => {
            let topic_of = |name: &str| {
                txn_offset_commit_response::TxnOffsetCommitResponseTopic::default().with_name(topic(name)).with_partitions(vec![
                    txn_offset_commit_response::TxnOffsetCommitResponsePartition::default().with_partition_index(700),
                    txn_offset_commit_response::TxnOffsetCommitResponsePartition::default()
                        .with_partition_index(701)
                        .with_error_code(3),
                ])
            };
            TxnOffsetCommitResponse::default()
                .with_throttle_time_ms(1)
                .with_topics(vec![topic_of("topic-a"), topic_of("topic-b")])
                .encode(&mut buf, v)
        }
        ApiKey::WriteTxnMarkers => {
            let topic_of = |name: &str| {
                write_txn_markers_response::WritableTxnMarkerTopicResult::default().with_name(topic(name)).with_partitions(vec![
                    write_txn_markers_response::WritableTxnMarkerPartitionResult::default().with_partition_index(700),
                    write_txn_markers_response::WritableTxnMarkerPartitionResult::default()
                        .with_partition_index(701)
                        .with_error_code(6),
                ])
            };
            let marker = |producer: i64| {
                write_txn_markers_response::WritableTxnMarkerResult::default()
                    .with_producer_id(ProducerId(producer))
                    .with_topics(vec![topic_of("topic-a"), topic_of("topic-b")])
            };
            WriteTxnMarkersResponse::default().with_markers(vec![marker(7), marker(8)]).encode(&mut buf, v)
        }
        ApiKey::DescribeTransactions => {
            let state = |id: &str| {
                describe_transactions_response::TransactionState::default()
                    .with_transactional_id(TransactionalId(s(id)))
                    .with_transaction_state(s("Ongoing"))
                    .with_transaction_timeout_ms(60_000)
                    .with_transaction_start_time_ms(1_700_000_000_000)
                    .with_producer_id(ProducerId(7))
                    .with_producer_epoch(1)
                    .with_topics(vec![
                        describe_transactions_response::TopicData::default()
                            .with_topic(topic("topic-a"))
                            .with_partitions(vec![7001, 7002]),
                        describe_transactions_response::TopicData::default()
                            .with_topic(topic("topic-b"))
                            .with_partitions(vec![7003, 7004]),
                    ])
            };
            DescribeTransactionsResponse::default()
                .with_throttle_time_ms(1)
                .with_transaction_states(vec![state("tx-1"), state("tx-2")])
                .encode(&mut buf, v)
        }
        ApiKey::ListTransactions => {
            let state = |id: &str| {
                list_transactions_response::TransactionState::default()
                    .with_transactional_id(TransactionalId(s(id)))
                    .with_producer_id(ProducerId(7))
                    .with_transaction_state(s("Ongoing"))
            };
            ListTransactionsResponse::default()
                .with_throttle_time_ms(1)
                .with_unknown_state_filters(vec![s("Frozen"), s("Melted")])
                .with_transaction_states(vec![state("tx-1"), state("tx-2")])
                .encode(&mut buf, v)
        }
        ApiKey::DescribeProducers => {
            let producer = |id: i64| {
                describe_producers_response::ProducerState::default()
                    .with_producer_id(ProducerId(id))
                    .with_producer_epoch(1)
                    .with_last_sequence(10)
                    .with_last_timestamp(1_700_000_000_000)
                    .with_coordinator_epoch(2)
                    .with_current_txn_start_offset(40)
            };
            let partition = |index: i32| {
                describe_producers_response::PartitionResponse::default()
                    .with_partition_index(index)
                    .with_error_message(Some(s("none")))
                    .with_active_producers(vec![producer(7), producer(8)])
            };
            let topic_of = |name: &str| {
                describe_producers_response::TopicResponse::default()
                    .with_name(topic(name))
                    .with_partitions(vec![partition(700), partition(701)])
            };
            DescribeProducersResponse::default()
                .with_throttle_time_ms(1)
                .with_topics(vec![topic_of("topic-a"), topic_of("topic-b")])
                .encode(&mut buf, v)
        }
        ApiKey::CreateTopics => {
            let result = |name: &str| {
                let mut result = create_topics_response::CreatableTopicResult::default()
                    .with_name(topic(name))
                    .with_error_code(36)
                    .with_error_message(Some(s("exists")));
                if v >= 5 {
                    result = result
                        .with_num_partitions(3)
                        .with_replication_factor(2)
                        .with_configs(Some(vec![
                            create_topics_response::CreatableTopicConfigs::default()
                                .with_name(s("retention.ms"))
                                .with_value(Some(s("1000")))
                                .with_read_only(true)
                                .with_config_source(5)
                                .with_is_sensitive(true),
                            create_topics_response::CreatableTopicConfigs::default().with_name(s("secret")).with_value(None),
                        ]))
                        .with_topic_config_error_code(29); // a known tagged field
                }
                if v >= 7 {
                    result = result.with_topic_id(Uuid::from_u128(0x77));
                }
                result
            };
            CreateTopicsResponse::default()
                .with_throttle_time_ms(1)
                .with_topics(vec![result("topic-a"), result("topic-b")])
                .encode(&mut buf, v)
        }
        ApiKey::DeleteTopics => {
            let result = |name: &str| {
                let mut result =
                    delete_topics_response::DeletableTopicResult::default().with_name(Some(topic(name))).with_error_code(3);
                if v >= 5 {
                    result = result.with_error_message(Some(s("unknown topic")));
                }
                if v >= 6 {
                    result = result.with_topic_id(Uuid::from_u128(0x66));
                }
                result
            };
            DeleteTopicsResponse::default()
                .with_throttle_time_ms(1)
                .with_responses(vec![result("topic-a"), result("topic-b")])
                .encode(&mut buf, v)
        }
        ApiKey::CreatePartitions => CreatePartitionsResponse::default()
            .with_throttle_time_ms(1)
            .with_results(vec![
                create_partitions_response::CreatePartitionsTopicResult::default()
                    .with_name(topic("topic-a"))
                    .with_error_code(37)
                    .with_error_message(Some(s("invalid partitions"))),
                create_partitions_response::CreatePartitionsTopicResult::default()
                    .with_name(topic("topic-b"))
                    .with_error_message(None),
            ])
            .encode(&mut buf, v),
        ApiKey::DeleteRecords => {
            let topic_of = |name: &str| {
                delete_records_response::DeleteRecordsTopicResult::default().with_name(topic(name)).with_partitions(vec![
                    delete_records_response::DeleteRecordsPartitionResult::default()
                        .with_partition_index(700)
                        .with_low_watermark(5),
                    delete_records_response::DeleteRecordsPartitionResult::default().with_partition_index(701).with_error_code(1),
                ])
            };
            DeleteRecordsResponse::default()
                .with_throttle_time_ms(1)
                .with_topics(vec![topic_of("topic-a"), topic_of("topic-b")])
                .encode(&mut buf, v)
        }
        ApiKey::DescribeConfigs => {
            let synonym = |name: &str| {
                describe_configs_response::DescribeConfigsSynonym::default()
                    .with_name(s(name))
                    .with_value(Some(s("1000")))
                    .with_source(5)
            };
            let config = |name: &str| {
                let config = describe_configs_response::DescribeConfigsResourceResult::default()
                    .with_name(s(name))
                    .with_value(Some(s("1000")))
                    .with_read_only(true)
                    .with_config_source(1)
                    .with_is_sensitive(false)
                    .with_synonyms(vec![synonym("retention.ms"), synonym("log.retention.ms")]);
                if v >= 3 {
                    config.with_config_type(5).with_documentation(Some(s("how long to keep")))
                } else {
                    config
                }
            };
            let result = |name: &str| {
                describe_configs_response::DescribeConfigsResult::default()
                    .with_error_message(Some(s("none")))
                    .with_resource_type(2)
                    .with_resource_name(s(name))
                    .with_configs(vec![config("retention.ms"), config("cleanup.policy")])
            };
            DescribeConfigsResponse::default()
                .with_throttle_time_ms(1)
                .with_results(vec![result("topic-a"), result("topic-b")])
                .encode(&mut buf, v)
        }
        ApiKey::IncrementalAlterConfigs => {
            let result = |name: &str| {
                incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                    .with_error_code(40)
                    .with_error_message(Some(s("invalid config")))
                    .with_resource_type(2)
                    .with_resource_name(s(name))
            };
            IncrementalAlterConfigsResponse::default()
                .with_throttle_time_ms(1)
                .with_responses(vec![result("topic-a"), result("topic-b")])
                .encode(&mut buf, v)
        }
        ApiKey::DescribeLogDirs => {
            let partition = |index: i32| {
                describe_log_dirs_response::DescribeLogDirsPartition::default()
                    .with_partition_index(index)
                    .with_partition_size(1 << 20)
                    .with_offset_lag(3)
                    .with_is_future_key(true)
            };
            let topic_of = |name: &str| {
                describe_log_dirs_response::DescribeLogDirsTopic::default()
                    .with_name(topic(name))
                    .with_partitions(vec![partition(700), partition(701)])
            };
            let dir = |path: &str| {
                let dir = describe_log_dirs_response::DescribeLogDirsResult::default()
                    .with_log_dir(s(path))
                    .with_topics(vec![topic_of("topic-a"), topic_of("topic-b")]);
                if v >= 4 {
                    dir.with_total_bytes(1 << 40).with_usable_bytes(1 << 39)
                } else {
                    dir
                }
            };
            let response = DescribeLogDirsResponse::default().with_throttle_time_ms(1).with_results(vec![dir("/a"), dir("/b")]);
            if v >= 3 { response.with_error_code(0) } else { response }.encode(&mut buf, v)
        }
        ApiKey::AlterReplicaLogDirs => {
            let topic_of = |name: &str| {
                alter_replica_log_dirs_response::AlterReplicaLogDirTopicResult::default()
                    .with_topic_name(topic(name))
                    .with_partitions(vec![
                        alter_replica_log_dirs_response::AlterReplicaLogDirPartitionResult::default().with_partition_index(700),
                        alter_replica_log_dirs_response::AlterReplicaLogDirPartitionResult::default()
                            .with_partition_index(701)
                            .with_error_code(57),
                    ])
            };
            AlterReplicaLogDirsResponse::default()
                .with_throttle_time_ms(1)
                .with_results(vec![topic_of("topic-a"), topic_of("topic-b")])
                .encode(&mut buf, v)
        }
        ApiKey::AlterPartitionReassignments => {
            let topic_of = |name: &str| {
                alter_partition_reassignments_response::ReassignableTopicResponse::default()
                    .with_name(topic(name))
                    .with_partitions(vec![
                        alter_partition_reassignments_response::ReassignablePartitionResponse::default()
                            .with_partition_index(700)
                            .with_error_message(Some(s("none"))),
                        alter_partition_reassignments_response::ReassignablePartitionResponse::default()
                            .with_partition_index(701)
                            .with_error_message(None),
                    ])
            };
            AlterPartitionReassignmentsResponse::default()
                .with_throttle_time_ms(1)
                .with_error_message(Some(s("none")))
                .with_responses(vec![topic_of("topic-a"), topic_of("topic-b")])
                .encode(&mut buf, v)
        }
        ApiKey::ListPartitionReassignments => {
            let partition = |index: i32| {
                list_partition_reassignments_response::OngoingPartitionReassignment::default()
                    .with_partition_index(index)
                    .with_replicas(vec![BrokerId(1001), BrokerId(1002)])
                    .with_adding_replicas(vec![BrokerId(1003), BrokerId(1004)])
                    .with_removing_replicas(vec![BrokerId(1005), BrokerId(1006)])
            };
            let topic_of = |name: &str| {
                list_partition_reassignments_response::OngoingTopicReassignment::default()
                    .with_name(topic(name))
                    .with_partitions(vec![partition(700), partition(701)])
            };
            ListPartitionReassignmentsResponse::default()
                .with_throttle_time_ms(1)
                .with_error_message(Some(s("none")))
                .with_topics(vec![topic_of("topic-a"), topic_of("topic-b")])
                .encode(&mut buf, v)
        }
        ApiKey::DescribeClientQuotas => {
            let entity = || {
                vec![
                    describe_client_quotas_response::EntityData::default()
                        .with_entity_type(s("user"))
                        .with_entity_name(Some(s("alice"))),
                    describe_client_quotas_response::EntityData::default()
                        .with_entity_type(s("client-id"))
                        .with_entity_name(None),
                ]
            };
            let entry = || {
                describe_client_quotas_response::EntryData::default().with_entity(entity()).with_values(vec![
                    describe_client_quotas_response::ValueData::default().with_key(s("producer_byte_rate")).with_value(1024.0),
                    describe_client_quotas_response::ValueData::default().with_key(s("consumer_byte_rate")).with_value(2048.0),
                ])
            };
            DescribeClientQuotasResponse::default()
                .with_throttle_time_ms(1)
                .with_error_message(Some(s("none")))
                .with_entries(Some(vec![entry(), entry()]))
                .encode(&mut buf, v)
        }
        ApiKey::AlterClientQuotas => {
            let entry = |name: &str| {
                alter_client_quotas_response::EntryData::default().with_error_message(Some(s("none"))).with_entity(vec![
                    alter_client_quotas_response::EntityData::default()
                        .with_entity_type(s("user"))
                        .with_entity_name(Some(s(name))),
                    alter_client_quotas_response::EntityData::default().with_entity_type(s("client-id")).with_entity_name(None),
                ])
            };
            AlterClientQuotasResponse::default()
                .with_throttle_time_ms(1)
                .with_entries(vec![entry("alice"), entry("bob")])
                .encode(&mut buf, v)
        }
        ApiKey::CreateAcls => CreateAclsResponse::default()
            .with_throttle_time_ms(1)
            .with_results(vec![
                create_acls_response::AclCreationResult::default().with_error_code(31).with_error_message(Some(s("denied"))),
                create_acls_response::AclCreationResult::default().with_error_message(None),
            ])
            .encode(&mut buf, v),
        ApiKey::DescribeAcls => {
            let acl = |principal: &str| {
                describe_acls_response::AclDescription::default()
                    .with_principal(s(principal))
                    .with_host(s("*"))
                    .with_operation(3)
                    .with_permission_type(3)
            };
            let resource = |name: &str| {
                describe_acls_response::DescribeAclsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s(name))
                    .with_pattern_type(3)
                    .with_acls(vec![acl("User:alice"), acl("User:bob")])
            };
            DescribeAclsResponse::default()
                .with_throttle_time_ms(1)
                .with_error_message(Some(s("none")))
                .with_resources(vec![resource("topic-a"), resource("topic-b")])
                .encode(&mut buf, v)
        }
        ApiKey::DeleteAcls => {
            let acl = |principal: &str| {
                delete_acls_response::DeleteAclsMatchingAcl::default()
                    .with_error_message(Some(s("none")))
                    .with_resource_type(2)
                    .with_resource_name(s("topic-a"))
                    .with_pattern_type(3)
                    .with_principal(s(principal))
                    .with_host(s("*"))
                    .with_operation(3)
                    .with_permission_type(3)
            };
            let result = || {
                delete_acls_response::DeleteAclsFilterResult::default()
                    .with_error_message(Some(s("none")))
                    .with_matching_acls(vec![acl("User:alice"), acl("User:bob")])
            };
            DeleteAclsResponse::default()
                .with_throttle_time_ms(1)
                .with_filter_results(vec![result(), result()])
                .encode(&mut buf, v)
        }
        ApiKey::DescribeUserScramCredentials => {
            let result = |user: &str| {
                describe_user_scram_credentials_response::DescribeUserScramCredentialsResult::default()
                    .with_user(s(user))
                    .with_error_message(Some(s("none")))
                    .with_credential_infos(vec![
                        describe_user_scram_credentials_response::CredentialInfo::default()
                            .with_mechanism(1)
                            .with_iterations(4096),
                        describe_user_scram_credentials_response::CredentialInfo::default()
                            .with_mechanism(2)
                            .with_iterations(8192),
                    ])
            };
            DescribeUserScramCredentialsResponse::default()
                .with_throttle_time_ms(1)
                .with_error_message(Some(s("none")))
                .with_results(vec![result("alice"), result("bob")])
                .encode(&mut buf, v)
        }
        ApiKey::AlterUserScramCredentials => AlterUserScramCredentialsResponse::default()
            .with_throttle_time_ms(1)
            .with_results(vec![
                alter_user_scram_credentials_response::AlterUserScramCredentialsResult::default()
                    .with_user(s("alice"))
                    .with_error_message(Some(s("none"))),
                alter_user_scram_credentials_response::AlterUserScramCredentialsResult::default().with_user(s("bob")),
            ])
            .encode(&mut buf, v),
        ApiKey::SaslHandshake => {
            SaslHandshakeResponse::default().with_mechanisms(vec![s("PLAIN"), s("SCRAM-SHA-256")]).encode(&mut buf, v)
        }
        ApiKey::SaslAuthenticate => {
            let response = SaslAuthenticateResponse::default()
                .with_error_message(Some(s("none")))
                .with_auth_bytes(Bytes::from_static(b"r=abc,s=salt,i=4096"));
            if v >= 1 { response.with_session_lifetime_ms(3_600_000) } else { response }.encode(&mut buf, v)
        }
        other => panic!("no sample for {other:?}"),
    };
    result.unwrap_or_else(|e| panic!("{key:?} v{v} does not encode: {e}"));
    buf.to_vec()
}

/// The codec crate's version range of each API's requests (neither the client nor the
/// broker sends below its lowest), to check [`WALKED`] against.
fn codec_versions(key: ApiKey) -> (i16, i16) {
    macro_rules! versions {
        ($($api:ident => $request:ty,)*) => {
            match key {
                $(ApiKey::$api => (<$request as Message>::VERSIONS.min, <$request as Message>::VERSIONS.max),)*
                other => panic!("{other:?} is not walked"),
            }
        };
    }
    versions! {
        ApiVersions => ApiVersionsRequest,
        Metadata => MetadataRequest,
        Produce => ProduceRequest,
        Fetch => FetchRequest,
        ListOffsets => ListOffsetsRequest,
        FindCoordinator => FindCoordinatorRequest,
        JoinGroup => JoinGroupRequest,
        SyncGroup => SyncGroupRequest,
        Heartbeat => HeartbeatRequest,
        LeaveGroup => LeaveGroupRequest,
        OffsetCommit => OffsetCommitRequest,
        OffsetFetch => OffsetFetchRequest,
        ListGroups => ListGroupsRequest,
        DescribeGroups => DescribeGroupsRequest,
        InitProducerId => InitProducerIdRequest,
        AddPartitionsToTxn => AddPartitionsToTxnRequest,
        AddOffsetsToTxn => AddOffsetsToTxnRequest,
        EndTxn => EndTxnRequest,
        TxnOffsetCommit => TxnOffsetCommitRequest,
        WriteTxnMarkers => WriteTxnMarkersRequest,
        DescribeTransactions => DescribeTransactionsRequest,
        ListTransactions => ListTransactionsRequest,
        DescribeProducers => DescribeProducersRequest,
        CreateTopics => CreateTopicsRequest,
        DeleteTopics => DeleteTopicsRequest,
        CreatePartitions => CreatePartitionsRequest,
        DeleteRecords => DeleteRecordsRequest,
        DescribeConfigs => DescribeConfigsRequest,
        IncrementalAlterConfigs => IncrementalAlterConfigsRequest,
        DescribeLogDirs => DescribeLogDirsRequest,
        AlterReplicaLogDirs => AlterReplicaLogDirsRequest,
        AlterPartitionReassignments => AlterPartitionReassignmentsRequest,
        ListPartitionReassignments => ListPartitionReassignmentsRequest,
        DescribeClientQuotas => DescribeClientQuotasRequest,
        AlterClientQuotas => AlterClientQuotasRequest,
        CreateAcls => CreateAclsRequest,
        DescribeAcls => DescribeAclsRequest,
        DeleteAcls => DeleteAclsRequest,
        DescribeUserScramCredentials => DescribeUserScramCredentialsRequest,
        AlterUserScramCredentials => AlterUserScramCredentialsRequest,
        SaslHandshake => SaslHandshakeRequest,
        SaslAuthenticate => SaslAuthenticateRequest,
        OffsetForLeaderEpoch => OffsetForLeaderEpochRequest,
    }
}

#[test]
fn the_numeric_keys_are_the_codecs() {
    let named = [
        (key::PRODUCE, ApiKey::Produce),
        (key::FETCH, ApiKey::Fetch),
        (key::LIST_OFFSETS, ApiKey::ListOffsets),
        (key::METADATA, ApiKey::Metadata),
        (key::OFFSET_COMMIT, ApiKey::OffsetCommit),
        (key::OFFSET_FETCH, ApiKey::OffsetFetch),
        (key::FIND_COORDINATOR, ApiKey::FindCoordinator),
        (key::JOIN_GROUP, ApiKey::JoinGroup),
        (key::HEARTBEAT, ApiKey::Heartbeat),
        (key::LEAVE_GROUP, ApiKey::LeaveGroup),
        (key::SYNC_GROUP, ApiKey::SyncGroup),
        (key::DESCRIBE_GROUPS, ApiKey::DescribeGroups),
        (key::LIST_GROUPS, ApiKey::ListGroups),
        (key::SASL_HANDSHAKE, ApiKey::SaslHandshake),
        (key::API_VERSIONS, ApiKey::ApiVersions),
        (key::CREATE_TOPICS, ApiKey::CreateTopics),
        (key::DELETE_TOPICS, ApiKey::DeleteTopics),
        (key::DELETE_RECORDS, ApiKey::DeleteRecords),
        (key::INIT_PRODUCER_ID, ApiKey::InitProducerId),
        (key::OFFSET_FOR_LEADER_EPOCH, ApiKey::OffsetForLeaderEpoch),
        (key::ADD_PARTITIONS_TO_TXN, ApiKey::AddPartitionsToTxn),
        (key::ADD_OFFSETS_TO_TXN, ApiKey::AddOffsetsToTxn),
        (key::END_TXN, ApiKey::EndTxn),
        (key::WRITE_TXN_MARKERS, ApiKey::WriteTxnMarkers),
        (key::TXN_OFFSET_COMMIT, ApiKey::TxnOffsetCommit),
        (key::DESCRIBE_ACLS, ApiKey::DescribeAcls),
        (key::CREATE_ACLS, ApiKey::CreateAcls),
        (key::DELETE_ACLS, ApiKey::DeleteAcls),
        (key::DESCRIBE_CONFIGS, ApiKey::DescribeConfigs),
        (key::ALTER_REPLICA_LOG_DIRS, ApiKey::AlterReplicaLogDirs),
        (key::DESCRIBE_LOG_DIRS, ApiKey::DescribeLogDirs),
        (key::SASL_AUTHENTICATE, ApiKey::SaslAuthenticate),
        (key::CREATE_PARTITIONS, ApiKey::CreatePartitions),
        (key::INCREMENTAL_ALTER_CONFIGS, ApiKey::IncrementalAlterConfigs),
        (key::ALTER_PARTITION_REASSIGNMENTS, ApiKey::AlterPartitionReassignments),
        (key::LIST_PARTITION_REASSIGNMENTS, ApiKey::ListPartitionReassignments),
        (key::DESCRIBE_CLIENT_QUOTAS, ApiKey::DescribeClientQuotas),
        (key::ALTER_CLIENT_QUOTAS, ApiKey::AlterClientQuotas),
        (key::DESCRIBE_USER_SCRAM_CREDENTIALS, ApiKey::DescribeUserScramCredentials),
        (key::ALTER_USER_SCRAM_CREDENTIALS, ApiKey::AlterUserScramCredentials),
        (key::DESCRIBE_PRODUCERS, ApiKey::DescribeProducers),
        (key::DESCRIBE_TRANSACTIONS, ApiKey::DescribeTransactions),
        (key::LIST_TRANSACTIONS, ApiKey::ListTransactions),
    ];
    for (number, key) in named {
        assert_eq!(number, key as i16, "{key:?}");
    }
    assert_eq!(named.len(), WALKED.len(), "one name per walked API");
}

#[test]
fn walked_versions_start_at_the_codecs_lowest() {
    assert_eq!(WALKED.len(), 43, "one row per API the client or a broker's peer connection sends");
    for (key, min, max) in walked() {
        let (codec_min, codec_max) = codec_versions(key);
        assert_eq!(min, codec_min, "{key:?}: the client may send any version from the codec's lowest");
        assert!(min <= max && max <= codec_max, "{key:?} v{min}..=v{max}");
    }
}

#[test]
fn walks_every_answer_the_client_or_a_peer_may_receive_to_its_last_byte() {
    for (key, min, max) in walked() {
        for v in min..=max {
            let body = sample(key, v);
            let walker = walk(key as i16, v, &body, MAX_RESPONSE_ELEMENTS).unwrap_or_else(|e| panic!("{key:?} v{v}: {e}"));
            assert_eq!(walker.remaining(), 0, "{key:?} v{v} walked short of its end");
            let without_arrays = matches!(
                key,
                ApiKey::FindCoordinator
                    | ApiKey::SyncGroup
                    | ApiKey::Heartbeat
                    | ApiKey::InitProducerId
                    | ApiKey::AddOffsetsToTxn
                    | ApiKey::EndTxn
                    | ApiKey::SaslAuthenticate
            ) || (key == ApiKey::LeaveGroup && v < 3);
            assert_eq!(walker.elements() >= 2, !without_arrays, "{key:?} v{v}: the sample fills its arrays");
            // Every strict prefix ends inside some field.
            for cut in 0..body.len() {
                assert!(walk(key as i16, v, &body[..cut], MAX_RESPONSE_ELEMENTS).is_err(), "{key:?} v{v} prefix of {cut} bytes");
            }
        }
    }
}

#[test]
fn the_samples_decode_as_the_codec_reads_them() {
    // A sanity check of the test itself: the samples are answers the codec accepts whole.
    fn decodes<R: Decodable>(body: Vec<u8>, v: i16) -> usize {
        let mut bytes = Bytes::from(body);
        R::decode(&mut bytes, v).unwrap_or_else(|e| panic!("v{v}: {e}"));
        bytes.len()
    }
    for v in 0..=12 {
        assert_eq!(decodes::<MetadataResponse>(sample(ApiKey::Metadata, v), v), 0);
    }
    for v in 4..=12 {
        assert_eq!(decodes::<FetchResponse>(sample(ApiKey::Fetch, v), v), 0);
    }
    for v in 2..=7 {
        assert_eq!(decodes::<CreateTopicsResponse>(sample(ApiKey::CreateTopics, v), v), 0);
    }
    for v in 0..=5 {
        assert_eq!(decodes::<AddPartitionsToTxnResponse>(sample(ApiKey::AddPartitionsToTxn, v), v), 0);
    }
    for v in 2..=4 {
        assert_eq!(decodes::<OffsetForLeaderEpochResponse>(sample(ApiKey::OffsetForLeaderEpoch, v), v), 0);
    }
}

#[test]
fn refuses_arrays_longer_than_the_answer() {
    let refused = Err("array claims more elements than the message has bytes");
    // ApiVersions v0: an error code, then api keys claiming 2^31-1 entries.
    let mut body = 0i16.to_be_bytes().to_vec();
    body.extend(i32::MAX.to_be_bytes());
    assert_eq!(check_response(ApiKey::ApiVersions as i16, 0, &body), refused);
    // Metadata v1: no brokers, a controller, then one topic whose partitions claim 2^31-1.
    let mut body = 0i32.to_be_bytes().to_vec();
    body.extend(1i32.to_be_bytes()); // controller id
    body.extend(1i32.to_be_bytes()); // one topic
    body.extend([0, 0, 0, 1, b't', 0]); // error code, name, is internal
    body.extend(i32::MAX.to_be_bytes());
    body.extend([0; 16]);
    assert_eq!(check_response(ApiKey::Metadata as i16, 1, &body), refused);
    // Metadata v12 (flexible): a throttle time, then a compact brokers count of u32::MAX - 1.
    let body = [0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0];
    assert_eq!(check_response(ApiKey::Metadata as i16, 12, &body), refused);
    // A negative count other than null.
    let mut body = 0i16.to_be_bytes().to_vec();
    body.extend((-2i32).to_be_bytes());
    assert_eq!(check_response(ApiKey::ApiVersions as i16, 0, &body), Err("negative array length"));
}

#[test]
fn refuses_a_known_tagged_field_whose_size_disagrees_with_its_value() {
    // Fetch v12 with one partition carrying tag 1 (the current leader: two int32s and an
    // empty tag section, 9 bytes) declared as 10 bytes: the decoder would read 9 and then
    // take the tenth byte for the next tag, out of step with the walk.
    let v = 12;
    let partition = fetch_response::PartitionData::default()
        .with_current_leader(fetch_response::LeaderIdAndEpoch::default().with_leader_id(BrokerId(2)).with_leader_epoch(5));
    let mut buf = BytesMut::new();
    FetchResponse::default()
        .with_responses(vec![fetch_response::FetchableTopicResponse::default()
            .with_topic(topic("t"))
            .with_partitions(vec![partition])])
        .encode(&mut buf, v)
        .unwrap();
    let body = buf.to_vec();
    assert_eq!(check_response(ApiKey::Fetch as i16, v, &body), Ok(()));
    // The partition's tag section is "1 tag, tag 1, size 9, value"; find it and lie about the size.
    let section = [1u8, 1, 9, 0, 0, 0, 2, 0, 0, 0, 5, 0];
    let at = body.windows(section.len()).position(|w| w == section).expect("the tag section is in the answer");
    let mut lying = body[..at].to_vec();
    lying.extend([1, 1, 10, 0, 0, 0, 2, 0, 0, 0, 5, 0, 0]);
    lying.extend(&body[at + section.len()..]);
    assert_eq!(check_response(ApiKey::Fetch as i16, v, &lying), Err("tagged field's value is shorter than its declared size"));
}

#[test]
fn enforces_the_element_limit() {
    // SaslHandshake v1: `n` empty mechanism names, two bytes each.
    let names = |n: i32| {
        let mut body = 0i16.to_be_bytes().to_vec();
        body.extend(n.to_be_bytes());
        body.resize(6 + 2 * n as usize, 0);
        body
    };
    let limit = MAX_RESPONSE_ELEMENTS as i32;
    assert_eq!(check_response(ApiKey::SaslHandshake as i16, 1, &names(limit)), Ok(()));
    assert_eq!(
        check_response(ApiKey::SaslHandshake as i16, 1, &names(limit + 1)),
        Err("more array elements and tagged fields than one message may hold")
    );
    // The limit counts every array of the answer together, nested ones too.
    let body = sample(ApiKey::Metadata, 12);
    let elements = walk(ApiKey::Metadata as i16, 12, &body, MAX_RESPONSE_ELEMENTS).unwrap().elements();
    assert!(walk(ApiKey::Metadata as i16, 12, &body, elements).is_ok());
    assert!(walk(ApiKey::Metadata as i16, 12, &body, elements - 1).is_err());
}

#[test]
fn refuses_versions_and_apis_without_a_walk() {
    assert_eq!(check_response(ApiKey::Metadata as i16, 13, &[]), Err("no walk for this API version"));
    assert_eq!(check_response(ApiKey::ApiVersions as i16, 3, &[]), Err("no walk for this API version"));
    assert_eq!(check_response(ApiKey::Vote as i16, 0, &[]), Err("no walk for this API"));
    assert_eq!(check_response(i16::MAX, 0, &[]), Err("no walk for this API"));
}

#[test]
fn the_highest_walked_versions() {
    assert_eq!(highest_walked(ApiKey::Metadata as i16), Some(12));
    assert_eq!(highest_walked(ApiKey::ApiVersions as i16), Some(0));
    assert_eq!(highest_walked(ApiKey::AddPartitionsToTxn as i16), Some(5));
    assert_eq!(highest_walked(ApiKey::Vote as i16), None, "an API neither side sends");
    assert_eq!(highest_walked(i16::MAX), None);
}
