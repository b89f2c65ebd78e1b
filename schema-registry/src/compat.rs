//! Schema compatibility by Avro schema resolution (the spec's reader/writer rules).
//!
//! [`can_read`] answers "can data written with `writer` always be decoded with `reader`?"
//! exactly as Avro's resolution does it:
//! - records match by name (or a reader alias); each reader field takes the writer field of
//!   the same name (or one of the reader field's aliases), and a reader field the writer
//!   lacks needs a default; writer fields the reader lacks are skipped;
//! - promotions: int → long, float, double; long → float, double; float → double;
//!   string ↔ bytes;
//! - enums: every writer symbol must exist in the reader, unless the reader has a default;
//! - fixed: same name and size; arrays and maps: their items / values;
//! - a writer union is readable when *every* branch is; a reader union reads a non-union
//!   writer when *some* branch does;
//! - logical types are read as their underlying type (as Java Avro and Confluent do).
//!
//! Why not `apache_avro::schema_compatibility::SchemaCompatibility`: in 0.22 it compares a
//! named-type *reference* (`Schema::Ref`) only with another reference by name and reports a
//! type mismatch when one side defines a record inline and the other refers to it (a field
//! reordering or the removal of the field that first defined a type makes that happen), it
//! ignores reader aliases for named types, and it answers "partial" where Avro (and
//! Confluent) say incompatible. Run over the table in `compat/tests.rs` (55 pairs, both
//! directions) it disagrees with the expected verdict on 2 pairs when only `Full` counts as
//! compatible (a record renamed with an alias, and the removed field that defined a named
//! type) and on 14 when `Partial` counts too. This checker resolves references against the
//! named types of each schema and says which rule failed, and where.
//!
//! Cost: each pair of named types (writer, reader) is checked once and its verdict reused,
//! and a reader union is searched through an index by name and kind, so a check takes time
//! linear in the two schemas' sizes; a step bound and a nesting bound stop the rare inputs
//! that would not (see [`can_read`]). A union of 45,000 records against itself took minutes
//! of CPU before (issue #26: 8,000 branches took 4.4 s in a debug build, growing with the
//! square) and takes about 0.3 s now.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

use apache_avro::schema::{Alias, DecimalSchema, EnumSchema, FixedSchema, InnerDecimalSchema, Name, RecordSchema, UuidSchema};
use apache_avro::Schema;
use serde::{Deserialize, Serialize};

use crate::schema::SchemaLimits;
use crate::{Error, Result};

/// Confluent's compatibility levels; `Backward` is the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CompatibilityLevel {
    /// The new schema reads data written with the latest version.
    #[default]
    Backward,
    /// The new schema reads data written with every live version.
    BackwardTransitive,
    /// The latest version reads data written with the new schema.
    Forward,
    /// Every live version reads data written with the new schema.
    ForwardTransitive,
    /// Backward and forward against the latest version.
    Full,
    /// Backward and forward against every live version.
    FullTransitive,
    /// No check.
    None,
}

impl CompatibilityLevel {
    /// The name on the wire, e.g. `BACKWARD_TRANSITIVE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Backward => "BACKWARD",
            Self::BackwardTransitive => "BACKWARD_TRANSITIVE",
            Self::Forward => "FORWARD",
            Self::ForwardTransitive => "FORWARD_TRANSITIVE",
            Self::Full => "FULL",
            Self::FullTransitive => "FULL_TRANSITIVE",
            Self::None => "NONE",
        }
    }

    fn transitive(self) -> bool {
        matches!(self, Self::BackwardTransitive | Self::ForwardTransitive | Self::FullTransitive)
    }

    fn backward(self) -> bool {
        matches!(self, Self::Backward | Self::BackwardTransitive | Self::Full | Self::FullTransitive)
    }

    fn forward(self) -> bool {
        matches!(self, Self::Forward | Self::ForwardTransitive | Self::Full | Self::FullTransitive)
    }
}

impl fmt::Display for CompatibilityLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CompatibilityLevel {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        serde_json::from_value(serde_json::Value::String(s.to_ascii_uppercase()))
            .map_err(|_| Error::InvalidCompatibilityLevel(s.to_string()))
    }
}

/// Checks `new` against the subject's live versions (`previous`, newest first, each with its
/// version number) under `level`. Returns one message per failed check; empty = compatible.
/// A pair of schemas whose check would pass its bounds (see [`can_read`]) is
/// [`Error::CheckTooComplex`]. CPU-heavy for large schemas: the registry runs it off the
/// async workers.
pub fn check(level: CompatibilityLevel, new: &Schema, previous: &[(i32, &Schema)], limits: &SchemaLimits) -> Result<Vec<String>> {
    let against = if level.transitive() { previous } else { &previous[..previous.len().min(1)] };
    let mut messages = Vec::new();
    for &(version, old) in against {
        let with_version = |e: Error| match e {
            Error::CheckTooComplex { bound, unit, .. } => Error::CheckTooComplex { version, bound, unit },
            other => other,
        };
        if level.backward() {
            if let Err(e) = can_read(old, new, limits).map_err(with_version)? {
                messages.push(format!("new schema cannot read data written with version {version} (backward): {e}"));
            }
        }
        if level.forward() {
            if let Err(e) = can_read(new, old, limits).map_err(with_version)? {
                messages.push(format!("version {version} cannot read data written with the new schema (forward): {e}"));
            }
        }
    }
    Ok(messages)
}

/// Why a reader cannot read a writer: the rule that failed and where (a JSON-pointer-like
/// path into the reader schema, e.g. `/fields/address/fields/zip`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incompatibility {
    /// Java Avro's name for the failed rule, e.g. `READER_FIELD_MISSING_DEFAULT_VALUE`.
    pub rule: &'static str,
    /// Human-readable detail.
    pub detail: String,
    /// Where in the schema.
    pub path: String,
}

impl fmt::Display for Incompatibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() { "/" } else { &self.path };
        write!(f, "{}: {} at '{}'", self.rule, self.detail, path)
    }
}

/// Steps a check may take per schema node (type, field or enum symbol) of the two schemas,
/// plus a fixed allowance. Every pair of named types is checked once (memoized) and a
/// reader union is searched by name and kind instead of branch by branch, so real schemas
/// take a few steps per node; only named types of one name in many namespaces, set against
/// each other, multiply, and this bound stops them.
const STEPS_PER_NODE: usize = 64;
const STEPS_BASE: usize = 100_000;

/// Can every datum written with `writer` be decoded with `reader`? The outer `Result` is
/// [`Error::CheckTooComplex`] when the check passes its bounds (steps linear in the two
/// schemas' sizes; nesting twice [`SchemaLimits::max_depth`], which schemas within the
/// limits only reach when two recursive types wind around each other); the inner one is
/// the verdict.
pub fn can_read(writer: &Schema, reader: &Schema, limits: &SchemaLimits) -> Result<Result<(), Incompatibility>> {
    let nodes = node_count(writer).saturating_add(node_count(reader));
    let mut checker = Checker {
        writer_names: names(writer),
        reader_names: names(reader),
        verdicts: HashMap::new(),
        ok_log: Vec::new(),
        in_progress: HashSet::new(),
        unions: HashMap::new(),
        steps: 0,
        budget: STEPS_PER_NODE.saturating_mul(nodes).saturating_add(STEPS_BASE),
        max_depth: limits.max_depth.saturating_mul(2).saturating_add(8),
    };
    match checker.check(writer, reader, &mut String::new(), 0) {
        Ok(()) => Ok(Ok(())),
        Err(Failure::Incompatible(e)) => Ok(Err(e)),
        Err(Failure::Bound { bound, unit }) => Err(Error::CheckTooComplex { version: 0, bound, unit }),
    }
}

/// Types, record fields and enum symbols in a schema's tree (a reference counts as one).
fn node_count(schema: &Schema) -> usize {
    let mut count = 0usize;
    let mut stack = vec![schema];
    while let Some(s) = stack.pop() {
        count += 1;
        match s {
            Schema::Record(r) => {
                count += r.fields.len();
                stack.extend(r.fields.iter().map(|f| &f.schema));
            }
            Schema::Enum(e) => count += e.symbols.len(),
            Schema::Array(a) => stack.push(&a.items),
            Schema::Map(m) => stack.push(&m.types),
            Schema::Union(u) => stack.extend(u.variants()),
            _ => {}
        }
    }
    count
}

/// Every named type a schema defines, by full name, so references can be followed.
pub(crate) fn names(schema: &Schema) -> HashMap<String, &Schema> {
    fn walk<'a>(s: &'a Schema, out: &mut HashMap<String, &'a Schema>) {
        match s {
            Schema::Record(r) => {
                out.insert(r.name.fullname(None), s);
                for f in &r.fields {
                    walk(&f.schema, out);
                }
            }
            Schema::Enum(e) => {
                out.insert(e.name.fullname(None), s);
            }
            Schema::Fixed(f)
            | Schema::Duration(f)
            | Schema::Uuid(UuidSchema::Fixed(f))
            | Schema::Decimal(DecimalSchema { inner: InnerDecimalSchema::Fixed(f), .. }) => {
                out.insert(f.name.fullname(None), s);
            }
            Schema::Array(a) => walk(&a.items, out),
            Schema::Map(m) => walk(&m.types, out),
            Schema::Union(u) => u.variants().iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = HashMap::new();
    walk(schema, &mut out);
    out
}

/// A schema seen through resolution: logical types as their underlying type.
#[derive(Clone, Copy)]
pub(crate) enum Shape<'a> {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    Array(&'a Schema),
    Map(&'a Schema),
    Union(&'a [Schema]),
    Record(&'a RecordSchema),
    Enum(&'a EnumSchema),
    Fixed(&'a FixedSchema),
    /// A reference to a name the schema does not define (cannot happen for a parsed schema).
    Unresolved(&'a Name),
}

impl Shape<'_> {
    pub(crate) fn type_name(&self) -> String {
        match self {
            Shape::Null => "null".into(),
            Shape::Boolean => "boolean".into(),
            Shape::Int => "int".into(),
            Shape::Long => "long".into(),
            Shape::Float => "float".into(),
            Shape::Double => "double".into(),
            Shape::Bytes => "bytes".into(),
            Shape::String => "string".into(),
            Shape::Array(_) => "array".into(),
            Shape::Map(_) => "map".into(),
            Shape::Union(_) => "union".into(),
            Shape::Record(r) => format!("record {}", r.name.fullname(None)),
            Shape::Enum(e) => format!("enum {}", e.name.fullname(None)),
            Shape::Fixed(f) => format!("fixed {}", f.name.fullname(None)),
            Shape::Unresolved(n) => format!("unknown type {}", n.fullname(None)),
        }
    }
}

pub(crate) fn shape<'a>(schema: &'a Schema, names: &HashMap<String, &'a Schema>) -> Shape<'a> {
    match schema {
        Schema::Null => Shape::Null,
        Schema::Boolean => Shape::Boolean,
        Schema::Int | Schema::Date | Schema::TimeMillis => Shape::Int,
        Schema::Long
        | Schema::TimeMicros
        | Schema::TimestampMillis
        | Schema::TimestampMicros
        | Schema::TimestampNanos
        | Schema::LocalTimestampMillis
        | Schema::LocalTimestampMicros
        | Schema::LocalTimestampNanos => Shape::Long,
        Schema::Float => Shape::Float,
        Schema::Double => Shape::Double,
        Schema::Bytes
        | Schema::BigDecimal
        | Schema::Uuid(UuidSchema::Bytes)
        | Schema::Decimal(DecimalSchema { inner: InnerDecimalSchema::Bytes, .. }) => Shape::Bytes,
        Schema::String | Schema::Uuid(UuidSchema::String) => Shape::String,
        Schema::Array(a) => Shape::Array(&a.items),
        Schema::Map(m) => Shape::Map(&m.types),
        Schema::Union(u) => Shape::Union(u.variants()),
        Schema::Record(r) => Shape::Record(r),
        Schema::Enum(e) => Shape::Enum(e),
        Schema::Fixed(f)
        | Schema::Duration(f)
        | Schema::Uuid(UuidSchema::Fixed(f))
        | Schema::Decimal(DecimalSchema { inner: InnerDecimalSchema::Fixed(f), .. }) => Shape::Fixed(f),
        Schema::Ref { name } => match names.get(&name.fullname(None)) {
            // A named type never resolves to another Ref: `names` only records definitions.
            Some(def) => shape(def, names),
            None => Shape::Unresolved(name),
        },
    }
}

/// Avro name matching for named types: the unqualified names are equal, or one of the
/// reader's aliases names the writer (as Java Avro's `SchemaCompatibility` does it).
fn names_match(writer: &Name, reader: &Name, reader_aliases: Option<&Vec<Alias>>) -> bool {
    writer.name() == reader.name()
        || reader_aliases.is_some_and(|aliases| {
            aliases.iter().any(|a| {
                let full = a.fullname(reader.namespace());
                full == writer.fullname(None) || a.name() == writer.name()
            })
        })
}

/// Why a check stopped: a verdict, or a bound.
enum Failure {
    Incompatible(Incompatibility),
    Bound { bound: usize, unit: &'static str },
}

impl From<Incompatibility> for Failure {
    fn from(e: Incompatibility) -> Self {
        Failure::Incompatible(e)
    }
}

/// A pair of named type definitions (writer, reader), by address: both schemas outlive the
/// check and each definition is one node of its tree.
type Pair = (usize, usize);

fn addr<T>(t: &T) -> usize {
    t as *const T as usize
}

/// A reader union's branches by what can select them: named branches by their unqualified
/// name and by each alias's unqualified name, the others by kind. Built once per union per
/// check, so finding the branches that may read a writer type costs a lookup, not a scan
/// (scanning made a union of n records against itself take n² checks).
struct UnionIndex<'a> {
    by_name: HashMap<&'a str, Vec<usize>>,
    by_kind: HashMap<Kind, usize>,
}

/// The kinds of unnamed types, as a union tells them apart.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    Array,
    Map,
}

fn kind(s: Shape<'_>) -> Option<Kind> {
    Some(match s {
        Shape::Null => Kind::Null,
        Shape::Boolean => Kind::Boolean,
        Shape::Int => Kind::Int,
        Shape::Long => Kind::Long,
        Shape::Float => Kind::Float,
        Shape::Double => Kind::Double,
        Shape::Bytes => Kind::Bytes,
        Shape::String => Kind::String,
        Shape::Array(_) => Kind::Array,
        Shape::Map(_) => Kind::Map,
        _ => return None,
    })
}

/// The reader kinds that can read a writer kind: itself and its promotions.
fn readable_as(w: Kind) -> &'static [Kind] {
    match w {
        Kind::Int => &[Kind::Int, Kind::Long, Kind::Float, Kind::Double],
        Kind::Long => &[Kind::Long, Kind::Float, Kind::Double],
        Kind::Float => &[Kind::Float, Kind::Double],
        Kind::Bytes => &[Kind::Bytes, Kind::String],
        Kind::String => &[Kind::String, Kind::Bytes],
        Kind::Null => &[Kind::Null],
        Kind::Boolean => &[Kind::Boolean],
        Kind::Double => &[Kind::Double],
        Kind::Array => &[Kind::Array],
        Kind::Map => &[Kind::Map],
    }
}

struct Checker<'a> {
    writer_names: HashMap<String, &'a Schema>,
    reader_names: HashMap<String, &'a Schema>,
    /// Final verdicts on pairs of named types; an error's path is relative to the pair. A
    /// pair is checked once, however many places meet it: that is what keeps the check
    /// linear in the schemas' size.
    verdicts: HashMap<Pair, Result<(), Incompatibility>>,
    /// Record pairs found compatible, in order. A pair that fails withdraws the ones found
    /// after it started: they may have leaned on its assumed compatibility (below).
    ok_log: Vec<Pair>,
    /// Record pairs being checked further up the stack: a recursive type meeting itself again
    /// is assumed compatible (co-induction), which is what terminates recursive schemas.
    in_progress: HashSet<Pair>,
    /// Reader unions' indexes, by the address of their first branch.
    unions: HashMap<usize, UnionIndex<'a>>,
    steps: usize,
    budget: usize,
    max_depth: usize,
}

impl<'a> Checker<'a> {
    fn step(&mut self, n: usize) -> Result<(), Failure> {
        self.steps = self.steps.saturating_add(n);
        if self.steps > self.budget {
            return Err(Failure::Bound { bound: self.budget, unit: "steps" });
        }
        Ok(())
    }

    fn check(&mut self, writer: &'a Schema, reader: &'a Schema, path: &mut String, depth: usize) -> Result<(), Failure> {
        self.step(1)?;
        if depth > self.max_depth {
            return Err(Failure::Bound { bound: self.max_depth, unit: "levels of nesting" });
        }
        let w = shape(writer, &self.writer_names);
        let r = shape(reader, &self.reader_names);
        let fail = |rule: &'static str, detail: String, path: &str| {
            Err(Failure::Incompatible(Incompatibility { rule, detail, path: path.to_string() }))
        };
        match (w, r) {
            (Shape::Unresolved(n), _) | (_, Shape::Unresolved(n)) => {
                fail("TYPE_MISMATCH", format!("reference to undefined type {}", n.fullname(None)), path)
            }
            (Shape::Union(branches), _) => {
                for (i, branch) in branches.iter().enumerate() {
                    match self.check(branch, reader, path, depth + 1) {
                        Ok(()) => {}
                        Err(Failure::Incompatible(e)) => {
                            let detail = format!(
                                "writer union branch {i} ({}) cannot be read: {}",
                                shape(branch, &self.writer_names).type_name(),
                                e.detail
                            );
                            return Err(Incompatibility { rule: "MISSING_UNION_BRANCH", detail, path: e.path }.into());
                        }
                        Err(bound) => return Err(bound),
                    }
                }
                Ok(())
            }
            (_, Shape::Union(branches)) => {
                // Any reader branch that reads the writer will do, and only branches of the
                // writer's name (or aliasing it) or of a kind it promotes to can. Remember the
                // first failure of a branch of the same kind: it explains best what went wrong.
                let mut best: Option<Incompatibility> = None;
                for i in self.candidates(w, branches) {
                    match self.check(writer, &branches[i], path, depth + 1) {
                        Ok(()) => return Ok(()),
                        Err(Failure::Incompatible(e)) => {
                            if best.is_none() && same_kind(w, shape(&branches[i], &self.reader_names)) {
                                best = Some(e);
                            }
                        }
                        Err(bound) => return Err(bound),
                    }
                }
                Err(best
                    .unwrap_or_else(|| Incompatibility {
                        rule: "MISSING_UNION_BRANCH",
                        detail: format!("reader union has no branch that reads writer type {}", w.type_name()),
                        path: path.clone(),
                    })
                    .into())
            }
            (Shape::Null, Shape::Null)
            | (Shape::Boolean, Shape::Boolean)
            | (Shape::Int, Shape::Int | Shape::Long | Shape::Float | Shape::Double)
            | (Shape::Long, Shape::Long | Shape::Float | Shape::Double)
            | (Shape::Float, Shape::Float | Shape::Double)
            | (Shape::Double, Shape::Double)
            | (Shape::Bytes | Shape::String, Shape::Bytes | Shape::String) => Ok(()),
            (Shape::Array(wi), Shape::Array(ri)) => with_segment(path, "/items", |p| self.check(wi, ri, p, depth + 1)),
            (Shape::Map(wv), Shape::Map(rv)) => with_segment(path, "/values", |p| self.check(wv, rv, p, depth + 1)),
            (Shape::Fixed(wf), Shape::Fixed(rf)) => {
                if !names_match(&wf.name, &rf.name, rf.aliases.as_ref()) {
                    fail(
                        "NAME_MISMATCH",
                        format!("writer fixed {} vs reader fixed {}", wf.name.fullname(None), rf.name.fullname(None)),
                        path,
                    )
                } else if wf.size != rf.size {
                    fail(
                        "FIXED_SIZE_MISMATCH",
                        format!("fixed {}: writer size {} vs reader size {}", rf.name.fullname(None), wf.size, rf.size),
                        path,
                    )
                } else {
                    Ok(())
                }
            }
            (Shape::Enum(we), Shape::Enum(re)) => self.check_enum(we, re, path),
            (Shape::Record(wr), Shape::Record(rr)) => self.check_record(wr, rr, path, depth),
            (w, r) => {
                fail("TYPE_MISMATCH", format!("reader type {} cannot read writer type {}", r.type_name(), w.type_name()), path)
            }
        }
    }

    /// Positions of the reader union's branches that may read writer type `w`, in branch order.
    fn candidates(&mut self, w: Shape<'a>, branches: &'a [Schema]) -> Vec<usize> {
        let Some(first) = branches.first() else { return Vec::new() };
        let reader_names = &self.reader_names;
        let index = self.unions.entry(addr(first)).or_insert_with(|| {
            let mut index = UnionIndex { by_name: HashMap::new(), by_kind: HashMap::new() };
            for (i, branch) in branches.iter().enumerate() {
                let (name, aliases) = match shape(branch, reader_names) {
                    Shape::Record(r) => (&r.name, r.aliases.as_ref()),
                    Shape::Enum(e) => (&e.name, e.aliases.as_ref()),
                    Shape::Fixed(f) => (&f.name, f.aliases.as_ref()),
                    other => {
                        if let Some(k) = kind(other) {
                            index.by_kind.entry(k).or_insert(i);
                        }
                        continue;
                    }
                };
                index.by_name.entry(name.name()).or_default().push(i);
                for alias in aliases.into_iter().flatten() {
                    index.by_name.entry(alias.name()).or_default().push(i);
                }
            }
            index
        });
        let named = |name: &Name| index.by_name.get(name.name()).cloned().unwrap_or_default();
        let mut out: Vec<usize> = match w {
            Shape::Record(r) => named(&r.name),
            Shape::Enum(e) => named(&e.name),
            Shape::Fixed(f) => named(&f.name),
            other => match kind(other) {
                Some(k) => readable_as(k).iter().filter_map(|k| index.by_kind.get(k).copied()).collect(),
                None => Vec::new(),
            },
        };
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The verdict reached before on `pair`, if any, its path placed under `path`.
    fn known(&self, pair: Pair, path: &str) -> Option<Result<(), Failure>> {
        self.verdicts.get(&pair).map(|v| match v {
            Ok(()) => Ok(()),
            Err(e) => Err(Incompatibility { path: format!("{path}{}", e.path), ..e.clone() }.into()),
        })
    }

    /// Stores a failure of `pair` met at `path`, with its path made relative to the pair.
    fn remember_failure(&mut self, pair: Pair, e: &Incompatibility, path: &str) {
        let relative = e.path.strip_prefix(path).unwrap_or(&e.path).to_string();
        self.verdicts.insert(pair, Err(Incompatibility { path: relative, ..e.clone() }));
    }

    fn check_enum(&mut self, we: &'a EnumSchema, re: &'a EnumSchema, path: &str) -> Result<(), Failure> {
        if !names_match(&we.name, &re.name, re.aliases.as_ref()) {
            return Err(Incompatibility {
                rule: "NAME_MISMATCH",
                detail: format!("writer enum {} vs reader enum {}", we.name.fullname(None), re.name.fullname(None)),
                path: path.to_string(),
            }
            .into());
        }
        if re.default.is_some() {
            return Ok(());
        }
        let pair = (addr(we), addr(re));
        if let Some(known) = self.known(pair, path) {
            return known;
        }
        self.step(we.symbols.len() + re.symbols.len())?;
        let reader: HashSet<&str> = re.symbols.iter().map(String::as_str).collect();
        let missing: Vec<&str> = we.symbols.iter().map(String::as_str).filter(|s| !reader.contains(s)).collect();
        if missing.is_empty() {
            // An enum's verdict rests on no assumption: never withdrawn, so not logged.
            self.verdicts.insert(pair, Ok(()));
            return Ok(());
        }
        let e = Incompatibility {
            rule: "MISSING_ENUM_SYMBOLS",
            detail: format!(
                "reader enum {} lacks writer symbols [{}] and has no default",
                re.name.fullname(None),
                missing.join(", ")
            ),
            path: path.to_string(),
        };
        self.remember_failure(pair, &e, path);
        Err(e.into())
    }

    fn check_record(
        &mut self,
        wr: &'a RecordSchema,
        rr: &'a RecordSchema,
        path: &mut String,
        depth: usize,
    ) -> Result<(), Failure> {
        if !names_match(&wr.name, &rr.name, rr.aliases.as_ref()) {
            return Err(Incompatibility {
                rule: "NAME_MISMATCH",
                detail: format!("writer record {} vs reader record {}", wr.name.fullname(None), rr.name.fullname(None)),
                path: path.clone(),
            }
            .into());
        }
        let pair = (addr(wr), addr(rr));
        if let Some(known) = self.known(pair, path) {
            return known;
        }
        if !self.in_progress.insert(pair) {
            return Ok(());
        }
        let mark = self.ok_log.len();
        let result = self.check_fields(wr, rr, path, depth);
        self.in_progress.remove(&pair);
        match &result {
            Ok(()) => {
                self.verdicts.insert(pair, Ok(()));
                self.ok_log.push(pair);
            }
            Err(Failure::Incompatible(e)) => {
                // Sound to keep: failing while pairs up the stack were assumed compatible, it
                // fails all the more without that assumption. Not so the successes found
                // since this pair started: they may rest on this pair's assumed success.
                for withdrawn in self.ok_log.drain(mark..) {
                    self.verdicts.remove(&withdrawn);
                }
                self.remember_failure(pair, e, path);
            }
            Err(Failure::Bound { .. }) => {}
        }
        result
    }

    fn check_fields(
        &mut self,
        wr: &'a RecordSchema,
        rr: &'a RecordSchema,
        path: &mut String,
        depth: usize,
    ) -> Result<(), Failure> {
        self.step(wr.fields.len() + rr.fields.len())?;
        // The writer's fields by name; not `wr.lookup`, which mixes in the writer's aliases,
        // while resolution matches the reader's names and aliases against writer names only.
        let writer_fields: HashMap<&str, &'a Schema> = wr.fields.iter().map(|f| (f.name.as_str(), &f.schema)).collect();
        for rf in &rr.fields {
            let wf = std::iter::once(&rf.name).chain(&rf.aliases).find_map(|n| writer_fields.get(n.as_str()).copied());
            match wf {
                Some(ws) => with_segment(path, &format!("/fields/{}", rf.name), |p| self.check(ws, &rf.schema, p, depth + 1))?,
                None if rf.default.is_some() => {}
                None => {
                    return Err(Incompatibility {
                        rule: "READER_FIELD_MISSING_DEFAULT_VALUE",
                        detail: format!(
                            "reader field '{}' of record {} has no default value and the writer has no such field",
                            rf.name,
                            rr.name.fullname(None)
                        ),
                        path: format!("{path}/fields/{}", rf.name),
                    }
                    .into())
                }
            }
        }
        Ok(())
    }
}

/// Same broad kind of type (used to pick the most telling error among union branches).
fn same_kind(a: Shape<'_>, b: Shape<'_>) -> bool {
    std::mem::discriminant(&a) == std::mem::discriminant(&b)
}

fn with_segment<T>(path: &mut String, segment: &str, f: impl FnOnce(&mut String) -> T) -> T {
    let len = path.len();
    path.push_str(segment);
    let out = f(path);
    path.truncate(len);
    out
}

#[cfg(test)]
mod tests;
