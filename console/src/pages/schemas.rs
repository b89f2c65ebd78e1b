//! `/ui/schemas` (subjects, their versions and compatibility level) and
//! `/ui/schemas/<subject>` (a version's schema, and a line diff against another version),
//! read from the registry's HTTP API with the caller's own credentials, so the registry
//! applies its Subject ACLs to them.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::{Extension, Form};
use futures::StreamExt;
use maud::{html, Markup};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::layout::{enc, error_box, page, Nav, BASE};
use crate::{Caller, Console, Error, Result};

/// Subjects asked about at once on the list.
const CONCURRENCY: usize = 8;
/// Lines compared by the diff; longer schemas are compared by their first lines only.
const MAX_DIFF_LINES: usize = 1000;

/// One `GET` of the registry's API as `caller`.
async fn get<T: DeserializeOwned>(c: &Console, caller: &Caller, path: &str) -> Result<T> {
    call(c, caller, path, None).await
}

/// One request to the registry's API as `caller`: a `GET`, or a `POST` of `body`.
async fn call<T: DeserializeOwned>(c: &Console, caller: &Caller, path: &str, body: Option<serde_json::Value>) -> Result<T> {
    let base = c.config.registry_url.as_deref().ok_or(Error::NoRegistry)?.trim_end_matches('/');
    let url = format!("{base}{path}");
    let failed = |reason: String| Error::Registry { url: base.to_string(), reason };
    let mut request = match body {
        Some(body) => c.http.post(&url).header("Content-Type", "application/vnd.schemaregistry.v1+json").body(body.to_string()),
        None => c.http.get(&url),
    };
    request = request.header("Accept", "application/vnd.schemaregistry.v1+json");
    if let Some(a) = &caller.authorization {
        request = request.header("Authorization", a.clone());
    }
    let response = request.send().await.map_err(|e| failed(e.to_string()))?;
    let status = response.status();
    let body = response.bytes().await.map_err(|e| failed(e.to_string()))?;
    if !status.is_success() {
        #[derive(Deserialize)]
        struct Doc {
            message: String,
        }
        let message = serde_json::from_slice::<Doc>(&body)
            .map(|d| d.message)
            .unwrap_or_else(|_| String::from_utf8_lossy(&body).into_owned());
        return Err(failed(format!("{status}: {message}")));
    }
    serde_json::from_slice(&body).map_err(|e| failed(format!("unexpected answer to {path}: {e}")))
}

#[derive(Debug, Deserialize)]
struct Compatibility {
    #[serde(rename = "compatibilityLevel", alias = "compatibility")]
    level: String,
}

#[derive(Debug, Deserialize)]
struct Version {
    id: i64,
    version: i64,
    schema: String,
}

async fn level(c: &Console, caller: &Caller, subject: &str) -> String {
    match get::<Compatibility>(c, caller, &format!("/config/{}?defaultToGlobal=true", enc(subject))).await {
        Ok(l) => l.level,
        Err(_) => "?".into(),
    }
}

pub(crate) async fn list(State(c): State<Arc<Console>>, Extension(caller): Extension<Caller>) -> Result<Markup> {
    let subjects: Vec<String> = get(&c, &caller, "/subjects").await?;
    let rows: Vec<(String, Result<Vec<i64>>, String)> = futures::stream::iter(subjects)
        .map(|s| {
            let (c, caller) = (&c, &caller);
            async move {
                let versions = get::<Vec<i64>>(c, caller, &format!("/subjects/{}/versions", enc(&s))).await;
                let level = level(c, caller, &s).await;
                (s, versions, level)
            }
        })
        .buffered(CONCURRENCY)
        .collect()
        .await;
    let global = get::<Compatibility>(&c, &caller, "/config").await.map(|l| l.level).unwrap_or_else(|_| "?".into());
    let body = html! {
        h1 { "Schemas" }
        p.summary { (rows.len()) " subjects · global compatibility " strong { (global) } }
        table #subjects {
            thead { tr { th { "subject" } th.num { "versions" } th.num { "latest" } th { "compatibility" } } }
            tbody {
                @for (s, versions, level) in &rows {
                    tr {
                        td { a href={ (BASE) "/schemas/" (enc(s)) } { (s) } }
                        @match versions {
                            Ok(v) => { td.num { (v.len()) } td.num { (v.last().copied().unwrap_or(0)) } }
                            Err(e) => td colspan="2" { (error_box(&e.to_string())) },
                        }
                        td { (level) }
                    }
                }
            }
        }
        @if rows.is_empty() { p { "No subjects registered." } }
    };
    Ok(page("Schemas", Nav::Schemas, body))
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct SubjectQuery {
    #[serde(default)]
    version: String,
    #[serde(default)]
    against: String,
}

fn pretty(schema: &str) -> String {
    serde_json::from_str::<serde_json::Value>(schema)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| schema.to_string())
}

pub(crate) async fn subject(
    State(c): State<Arc<Console>>,
    Extension(caller): Extension<Caller>,
    Path(subject): Path<String>,
    Query(q): Query<SubjectQuery>,
) -> Result<Markup> {
    subject_page(&c, &caller, &subject, &q, None).await
}

/// A candidate schema to check against the subject's latest version.
#[derive(Debug, Deserialize)]
pub(crate) struct CheckForm {
    schema: String,
}

#[derive(Debug, Deserialize)]
struct CheckAnswer {
    is_compatible: bool,
    #[serde(default)]
    messages: Vec<String>,
}

/// The result of a check, shown on the subject page.
struct Checked {
    candidate: String,
    answer: Result<CheckAnswer>,
}

pub(crate) async fn check(
    State(c): State<Arc<Console>>,
    Extension(caller): Extension<Caller>,
    Path(subject): Path<String>,
    Form(form): Form<CheckForm>,
) -> Result<Markup> {
    let body = serde_json::json!({ "schema": form.schema });
    let path = format!("/compatibility/subjects/{}/versions/latest?verbose=true", enc(&subject));
    let answer = call::<CheckAnswer>(&c, &caller, &path, Some(body)).await;
    subject_page(&c, &caller, &subject, &SubjectQuery::default(), Some(Checked { candidate: form.schema, answer })).await
}

async fn subject_page(c: &Console, caller: &Caller, subject: &str, q: &SubjectQuery, checked: Option<Checked>) -> Result<Markup> {
    let versions: Vec<i64> = get(c, caller, &format!("/subjects/{}/versions", enc(subject))).await?;
    let wanted = if q.version.trim().is_empty() { "latest".to_string() } else { enc(q.version.trim()) };
    let v: Version = get(c, caller, &format!("/subjects/{}/versions/{wanted}", enc(subject))).await?;
    let level = level(c, caller, subject).await;
    let against = match q.against.trim() {
        "" => None,
        a => Some(get::<Version>(c, caller, &format!("/subjects/{}/versions/{}", enc(subject), enc(a))).await),
    };
    let text = pretty(&v.schema);
    let body = html! {
        h1 { "Subject " span.name { (subject) } }
        p.summary { "Version " (v.version) " of " (versions.len()) " · schema id " (v.id) " · compatibility " strong { (level) } }
        form.browse method="get" action={ (BASE) "/schemas/" (enc(subject)) } {
            label { "Version "
                select name="version" {
                    @for n in versions.iter().rev() { option value=(n) selected[*n == v.version] { (n) } }
                }
            }
            label { "Compare with "
                select name="against" {
                    option value="" { "-" }
                    @for n in versions.iter().rev() { option value=(n) selected[q.against.trim() == n.to_string()] { (n) } }
                }
            }
            button type="submit" { "Show" }
        }
        @match &against {
            None => pre.schema { (text) },
            Some(Err(e)) => { (error_box(&e.to_string())) pre.schema { (text) } },
            Some(Ok(other)) => {
                p.hint { "Lines of version " (other.version) " (−) against version " (v.version) " (+)" }
                pre.diff {
                    @for (sign, line) in diff(&pretty(&other.schema), &text) {
                        @match sign {
                            '-' => del { "- " (line) "\n" },
                            '+' => ins { "+ " (line) "\n" },
                            _ => span { "  " (line) "\n" },
                        }
                    }
                }
            }
        }
        h2 #check { "Check a candidate schema" }
        p.hint { "Against the latest version, at the subject's compatibility level." }
        @if let Some(checked) = &checked {
            @match &checked.answer {
                Ok(a) if a.is_compatible => p.notice role="status" { "Compatible." },
                Ok(a) => p.error role="alert" { "Not compatible: " (a.messages.join("; ")) },
                Err(e) => (error_box(&e.to_string())),
            }
        }
        form.check method="post" action={ (BASE) "/schemas/" (enc(subject)) "/check" } {
            textarea name="schema" rows="8" cols="80" required aria-label="Candidate schema" {
                (checked.as_ref().map_or(text.as_str(), |c| c.candidate.as_str()))
            }
            button type="submit" { "Check" }
        }
    };
    Ok(page(&format!("Subject {subject}"), Nav::Schemas, body))
}

/// A line diff (longest common subsequence) of `old` and `new`: `(' ' | '-' | '+', line)`.
fn diff<'a>(old: &'a str, new: &'a str) -> Vec<(char, &'a str)> {
    let a: Vec<&str> = old.lines().take(MAX_DIFF_LINES).collect();
    let b: Vec<&str> = new.lines().take(MAX_DIFF_LINES).collect();
    // lcs[i][j]: length of the LCS of a[i..] and b[j..].
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::with_capacity(a.len() + b.len()));
    while i < a.len() && j < b.len() {
        if a[i] == b[j] {
            out.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if lcs[i + 1][j] >= lcs[i][j + 1] {
            out.push(('-', a[i]));
            i += 1;
        } else {
            out.push(('+', b[j]));
            j += 1;
        }
    }
    out.extend(a[i..].iter().map(|l| ('-', *l)));
    out.extend(b[j..].iter().map(|l| ('+', *l)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_diff() {
        let d = diff("a\nb\nc", "a\nc\nd");
        assert_eq!(d, vec![(' ', "a"), ('-', "b"), (' ', "c"), ('+', "d")]);
        assert_eq!(diff("", "x"), vec![('+', "x")]);
    }
}
