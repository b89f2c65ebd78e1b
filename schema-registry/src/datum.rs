//! Decoding one Avro datum within bounds.
//!
//! apache-avro 0.22 decodes from any `Read`, so it cannot know how many bytes are left. It
//! bounds string and bytes lengths and array and map counts by one process-wide figure
//! (`apache_avro::util::max_allocation_bytes`, 512 MiB unless set), and it does not bound a
//! `fixed` at all: it allocates the schema's size before reading a byte, so a 13-byte record
//! whose schema has a `fixed` of 2^62 aborts the process. Nor does it bound nesting: a
//! recursive type decodes by recursion, as deep as the data says.
//!
//! [`validate`] walks the datum first, allocating nothing, and checks every length, size
//! and block count against the bytes actually left, nesting against
//! [`DatumLimits::max_depth`] and the number of values against [`DatumLimits::max_values`];
//! only a datum that passes reaches apache-avro ([`decode`]). apache-avro's own figure is
//! kept as the outer bound, set once to [`MAX_ALLOCATION_BYTES`] rather than its 512 MiB.
//!
//! Only the fixed size, nesting and zero-byte values needed a walk of our own; lengths are
//! checked in the same pass because the walk already knows how many bytes are left, which
//! apache-avro's bound (one figure for every datum) cannot.

use std::collections::HashMap;
use std::sync::Once;

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::schema::{DecimalSchema, InnerDecimalSchema, Name, UuidSchema};
use apache_avro::types::Value;
use apache_avro::Schema;

use crate::{Error, Result};

/// apache-avro's process-wide bound on one allocation while decoding (one string, bytes or
/// collection). A record value is at most `max.message.bytes` (1 MiB by default), and a
/// collection of [`DatumLimits::max_values`] values takes under 64 MiB in memory; 128 MiB
/// lets every datum the walk in [`validate`] accepts through while keeping one bad length
/// field from reserving half a GiB. The walk is the tighter bound; this one is the backstop.
pub const MAX_ALLOCATION_BYTES: usize = 128 * 1024 * 1024;

/// Bounds on one datum, beyond "no length larger than the bytes left".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatumLimits {
    /// Deepest nesting of records, arrays, maps and unions. Default 32, as
    /// [`SchemaLimits::max_depth`](crate::SchemaLimits::max_depth): apache-avro's decoder
    /// recurses per level, on the stack of whatever thread decodes, and its frames are large
    /// (in a debug build a linked list of 30 links, 60 levels, overflowed a 2 MiB stack).
    pub max_depth: usize,
    /// Most values in one datum. Values of zero bytes (null, an empty record) cost no input,
    /// so a five-byte array header could otherwise ask for 2^62 of them. Default 1,000,000,
    /// about what a full 1 MiB record value of one-byte items holds; apache-avro keeps each
    /// value in 56 bytes or so, so this also bounds a datum's decoded size.
    pub max_values: usize,
}

impl Default for DatumLimits {
    fn default() -> Self {
        Self { max_depth: 32, max_values: 1_000_000 }
    }
}

/// Sets apache-avro's allocation bound to [`MAX_ALLOCATION_BYTES`], if nothing in the process
/// decoded or set it before (it can be set once).
pub fn install_allocation_bound() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let in_force = apache_avro::util::max_allocation_bytes(MAX_ALLOCATION_BYTES);
        if in_force != MAX_ALLOCATION_BYTES {
            tracing::debug!(in_force, "apache-avro's allocation bound was set before; keeping it");
        }
    });
}

/// Decodes one datum of `writer` (resolved to `reader` when given) that must fill `datum`
/// exactly. The datum is [`validate`]d first; trailing bytes are [`Error::TrailingBytes`]
/// with `schema_id`.
pub fn decode(writer: &Schema, reader: Option<&Schema>, datum: &[u8], schema_id: i32, limits: &DatumLimits) -> Result<Value> {
    let used = validate(writer, datum, limits)?;
    if used != datum.len() {
        return Err(Error::TrailingBytes { schema_id, len: datum.len() - used });
    }
    install_allocation_bound();
    let mut rest = datum;
    Ok(GenericDatumReader::builder(writer).maybe_reader_schema(reader).build()?.read_value(&mut rest)?)
}

/// Walks one datum of `schema` at the start of `datum` without allocating for its contents,
/// and returns its length in bytes. Refuses ([`Error::BadDatum`]) a length, size or count
/// larger than the bytes left, nesting or a value count beyond `limits`, a union branch or
/// varint out of range, or a datum cut short. What it accepts, apache-avro can decode
/// without an allocation larger than the datum's bytes (times the in-memory size of a value).
pub fn validate(schema: &Schema, datum: &[u8], limits: &DatumLimits) -> Result<usize> {
    let mut walk = Walk { names: HashMap::new(), buf: datum, pos: 0, values: 0, limits };
    collect_names(schema, &mut walk.names);
    walk.value(schema, 0)?;
    Ok(walk.pos)
}

fn collect_names<'a>(schema: &'a Schema, out: &mut HashMap<&'a Name, &'a Schema>) {
    // The schema's own tree is bounded by the JSON it was parsed from (serde_json stops at a
    // nesting of 128), so this recursion is too.
    match schema {
        Schema::Record(r) => {
            out.insert(&r.name, schema);
            r.fields.iter().for_each(|f| collect_names(&f.schema, out));
        }
        Schema::Enum(e) => {
            out.insert(&e.name, schema);
        }
        Schema::Fixed(f)
        | Schema::Duration(f)
        | Schema::Uuid(UuidSchema::Fixed(f))
        | Schema::Decimal(DecimalSchema { inner: InnerDecimalSchema::Fixed(f), .. }) => {
            out.insert(&f.name, schema);
        }
        Schema::Array(a) => collect_names(&a.items, out),
        Schema::Map(m) => collect_names(&m.types, out),
        Schema::Union(u) => u.variants().iter().for_each(|v| collect_names(v, out)),
        _ => {}
    }
}

struct Walk<'a, 'l> {
    names: HashMap<&'a Name, &'a Schema>,
    buf: &'a [u8],
    pos: usize,
    values: usize,
    limits: &'l DatumLimits,
}

impl<'a> Walk<'a, '_> {
    fn bad(&self, reason: impl Into<String>) -> Error {
        Error::BadDatum { at: self.pos, reason: reason.into() }
    }

    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn skip(&mut self, n: usize, what: &str) -> Result<()> {
        if n > self.left() {
            return Err(self.bad(format!("{what} of {n} bytes, but only {} bytes are left", self.left())));
        }
        self.pos += n;
        Ok(())
    }

    /// A zig-zag varint of at most 10 bytes.
    fn long(&mut self) -> Result<i64> {
        let mut raw: u64 = 0;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(self.bad("the datum ends inside a number"));
            };
            self.pos += 1;
            raw |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok((raw >> 1) as i64 ^ -((raw & 1) as i64));
            }
        }
        Err(self.bad("a number longer than 10 bytes"))
    }

    fn int(&mut self) -> Result<i32> {
        let v = self.long()?;
        i32::try_from(v).map_err(|_| self.bad(format!("{v} does not fit an int")))
    }

    /// A length (of bytes or a string): not negative, not more than the bytes left.
    fn length(&mut self, what: &str) -> Result<()> {
        let n = self.long()?;
        let n = usize::try_from(n).map_err(|_| self.bad(format!("negative {what} length {n}")))?;
        self.skip(n, what)
    }

    fn count_value(&mut self, n: usize) -> Result<()> {
        self.values = self.values.saturating_add(n);
        if self.values > self.limits.max_values {
            return Err(self.bad(format!("more than {} values (DatumLimits::max_values)", self.limits.max_values)));
        }
        Ok(())
    }

    fn nest(&self, depth: usize) -> Result<usize> {
        if depth >= self.limits.max_depth {
            return Err(self.bad(format!("nested deeper than {} levels (DatumLimits::max_depth)", self.limits.max_depth)));
        }
        Ok(depth + 1)
    }

    fn value(&mut self, schema: &'a Schema, depth: usize) -> Result<()> {
        self.count_value(1)?;
        match schema {
            Schema::Null => Ok(()),
            Schema::Boolean => self.skip(1, "boolean"),
            Schema::Int | Schema::Date | Schema::TimeMillis | Schema::Enum(_) => self.int().map(drop),
            Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => self.long().map(drop),
            Schema::Float => self.skip(4, "float"),
            Schema::Double => self.skip(8, "double"),
            Schema::Bytes
            | Schema::BigDecimal
            | Schema::Uuid(UuidSchema::Bytes)
            | Schema::Decimal(DecimalSchema { inner: InnerDecimalSchema::Bytes, .. }) => self.length("bytes"),
            Schema::String | Schema::Uuid(UuidSchema::String) => self.length("string"),
            Schema::Fixed(f)
            | Schema::Duration(f)
            | Schema::Uuid(UuidSchema::Fixed(f))
            | Schema::Decimal(DecimalSchema { inner: InnerDecimalSchema::Fixed(f), .. }) => {
                self.skip(f.size, &format!("fixed {}", f.name.fullname(None)))
            }
            Schema::Union(u) => {
                let depth = self.nest(depth)?;
                let index = self.long()?;
                let branch = usize::try_from(index).ok().and_then(|i| u.variants().get(i));
                match branch {
                    Some(branch) => self.value(branch, depth),
                    None => Err(self.bad(format!("union branch {index} of a union of {}", u.variants().len()))),
                }
            }
            Schema::Record(r) => {
                let depth = self.nest(depth)?;
                r.fields.iter().try_for_each(|f| self.value(&f.schema, depth))
            }
            Schema::Array(a) => {
                let depth = self.nest(depth)?;
                self.blocks(depth, |walk, depth| walk.value(&a.items, depth), min_size(&a.items))
            }
            Schema::Map(m) => {
                let depth = self.nest(depth)?;
                let min = 1 + min_size(&m.types);
                self.blocks(
                    depth,
                    |walk, depth| {
                        walk.length("map key")?;
                        walk.value(&m.types, depth)
                    },
                    min,
                )
            }
            Schema::Ref { name } => match self.names.get(name) {
                Some(def) => self.value(def, depth),
                None => Err(self.bad(format!("reference to undefined type {}", name.fullname(None)))),
            },
        }
    }

    /// Array or map blocks: a count (negative: followed by the block's size in bytes), its
    /// items, until a count of 0. A count is refused before any item is walked when its items
    /// (at least `min_item` bytes each) cannot fit in what is left, or when it alone passes
    /// the value bound, so the decoder never reserves room for it.
    fn blocks(&mut self, depth: usize, mut item: impl FnMut(&mut Self, usize) -> Result<()>, min_item: usize) -> Result<()> {
        loop {
            let count = self.long()?;
            if count == 0 {
                return Ok(());
            }
            if count < 0 {
                let size = self.long()?;
                if usize::try_from(size).map_or(true, |s| s > self.left()) {
                    return Err(self.bad(format!("a block of {size} bytes, but only {} bytes are left", self.left())));
                }
            }
            let n = count.unsigned_abs();
            let n = usize::try_from(n).map_err(|_| self.bad(format!("a block of {n} items")))?;
            if min_item > 0 && n > self.left() / min_item {
                return Err(self
                    .bad(format!("a block of {n} items of at least {min_item} bytes, but only {} bytes are left", self.left())));
            }
            if self.values.saturating_add(n) > self.limits.max_values {
                return Err(self.bad(format!(
                    "a block of {n} items: more than {} values (DatumLimits::max_values)",
                    self.limits.max_values
                )));
            }
            for _ in 0..n {
                item(self, depth)?;
            }
        }
    }
}

/// The fewest bytes a value of `schema` can take (a lower bound: records and references
/// count as 0, which only makes the item-count check above looser).
fn min_size(schema: &Schema) -> usize {
    match schema {
        Schema::Null | Schema::Record(_) | Schema::Ref { .. } => 0,
        Schema::Float => 4,
        Schema::Double => 8,
        Schema::Fixed(f)
        | Schema::Duration(f)
        | Schema::Uuid(UuidSchema::Fixed(f))
        | Schema::Decimal(DecimalSchema { inner: InnerDecimalSchema::Fixed(f), .. }) => f.size,
        _ => 1,
    }
}

#[cfg(test)]
mod tests;
