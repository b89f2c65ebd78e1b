//! `/ui/`: brokers, the controller, partition totals, under-replicated and offline
//! partitions, how many groups there are, and produce/consume rates over the last minutes
//! (sampled by `history`), live over Server-Sent Events (`/ui/rates`).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Extension;
use fjord_auth::{Operation, Resource};
use futures::Stream;
use maud::{html, Markup, PreEscaped};

use crate::history::{RateSample, SAMPLE_INTERVAL};
use crate::layout::{self, count, Nav, BASE};
use crate::{Caller, Console, Result};

/// A live rates stream ends after this (the browser's EventSource reconnects).
const RATES_STREAM_LIFETIME: Duration = Duration::from_secs(600);

/// Produce and consume rates (records/s) of each sample, summed over the topics the caller
/// may describe.
fn visible_rates(c: &Console, caller: &Caller, samples: &[RateSample]) -> Vec<(i64, f64, f64)> {
    samples
        .iter()
        .map(|s| {
            let (mut produce, mut consume) = (0.0, 0.0);
            for (topic, rate) in &s.topics {
                if caller.may(c, Operation::Describe, Resource::topic(topic)) {
                    produce += rate.produce;
                    consume += rate.consume;
                }
            }
            (s.at_ms, produce, consume)
        })
        .collect()
}

fn rates_chart(rates: &[(i64, f64, f64)]) -> String {
    let points: Vec<(i64, Vec<u64>)> = rates.iter().map(|(at, p, c)| (*at, vec![p.round() as u64, c.round() as u64])).collect();
    layout::series_chart("records/s", &["produce", "consume"], &points)
}

/// The rates section: the latest rates and the chart, or why there are none yet.
fn rates_section(rates: &[(i64, f64, f64)]) -> Markup {
    let last = rates.last().copied();
    html! {
        h2 { "Rates" }
        p.summary #rates data-stream={ (BASE) "/rates" } {
            "Produce " strong #produce-rate { (last.map_or("-".into(), |l| format!("{:.1}", l.1))) } " records/s, consume "
            strong #consume-rate { (last.map_or("-".into(), |l| format!("{:.1}", l.2))) } " records/s"
            " (log end and committed offsets sampled every " (SAMPLE_INTERVAL.as_secs()) " s while the console is open)"
        }
        div.chart #rates-chart {
            @if rates.is_empty() { p.hint { "The first rates appear after two samples." } }
            @else { (PreEscaped(rates_chart(rates))) }
        }
    }
}

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
        (rates_section(&visible_rates(c, caller, &c.history.rates())))
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

/// The live rates: an event `rates` every sample interval,
/// `{"produce":P,"consume":C,"chart":"<svg ...>"}` (records/s over the caller's topics,
/// the chart as the page draws it), once there are two samples.
pub(crate) async fn rates_stream(
    State(c): State<Arc<Console>>,
    Extension(caller): Extension<Caller>,
) -> Sse<impl Stream<Item = std::result::Result<Event, Infallible>>> {
    let started = tokio::time::Instant::now();
    let stream = futures::stream::unfold((c, caller, true), move |(c, caller, first)| async move {
        if started.elapsed() > RATES_STREAM_LIFETIME {
            return None;
        }
        if !first {
            tokio::time::sleep(SAMPLE_INTERVAL).await;
        }
        crate::history::touch(&c);
        let rates = visible_rates(&c, &caller, &c.history.rates());
        let event = match rates.last() {
            Some((_, produce, consume)) => {
                let doc = serde_json::json!({ "produce": produce, "consume": consume, "chart": rates_chart(&rates) });
                Event::default().event("rates").data(doc.to_string())
            }
            None => Event::default().comment("no samples yet"),
        };
        Some((Ok(event), (c, caller, false)))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}
