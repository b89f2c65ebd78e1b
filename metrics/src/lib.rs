//! The Prometheus text exposition format (version 0.0.4), shared by the services that
//! serve `/metrics` (the broker, the gateway, the mirror).
//!
//! Each service keeps its counters where they are counted and renders them on a scrape
//! into a `String` with these helpers, so the format's rules (a `# HELP` and `# TYPE`
//! line per family, label values escaped) are written once. A registry crate would own
//! the counters too; the services' counters are atomics and maps they already need for
//! their own status answers, so only the writing is shared.
//!
//! With the `endpoint` feature, [`endpoint`] is the HTTP(S) endpoint the broker and the
//! mirror serve their pages on, secured by the same `metrics.*` keys (TLS, Basic).

use std::fmt::{Display, Write};

#[cfg(feature = "endpoint")]
pub mod endpoint;

/// The type of a metric family (`# TYPE` line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (restarts at 0 with the process).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Cumulative `_bucket{le=...}` samples with `_sum` and `_count`.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Starts the family `name`: its `# HELP` and `# TYPE` lines. `help` is one line.
pub fn family(out: &mut String, name: &str, kind: Kind, help: &str) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {}", kind.as_str());
}

/// One sample: `name{labels} value`, or `name value` when `labels` is empty. `labels`
/// is `key="value",...` with each value passed through [`escape`].
pub fn sample(out: &mut String, name: &str, labels: &str, value: impl Display) {
    let _ = if labels.is_empty() { writeln!(out, "{name} {value}") } else { writeln!(out, "{name}{{{labels}}} {value}") };
}

/// A family and its samples, `(labels, value)` each.
pub fn samples<V: Display>(out: &mut String, name: &str, kind: Kind, help: &str, samples: impl IntoIterator<Item = (String, V)>) {
    family(out, name, kind, help);
    for (labels, value) in samples {
        sample(out, name, &labels, value);
    }
}

/// A label value with `\`, `"` and newlines escaped, as the text format wants.
pub fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_escaped_labels_follow_the_text_format() {
        let mut out = String::new();
        family(&mut out, "a_total", Kind::Counter, "As counted.");
        sample(&mut out, "a_total", "", 3);
        samples(&mut out, "b", Kind::Gauge, "Bs.", [(format!("t=\"{}\"", escape("x\"y\\z\nw")), 1.5)]);
        family(&mut out, "c_seconds", Kind::Histogram, "Cs.");
        assert_eq!(
            out,
            "# HELP a_total As counted.\n# TYPE a_total counter\na_total 3\n\
             # HELP b Bs.\n# TYPE b gauge\nb{t=\"x\\\"y\\\\z\\nw\"} 1.5\n\
             # HELP c_seconds Cs.\n# TYPE c_seconds histogram\n"
        );
    }
}
