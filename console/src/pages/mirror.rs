//! `/ui/mirror`: what `fjord mirror` leaves in this cluster, so the page works without any
//! configuration:
//! - its consumer groups: on a source cluster the group whose committed offsets are the
//!   mirror's positions (`fjord-mirror`, `--group`, or any group whose members are the
//!   mirror's consumers), with the lag per source partition (log end minus position); on
//!   the target cluster, with exactly-once, the group `<group>.<alias>` holding each
//!   source's positions (the source's log end is not here, so no lag);
//! - the gaps it recorded in `_mirror_gaps`: source offsets retention deleted before
//!   they were copied;
//! - with the mirror's metrics address configured (`mirror_url`), its own status: each
//!   source's state, last error and counts, the lag as the mirror sees it, and the
//!   partitions it holds because the target refuses the record at their position.

use std::sync::Arc;

use axum::extract::State;
use axum::Extension;
use fjord_audit::{GapRecord, GAPS_TOPIC};
use fjord_auth::{Operation, Resource};
use fjord_client::GroupDescription;
use maud::{html, Markup};

use crate::brokers::{lag, Browse, GroupLag, Start};
use crate::layout::{self, count, enc, error_box, time, Nav, BASE};
use crate::{Caller, Console, Error, Result};

/// The mirror's default group (`fjord mirror --group`).
pub(crate) const DEFAULT_GROUP: &str = "fjord-mirror";
/// The client id of the mirror's consumers (and producer).
const MIRROR_CLIENT_ID: &str = "fjord-mirror";
/// Newest gap records shown.
const MAX_GAPS: usize = 500;

/// What a mirror group holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MirrorGroup {
    /// The group in a source cluster: its offsets are positions in this cluster's topics.
    Source,
    /// The group in the target cluster holding source `alias`'s positions (exactly once).
    Target { alias: String },
}

/// Whether group `id` belongs to a mirror: named as one of `bases` (the mirror groups), a
/// base's target group `<base>.<alias>`, or with a member that is the mirror's consumer.
pub(crate) fn classify(id: &str, description: Option<&GroupDescription>, bases: &[String]) -> Option<MirrorGroup> {
    if bases.iter().any(|b| b == id) {
        return Some(MirrorGroup::Source);
    }
    for base in bases {
        if let Some(alias) = id.strip_prefix(base.as_str()).and_then(|rest| rest.strip_prefix('.')) {
            if !alias.is_empty() {
                return Some(MirrorGroup::Target { alias: alias.to_string() });
            }
        }
    }
    description.is_some_and(|d| d.members.iter().any(|m| m.client_id == MIRROR_CLIENT_ID)).then_some(MirrorGroup::Source)
}

/// The mirror groups the caller may describe, with their offsets and lag.
async fn groups(c: &Console, caller: &Caller) -> Result<Vec<(String, MirrorGroup, Result<GroupLag>)>> {
    let mut bases = vec![DEFAULT_GROUP.to_string()];
    bases.extend(c.config.mirror_groups.iter().cloned());
    let ids: Vec<String> = c
        .brokers
        .list_groups()
        .await?
        .into_iter()
        .map(|(g, _)| g)
        .filter(|g| caller.may(c, Operation::Describe, Resource::group(g)))
        .collect();
    let mut out = Vec::new();
    for (id, lag) in c.brokers.groups_lag(&ids, true).await? {
        let kind = match &lag {
            Ok(l) => classify(&id, l.description.as_ref(), &bases),
            Err(_) => classify(&id, None, &bases),
        };
        if let Some(kind) = kind {
            let lag = lag.map(|mut l| {
                l.partitions.retain(|(tp, _, _)| caller.may(c, Operation::Describe, Resource::topic(&tp.topic)));
                l
            });
            out.push((id, kind, lag));
        }
    }
    Ok(out)
}

/// The newest gap records of `_mirror_gaps` (none when the topic does not exist).
async fn gaps(c: &Console, caller: &Caller) -> Result<Vec<GapRecord>> {
    caller.check(c, Operation::Read, Resource::topic(GAPS_TOPIC))?;
    let meta = match c.brokers.topic(GAPS_TOPIC).await {
        Err(Error::NotFound { .. }) => return Ok(Vec::new()),
        other => other?,
    };
    let row = c.brokers.with_offsets(&[meta]).await?.pop().expect("one topic asked");
    let browse = Browse { partition: None, start: Start::Newest, limit: MAX_GAPS };
    let records = c.brokers.browse(&row, &browse).await?;
    Ok(records.iter().filter_map(|r| serde_json::from_slice::<GapRecord>(r.value.as_deref()?).ok()).collect())
}

fn group_section(id: &str, kind: &MirrorGroup, lag_or_error: &Result<GroupLag>) -> Markup {
    html! {
        section.mirror-group {
            h3 { a href={ (BASE) "/groups/" (enc(id)) } { (id) } }
            @match lag_or_error {
                Err(e) => (error_box(&e.to_string())),
                Ok(g) => {
                    @let members: Vec<&str> = g.description.iter().flat_map(|d| d.members.iter()).map(|m| m.client_host.as_str()).collect();
                    @match kind {
                        MirrorGroup::Source => p.summary {
                            "Positions of a mirror reading this cluster · state " (g.state)
                            ", " (members.len()) " members"
                            @if !members.is_empty() { " (" (members.join(", ")) ")" }
                            " · total lag " strong.total-lag { (count(g.total_lag())) }
                        },
                        MirrorGroup::Target { alias } => p.summary {
                            "Positions in source " strong { (alias) } " of an exactly-once mirror writing to this cluster; their lag is on the source cluster's console."
                        },
                    }
                    table.mirror-lag {
                        thead { tr {
                            th { "source topic" } th.num { "partition" } th.num { "position" }
                            @if *kind == MirrorGroup::Source { th.num { "log end" } th.num { "lag" } }
                        } }
                        tbody {
                            @for (tp, committed, end) in &g.partitions {
                                tr data-tp={ (tp.topic) "/" (tp.partition) } {
                                    td { (tp.topic) }
                                    td.num { (tp.partition) }
                                    td.num { (committed) }
                                    @if *kind == MirrorGroup::Source {
                                        td.num { @if *end >= 0 { (end) } @else { "?" } }
                                        td.num.lag { (lag(*committed, *end)) }
                                    }
                                }
                            }
                        }
                    }
                    @if g.partitions.is_empty() { p { "No committed positions yet." } }
                }
            }
        }
    }
}

fn gaps_section(gaps: &Result<Vec<GapRecord>>) -> Markup {
    html! {
        h2 #gaps { "Gaps" }
        p.hint { "Source offsets deleted by the source's retention before the mirror copied them: lost, recorded in " code { (GAPS_TOPIC) } "." }
        @match gaps {
            Err(e) => (error_box(&e.to_string())),
            Ok(gaps) if gaps.is_empty() => p #no-gaps { "No gaps recorded." },
            Ok(gaps) => {
                table #gap-list {
                    thead { tr { th { "found (UTC)" } th { "source" } th { "topic" } th.num { "partition" } th.num { "first offset" } th.num { "last offset" } th.num { "records lost" } } }
                    tbody {
                        @for g in gaps {
                            tr.loss {
                                td { (time(g.detected_ms)) }
                                td { (g.source) }
                                td { (g.topic) }
                                td.num { (g.partition) }
                                td.num { (g.first_offset) }
                                td.num { (g.last_offset) }
                                td.num { (count(g.records)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The mirror's own status, from its metrics endpoint.
async fn status_section(c: &Console, caller: &Caller, url: &str) -> Markup {
    if !caller.may(c, Operation::Describe, Resource::cluster()) {
        return html! {};
    }
    let status = match tokio::time::timeout(c.config.timeout, fjord_mirror::fetch_status(url)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return html! { h2 { "Sources" } (error_box(&format!("the mirror's status could not be read: {e}"))) },
        Err(_) => {
            return html! { h2 { "Sources" } (error_box(&format!("the mirror at {url} did not answer within {:?}", c.config.timeout))) }
        }
    };
    let partitions = status.sources.iter().map(|s| s.partitions.len()).sum::<usize>();
    let held = status.sources.iter().flat_map(|s| &s.partitions).filter(|p| p.refused.is_some()).count();
    html! {
        h2 #sources { "Sources" }
        p.hint { "As the mirror at " code { (url) } " reports them." }
        table #source-list {
            thead { tr { th { "source" } th { "bootstrap" } th { "state" } th.num { "records copied" } th.num { "dead letters" } th.num { "commits" } th.num { "failures" } th { "last error" } } }
            tbody {
                @for s in &status.sources {
                    @let state = serde_json::to_value(s.state).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
                    tr.(if state == "up" { "" } else { "warn" }) {
                        td { (s.alias) }
                        td { (s.bootstrap) }
                        td { (state) }
                        td.num { (count(s.records as i64)) }
                        @if s.dead_letters > 0 { td.num.warn { (count(s.dead_letters as i64)) } } @else { td.num { "0" } }
                        td.num { (count(s.commits as i64)) }
                        td.num { (s.failures) }
                        td { (s.last_error.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
        @if held > 0 {
            p #held-partitions .warn {
                strong { (held) " held" } ": the target refuses the record at their position (too large, invalid, stamped outside its limits). "
                "Each waits there and is sent again now and then while the other partitions go on; "
                code { "--dead-letter-topic" } " would set such records aside."
            }
        }
        @if partitions > 0 {
            table #source-partitions {
                thead { tr { th { "source" } th { "topic" } th.num { "partition" } th { "target topic" } th.num { "mirrored" } th.num { "source log end" } th.num { "lag" } th { "held" } } }
                tbody {
                    @for s in &status.sources {
                        @for p in &s.partitions {
                            tr.(if p.refused.is_some() { "warn held" } else { "" }) {
                                td { (s.alias) } td { (p.topic) } td.num { (p.partition) } td { (p.target_topic) }
                                td.num { (p.mirrored) } td.num { (p.log_end) } td.num { @if let Some(l) = p.lag { (l) } @else { "?" } }
                                td.refused { (p.refused.as_deref().unwrap_or("")) }
                            }
                        }
                    }
                }
            }
        }
        @if !status.gaps.is_empty() { p { (status.gaps.len()) " gaps found since this mirror process started (listed below)." } }
    }
}

pub(crate) async fn page(State(c): State<Arc<Console>>, Extension(caller): Extension<Caller>) -> Result<Markup> {
    let (groups, gaps) = tokio::join!(groups(&c, &caller), gaps(&c, &caller));
    let groups = groups?;
    let status = match &c.config.mirror_url {
        Some(url) => Some(status_section(&c, &caller, url).await),
        None => None,
    };
    let body = html! {
        h1 { "Mirror" }
        @if let Some(s) = status { (s) }
        h2 #mirror-groups { "Positions and lag" }
        @if groups.is_empty() {
            p #no-mirror { "No mirror group in this cluster (" code { (DEFAULT_GROUP) } ", a group named in the console's "
                code { "mirror_groups" } ", or a group whose members are " code { "fjord mirror" } ")." }
        }
        @for (id, kind, lag) in &groups { (group_section(id, kind, lag)) }
        (gaps_section(&gaps))
    };
    Ok(layout::page("Mirror", Nav::Mirror, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fjord_client::MemberDescription;

    #[test]
    fn mirror_groups_are_found_by_name_or_members() {
        let bases = vec![DEFAULT_GROUP.to_string(), "eu-mirror".to_string()];
        assert_eq!(classify("fjord-mirror", None, &bases), Some(MirrorGroup::Source));
        assert_eq!(classify("eu-mirror", None, &bases), Some(MirrorGroup::Source));
        assert_eq!(classify("fjord-mirror.dc1", None, &bases), Some(MirrorGroup::Target { alias: "dc1".into() }));
        assert_eq!(classify("fjord-mirror.", None, &bases), None);
        assert_eq!(classify("fjord-mirrors", None, &bases), None);
        assert_eq!(classify("orders-app", None, &bases), None);
        let member = |client_id: &str| MemberDescription {
            member_id: "m".into(),
            group_instance_id: None,
            client_id: client_id.into(),
            client_host: "/127.0.0.1".into(),
            assignment: Vec::new(),
        };
        let d =
            |m| GroupDescription { group_id: "custom".into(), state: "Stable".into(), protocol: String::new(), members: vec![m] };
        assert_eq!(classify("custom", Some(&d(member("fjord-mirror"))), &bases), Some(MirrorGroup::Source));
        assert_eq!(classify("custom", Some(&d(member("rdkafka"))), &bases), None);
    }
}
