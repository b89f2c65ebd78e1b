//! Partition assignors: how the group leader splits the subscribed topics'
//! partitions among the members. Pure functions of the members' subscriptions.
//!
//! - [`Range`]: the 2011 paper's Algorithm 1 and Kafka's `range`: per topic, the
//!   partitions in order are cut into contiguous runs over the members sorted by id;
//!   the first `P mod C` members get one more.
//! - [`RoundRobin`]: every subscribed partition of every topic, dealt in turn.
//! - [`Sticky`]: balanced, and keeps every partition with its current owner whenever
//!   balance allows (fewer moves, fewer lost caches).
//! - [`CooperativeSticky`]: the sticky plan, but a partition that changes owner is
//!   first only taken away; its new owner gets it in the follow-up rebalance, once the
//!   old owner has committed and let go (incremental rebalance, KIP-429).
//!
//! Kafka names them `range`, `roundrobin`, `sticky` and `cooperative-sticky` in
//! JoinGroup, so mixed groups with the Java client and librdkafka agree on one.

use std::collections::{BTreeMap, BTreeSet};

/// A topic partition, as the assignors handle it.
pub type Partition = (String, i32);

/// What a member sent in JoinGroup: its subscription and what it owns now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    /// Member id.
    pub member_id: String,
    /// Subscribed topics.
    pub topics: Vec<String>,
    /// Partitions it owned in the previous generation (sticky assignors).
    pub owned: Vec<Partition>,
}

/// Member id → its assigned partitions, sorted.
pub type Assignment = BTreeMap<String, Vec<Partition>>;

/// A partition assignment strategy.
pub trait Assignor: Send + Sync {
    /// Protocol name in JoinGroup.
    fn name(&self) -> &'static str;
    /// Assigns the partitions of `partition_counts` (topic → number of partitions) to
    /// the members; every member appears in the result, maybe with nothing.
    fn assign(&self, members: &[Subscription], partition_counts: &BTreeMap<String, i32>) -> Assignment;
}

/// The assignor for a protocol name.
pub fn by_name(name: &str) -> Option<Box<dyn Assignor>> {
    Some(match name {
        "range" => Box::new(Range),
        "roundrobin" => Box::new(RoundRobin),
        "sticky" => Box::new(Sticky),
        "cooperative-sticky" => Box::new(CooperativeSticky),
        _ => return None,
    })
}

fn empty_assignment(members: &[Subscription]) -> Assignment {
    members.iter().map(|m| (m.member_id.clone(), Vec::new())).collect()
}

fn finish(mut assignment: Assignment) -> Assignment {
    for partitions in assignment.values_mut() {
        partitions.sort();
    }
    assignment
}

/// Contiguous ranges per topic (the paper's Algorithm 1).
#[derive(Debug, Clone, Copy, Default)]
pub struct Range;

impl Assignor for Range {
    fn name(&self) -> &'static str {
        "range"
    }

    fn assign(&self, members: &[Subscription], partition_counts: &BTreeMap<String, i32>) -> Assignment {
        let mut assignment = empty_assignment(members);
        for (topic, &count) in partition_counts {
            let mut consumers: Vec<&str> =
                members.iter().filter(|m| m.topics.contains(topic)).map(|m| m.member_id.as_str()).collect();
            consumers.sort_unstable();
            if consumers.is_empty() || count <= 0 {
                continue;
            }
            let (per, extra) = (count as usize / consumers.len(), count as usize % consumers.len());
            for (i, consumer) in consumers.iter().enumerate() {
                let start = i * per + i.min(extra);
                let len = per + usize::from(i < extra);
                let mine = assignment.get_mut(*consumer).expect("invariant: every member has an entry");
                mine.extend((start..start + len).map(|p| (topic.clone(), p as i32)));
            }
        }
        finish(assignment)
    }
}

/// All partitions dealt one by one over the members.
#[derive(Debug, Clone, Copy, Default)]
pub struct RoundRobin;

impl Assignor for RoundRobin {
    fn name(&self) -> &'static str {
        "roundrobin"
    }

    fn assign(&self, members: &[Subscription], partition_counts: &BTreeMap<String, i32>) -> Assignment {
        let mut assignment = empty_assignment(members);
        let mut consumers: Vec<&Subscription> = members.iter().collect();
        consumers.sort_by(|a, b| a.member_id.cmp(&b.member_id));
        if consumers.is_empty() {
            return assignment;
        }
        let mut next = 0;
        for (topic, &count) in partition_counts {
            for p in 0..count.max(0) {
                // The next member in the circle that subscribes to this topic.
                for _ in 0..consumers.len() {
                    let candidate = consumers[next % consumers.len()];
                    next += 1;
                    if candidate.topics.contains(topic) {
                        assignment.get_mut(&candidate.member_id).expect("invariant: entry").push((topic.clone(), p));
                        break;
                    }
                }
            }
        }
        finish(assignment)
    }
}

/// Balanced, keeping current ownership where balance allows.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sticky;

impl Assignor for Sticky {
    fn name(&self) -> &'static str {
        "sticky"
    }

    fn assign(&self, members: &[Subscription], partition_counts: &BTreeMap<String, i32>) -> Assignment {
        sticky_plan(members, partition_counts)
    }
}

/// Sticky, in two steps: moves are revoked first and granted in the next rebalance.
#[derive(Debug, Clone, Copy, Default)]
pub struct CooperativeSticky;

impl Assignor for CooperativeSticky {
    fn name(&self) -> &'static str {
        "cooperative-sticky"
    }

    fn assign(&self, members: &[Subscription], partition_counts: &BTreeMap<String, i32>) -> Assignment {
        let plan = sticky_plan(members, partition_counts);
        // A partition someone else owns now stays unassigned this round: its owner
        // gives it up (revocation), then rejoins, and the next plan hands it over.
        let owned_by_other =
            |member: &str, partition: &Partition| members.iter().any(|m| m.member_id != member && m.owned.contains(partition));
        let cooperative = plan.into_iter().map(|(member, ps)| {
            let keep = ps.into_iter().filter(|p| !owned_by_other(&member, p)).collect();
            (member, keep)
        });
        finish(cooperative.collect())
    }
}

/// The sticky assignment: each member's quota is the fair share (floor or ceil of
/// subscribed partitions over members); owners keep what they own up to their quota,
/// the rest goes to the least-loaded subscribed member.
fn sticky_plan(members: &[Subscription], partition_counts: &BTreeMap<String, i32>) -> Assignment {
    let mut assignment = empty_assignment(members);
    let all: Vec<Partition> = partition_counts.iter().flat_map(|(t, &n)| (0..n.max(0)).map(move |p| (t.clone(), p))).collect();
    let subscribers =
        |partition: &Partition| -> Vec<&Subscription> { members.iter().filter(|m| m.topics.contains(&partition.0)).collect() };
    let assignable = all.iter().filter(|p| !subscribers(p).is_empty()).count();
    let n = members.len().max(1);
    let (floor, extra) = (assignable / n, assignable % n);
    // Members that may hold floor+1: as many as there are leftovers, preferring
    // those that already own more.
    let mut by_owned: Vec<&Subscription> = members.iter().collect();
    by_owned.sort_by(|a, b| b.owned.len().cmp(&a.owned.len()).then(a.member_id.cmp(&b.member_id)));
    let quota: BTreeMap<&str, usize> =
        by_owned.iter().enumerate().map(|(i, m)| (m.member_id.as_str(), floor + usize::from(i < extra))).collect();
    let mut taken: BTreeSet<&Partition> = BTreeSet::new();
    // 1. Keep current ownership, within quota, if still subscribed and existing.
    for member in members {
        let mut owned: Vec<&Partition> =
            member.owned.iter().filter(|p| all.contains(p) && member.topics.contains(&p.0)).collect();
        owned.sort();
        for partition in owned {
            let mine = assignment.get_mut(&member.member_id).expect("invariant: entry");
            if mine.len() < quota[member.member_id.as_str()] && taken.insert(partition) {
                mine.push(partition.clone());
            }
        }
    }
    // 2. The rest to the least-loaded subscriber with room (ties by id).
    for partition in &all {
        if taken.contains(partition) {
            continue;
        }
        let best = subscribers(partition)
            .into_iter()
            .map(|m| (assignment[&m.member_id].len(), &m.member_id))
            .filter(|(load, id)| *load < quota[id.as_str()])
            .min()
            .or_else(|| subscribers(partition).into_iter().map(|m| (assignment[&m.member_id].len(), &m.member_id)).min());
        if let Some((_, id)) = best {
            let id = id.clone();
            assignment.get_mut(&id).expect("invariant: entry").push(partition.clone());
            taken.insert(partition);
        }
    }
    finish(assignment)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, topics: &[&str], owned: &[(&str, i32)]) -> Subscription {
        Subscription {
            member_id: id.into(),
            topics: topics.iter().map(|t| t.to_string()).collect(),
            owned: owned.iter().map(|(t, p)| (t.to_string(), *p)).collect(),
        }
    }

    fn counts(topics: &[(&str, i32)]) -> BTreeMap<String, i32> {
        topics.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    }

    fn partitions(ps: &[(&str, i32)]) -> Vec<Partition> {
        ps.iter().map(|(t, p)| (t.to_string(), *p)).collect()
    }

    /// The paper's Algorithm 1: 10 partitions over 3 consumers C1..C3 gives
    /// C1: 0..3 (4 partitions), C2: 4..6, C3: 7..9.
    #[test]
    fn range_is_the_papers_algorithm_1() {
        let members = [member("c2", &["t"], &[]), member("c1", &["t"], &[]), member("c3", &["t"], &[])];
        let a = Range.assign(&members, &counts(&[("t", 10)]));
        assert_eq!(a["c1"], partitions(&[("t", 0), ("t", 1), ("t", 2), ("t", 3)]));
        assert_eq!(a["c2"], partitions(&[("t", 4), ("t", 5), ("t", 6)]));
        assert_eq!(a["c3"], partitions(&[("t", 7), ("t", 8), ("t", 9)]));
    }

    #[test]
    fn range_works_per_topic_and_leaves_extra_members_idle() {
        let members = [member("a", &["x", "y"], &[]), member("b", &["x"], &[]), member("c", &["x", "y"], &[])];
        let a = Range.assign(&members, &counts(&[("x", 2), ("y", 3)]));
        assert_eq!(a["a"], partitions(&[("x", 0), ("y", 0), ("y", 1)]));
        assert_eq!(a["b"], partitions(&[("x", 1)]));
        assert_eq!(a["c"], partitions(&[("y", 2)]));
        let lonely = Range.assign(&[member("a", &["x"], &[])], &counts(&[("x", 0)]));
        assert_eq!(lonely["a"], vec![]);
    }

    #[test]
    fn round_robin_deals_across_topics() {
        let members = [member("a", &["x", "y"], &[]), member("b", &["x", "y"], &[])];
        let a = RoundRobin.assign(&members, &counts(&[("x", 3), ("y", 2)]));
        assert_eq!(a["a"], partitions(&[("x", 0), ("x", 2), ("y", 1)]));
        assert_eq!(a["b"], partitions(&[("x", 1), ("y", 0)]));
    }

    #[test]
    fn sticky_keeps_owners_when_a_member_joins() {
        let members = [
            member("a", &["t"], &[("t", 0), ("t", 1), ("t", 2)]),
            member("b", &["t"], &[("t", 3), ("t", 4), ("t", 5)]),
            member("c", &["t"], &[]),
        ];
        let a = Sticky.assign(&members, &counts(&[("t", 6)]));
        assert_eq!(a.values().map(Vec::len).collect::<Vec<_>>(), vec![2, 2, 2]);
        // a and b each lose one partition and keep the rest.
        assert!(a["a"].iter().all(|p| members[0].owned.contains(p)));
        assert!(a["b"].iter().all(|p| members[1].owned.contains(p)));
    }

    #[test]
    fn cooperative_sticky_revokes_before_it_reassigns() {
        let owned = [("t", 0), ("t", 1), ("t", 2), ("t", 3)];
        let first = [member("a", &["t"], &owned), member("b", &["t"], &[])];
        let round1 = CooperativeSticky.assign(&first, &counts(&[("t", 4)]));
        assert_eq!(round1["a"].len(), 2, "a keeps half");
        assert!(round1["b"].is_empty(), "b waits until a has let go");
        let second = [
            member("a", &["t"], &round1["a"].iter().map(|(t, p)| (t.as_str(), *p)).collect::<Vec<_>>()),
            member("b", &["t"], &[]),
        ];
        let round2 = CooperativeSticky.assign(&second, &counts(&[("t", 4)]));
        assert_eq!(round2["a"], round1["a"]);
        assert_eq!(round2["b"].len(), 2);
    }

    /// Every assignor: each subscribed partition goes to exactly one subscribed member,
    /// and the load differs by at most one among members with the same subscription.
    #[test]
    fn every_assignor_covers_each_partition_exactly_once_and_balances() {
        for assignor in ["range", "roundrobin", "sticky"].map(|n| by_name(n).unwrap()) {
            for consumers in 1..6 {
                for partitions in 0..14 {
                    let members: Vec<Subscription> = (0..consumers).map(|i| member(&format!("m{i}"), &["t"], &[])).collect();
                    let a = assignor.assign(&members, &counts(&[("t", partitions)]));
                    let mut all: Vec<Partition> = a.values().flatten().cloned().collect();
                    all.sort();
                    let expected: Vec<Partition> = (0..partitions).map(|p| ("t".to_string(), p)).collect();
                    assert_eq!(all, expected, "{} {consumers}x{partitions}", assignor.name());
                    let loads: Vec<usize> = a.values().map(Vec::len).collect();
                    assert!(loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 1, "{}", assignor.name());
                }
            }
        }
    }
}
