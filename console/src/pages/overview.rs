//! `/ui/`: brokers, the controller, partition totals, under-replicated and offline
//! partitions, and how many groups and subjects there are.

use std::sync::Arc;

use axum::extract::State;
use axum::Extension;
use fjord_auth::{Operation, Resource};
use maud::{html, Markup};

use crate::layout::{self, count, Nav, BASE};
use crate::{Caller, Console, Result};

pub(crate) async fn page_handler(c: &Console, caller: &Caller) -> Result<Markup> {
    let metadata = c.brokers.metadata().await?;
    let mut brokers: Vec<(&i32, &String)> = metadata.brokers.iter().collect();
    brokers.sort();
    let visible: Vec<_> =
        metadata.topics.values().filter(|t| caller.may(c, Operation::Describe, Resource::topic(&t.name))).collect();
    let partitions: usize = visible.iter().map(|t| t.partitions.len()).sum();
    let under: Vec<(String, i32)> = visible
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| (t, p)))
        .filter(|(_, p)| p.in_sync_replicas.len() < p.replicas.len())
        .map(|(t, p)| (t.name.clone(), p.partition))
        .collect();
    let mut offline: Vec<(String, i32)> = visible
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| (t, p)))
        .filter(|(_, p)| p.leader < 0 || p.error_code != 0)
        .map(|(t, p)| (t.name.clone(), p.partition))
        .collect();
    offline.sort();
    let groups = c.brokers.list_groups().await;
    Ok(html! {
        h1 { "Cluster" }
        section.cards {
            div.card { span.n { (brokers.len()) } " brokers" }
            div.card { span.n { "broker " (metadata.controller) } " controller" }
            div.card { span.n { (count(visible.len() as i64)) } " topics" }
            div.card { span.n { (count(partitions as i64)) } " partitions" }
            div.card.(if under.is_empty() { "ok" } else { "warn" }) #under-replicated {
                span.n { (under.len()) } " under-replicated"
            }
            div.card.(if offline.is_empty() { "ok" } else { "bad" }) #offline {
                span.n { (offline.len()) } " offline"
            }
            @match &groups {
                Ok(g) => div.card { a href={ (BASE) "/groups" } { span.n { (g.len()) } " groups" } },
                Err(e) => div.card.bad { "groups: " (e.to_string()) },
            }
        }
        h2 { "Brokers" }
        table {
            thead { tr { th { "id" } th { "address" } th { "role" } } }
            tbody {
                @for (id, addr) in &brokers {
                    tr {
                        td.num { (id) }
                        td { (addr) }
                        td { @if **id == metadata.controller { "controller" } }
                    }
                }
            }
        }
        @if !under.is_empty() || !offline.is_empty() {
            h2 { "Partitions needing attention" }
            table {
                thead { tr { th { "partition" } th { "state" } } }
                tbody {
                    @for (t, p) in &offline {
                        tr.bad { td { a href={ (BASE) "/topics/" (layout::enc(t)) } { (t) "-" (p) } } td { "offline (no leader or its log is damaged)" } }
                    }
                    @for (t, p) in &under {
                        tr.warn { td { a href={ (BASE) "/topics/" (layout::enc(t)) } { (t) "-" (p) } } td { "under-replicated" } }
                    }
                }
            }
        }
    })
}

pub(crate) async fn page(State(c): State<Arc<Console>>, Extension(caller): Extension<Caller>) -> Result<Markup> {
    Ok(layout::page("Overview", Nav::Overview, page_handler(&c, &caller).await?))
}
