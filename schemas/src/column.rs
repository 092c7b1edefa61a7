//! Column kinds: what one kind of column is in Arrow (its field), what values
//! of it the collector accepts (its check), and how a value is appended to
//! its builder. The table declarations in [`crate::tables`] name a kind per
//! column, so a column's type, its validation and its builder cannot drift
//! apart.

use std::sync::Arc;

use arrow_array::builder::{
    ArrayBuilder, BooleanBufferBuilder, BooleanBuilder, Float32Builder, Float64Builder,
    ListBuilder, MapBuilder, MapFieldNames, PrimitiveBuilder, StringBuilder,
    StringDictionaryBuilder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, PrimitiveArray, new_null_array};
use arrow_buffer::NullBuffer;
use arrow_schema::{DataType, Field, TimeUnit};
use gputel_proto::{EventKind, ProfilingSource};

/// Longest string value accepted in a row (UUIDs, model names, port states).
pub const MAX_VALUE_BYTES: usize = 256;
/// Longest free text accepted (an event's detail).
pub const MAX_DETAIL_BYTES: usize = 1024;
/// Most entries accepted in one row's map (a pod's kept labels).
pub const MAX_MAP_ENTRIES: usize = 64;
/// Earliest accepted sample time: 2000-01-01T00:00:00Z. Older means a dead RTC.
pub const MIN_TS_US: i64 = 946_684_800_000_000;
/// How far ahead of the collector's clock a sample may be: one day.
pub const MAX_FUTURE_US: i64 = 24 * 3600 * 1_000_000;

/// Why one value of one row was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ColumnError {
    #[error(
        "{table} row {row}: timestamp {ts_us} µs is outside the accepted window (2000-01-01 to one day after the collector's clock); check the node's clock"
    )]
    Timestamp {
        table: &'static str,
        row: usize,
        ts_us: i64,
    },
    #[error("{table} row {row}: {field} is longer than {max} bytes")]
    TooLong {
        table: &'static str,
        row: usize,
        field: &'static str,
        max: usize,
    },
    #[error("{table} row {row}: {field} is {reason}")]
    Field {
        table: &'static str,
        row: usize,
        field: &'static str,
        reason: &'static str,
    },
}

/// The row being checked: where it is, for messages, and the collector's
/// clock, for the timestamp window.
#[derive(Debug, Clone, Copy)]
pub struct RowContext {
    pub table: &'static str,
    pub row: usize,
    pub now_us: i64,
}

impl RowContext {
    fn fail(self, field: &'static str, reason: &'static str) -> ColumnError {
        ColumnError::Field {
            table: self.table,
            row: self.row,
            field,
            reason,
        }
    }

    fn text(self, field: &'static str, v: &str, max: usize) -> Result<(), ColumnError> {
        if v.len() > max {
            Err(ColumnError::TooLong {
                table: self.table,
                row: self.row,
                field,
                max,
            })
        } else if v.chars().any(char::is_control) {
            Err(self.fail(field, "holding control characters"))
        } else {
            Ok(())
        }
    }

    fn int32(self, field: &'static str, v: u32) -> Result<(), ColumnError> {
        if v > i32::MAX as u32 {
            Err(self.fail(field, "larger than 2^31-1"))
        } else {
            Ok(())
        }
    }

    fn int64(self, field: &'static str, v: u64) -> Result<(), ColumnError> {
        if v > i64::MAX as u64 {
            Err(self.fail(field, "larger than 2^63-1"))
        } else {
            Ok(())
        }
    }

    fn finite(self, field: &'static str, v: f64) -> Result<(), ColumnError> {
        if v.is_finite() {
            Ok(())
        } else {
            Err(self.fail(field, "not a finite number"))
        }
    }

    /// A finite number of at least zero (-0.0 counts as zero).
    fn non_negative(self, field: &'static str, v: f64) -> Result<(), ColumnError> {
        self.finite(field, v)?;
        if v < 0.0 {
            Err(self.fail(field, "negative"))
        } else {
            Ok(())
        }
    }
}

/// One kind of column. `Value` is what a row gives it; the check runs on
/// every row an agent sends, before the row reaches a builder.
pub trait ColumnKind {
    /// A row's value of this column.
    type Value<'a>: Copy;
    /// The Arrow builder the values go to.
    type Builder: Default;
    /// The column's Arrow field.
    fn field(name: &'static str) -> Field;
    /// A builder with room for `rows` values, so that filling it copies
    /// nothing: the buffer of a flush is sized like the one before.
    fn builder(_rows: usize) -> Self::Builder {
        Self::Builder::default()
    }
    /// Whether the value can be stored; the message names the row and column.
    fn check(
        _row: RowContext,
        _name: &'static str,
        _v: Self::Value<'_>,
    ) -> Result<(), ColumnError> {
        Ok(())
    }
    /// Appends a value that passed [`ColumnKind::check`].
    fn put(builder: &mut Self::Builder, v: Self::Value<'_>);
    /// The values appended so far, as an array; the builder starts over. A
    /// nullable column that holds no value is taken from `nulls`, shared
    /// with the table's other such columns of its type.
    fn finish(builder: &mut Self::Builder, nulls: &mut SharedNulls) -> ArrayRef;
}

/// Columns that hold no value, one array per data type and length, shared
/// by every such column: most of a sparse table's columns are null in every
/// row (the MIG columns outside MIG mode, a pod's on a Slurm node), and each
/// would otherwise cost its full width for every row.
#[derive(Debug, Default)]
pub struct SharedNulls {
    arrays: Vec<ArrayRef>,
}

impl SharedNulls {
    /// An array of `len` nulls of `data_type`, the same one for every call
    /// with that type and length.
    pub fn of(&mut self, data_type: &DataType, len: usize) -> ArrayRef {
        if let Some(array) = self
            .arrays
            .iter()
            .find(|a| a.data_type() == data_type && a.len() == len)
        {
            return Arc::clone(array);
        }
        let array = new_null_array(data_type, len);
        self.arrays.push(Arc::clone(&array));
        array
    }
}

/// Arrow's type for every timestamp: microseconds, UTC, which DuckDB reads as
/// `TIMESTAMPTZ`.
pub fn timestamp_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// Sample time, µs since the Unix epoch; checked against the accepted window.
#[derive(Debug)]
pub enum Timestamp {}

/// A timestamp that is not the row's sample time (no window check).
#[derive(Debug)]
pub enum OtherTimestamp {}

impl ColumnKind for Timestamp {
    type Value<'a> = i64;
    type Builder = Packed;
    fn builder(rows: usize) -> Packed {
        Packed::with_room(rows)
    }
    fn field(name: &'static str) -> Field {
        Field::new(name, timestamp_type(), false)
    }
    fn check(row: RowContext, _name: &'static str, ts_us: i64) -> Result<(), ColumnError> {
        if ts_us < MIN_TS_US || ts_us > row.now_us.saturating_add(MAX_FUTURE_US) {
            return Err(ColumnError::Timestamp {
                table: row.table,
                row: row.row,
                ts_us,
            });
        }
        Ok(())
    }
    fn put(builder: &mut Packed, v: i64) {
        builder.append(Some(v));
    }
    fn finish(builder: &mut Packed, nulls: &mut SharedNulls) -> ArrayRef {
        builder.finish::<TimestampMicrosecondType>(&timestamp_type(), nulls)
    }
}

impl ColumnKind for OtherTimestamp {
    type Value<'a> = i64;
    type Builder = Packed;
    fn builder(rows: usize) -> Packed {
        Timestamp::builder(rows)
    }
    fn field(name: &'static str) -> Field {
        Timestamp::field(name)
    }
    fn put(builder: &mut Packed, v: i64) {
        Timestamp::put(builder, v);
    }
    fn finish(builder: &mut Packed, nulls: &mut SharedNulls) -> ArrayRef {
        Timestamp::finish(builder, nulls)
    }
}

type Dictionary = StringDictionaryBuilder<Int32Type>;

/// A dictionary builder with room for `rows` keys; the distinct values of a
/// flush (nodes, models, jobs) are few.
fn dictionary(rows: usize) -> Dictionary {
    Dictionary::with_capacity(rows, 256, 8192)
}

fn dictionary_type() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

fn dictionary_field(name: &'static str, nullable: bool) -> Field {
    Field::new(name, dictionary_type(), nullable)
}

/// A short string, dictionary-encoded (names, ids, states).
#[derive(Debug)]
pub enum Label {}

/// A short string that may be absent (a job id).
#[derive(Debug)]
pub enum OptLabel {}

impl ColumnKind for Label {
    type Value<'a> = &'a str;
    type Builder = Dictionary;
    fn builder(rows: usize) -> Dictionary {
        dictionary(rows)
    }
    fn field(name: &'static str) -> Field {
        dictionary_field(name, false)
    }
    fn check(row: RowContext, name: &'static str, v: &str) -> Result<(), ColumnError> {
        row.text(name, v, MAX_VALUE_BYTES)
    }
    fn put(builder: &mut Dictionary, v: &str) {
        builder.append_value(v);
    }
    fn finish(builder: &mut Dictionary, _: &mut SharedNulls) -> ArrayRef {
        ArrayBuilder::finish(builder)
    }
}

impl ColumnKind for OptLabel {
    type Value<'a> = Option<&'a str>;
    type Builder = Lazy<Dictionary>;
    fn builder(rows: usize) -> Lazy<Dictionary> {
        Lazy::with_room(rows)
    }
    fn field(name: &'static str) -> Field {
        dictionary_field(name, true)
    }
    fn check(row: RowContext, name: &'static str, v: Option<&str>) -> Result<(), ColumnError> {
        v.map_or(Ok(()), |v| row.text(name, v, MAX_VALUE_BYTES))
    }
    fn put(builder: &mut Lazy<Dictionary>, v: Option<&str>) {
        builder.append_option(v);
    }
    fn finish(builder: &mut Lazy<Dictionary>, nulls: &mut SharedNulls) -> ArrayRef {
        builder.finish(&dictionary_type(), nulls)
    }
}

/// Free text of up to [`MAX_DETAIL_BYTES`], not dictionary-encoded.
#[derive(Debug)]
pub enum Text {}

impl ColumnKind for Text {
    type Value<'a> = &'a str;
    type Builder = StringBuilder;
    fn field(name: &'static str) -> Field {
        Field::new(name, DataType::Utf8, false)
    }
    fn check(row: RowContext, name: &'static str, v: &str) -> Result<(), ColumnError> {
        row.text(name, v, MAX_DETAIL_BYTES)
    }
    fn put(builder: &mut StringBuilder, v: &str) {
        builder.append_value(v);
    }
    fn finish(builder: &mut StringBuilder, _: &mut SharedNulls) -> ArrayRef {
        ArrayBuilder::finish(builder)
    }
}

/// A list of short strings whose items are never null (a node's jobs).
#[derive(Debug)]
pub enum LabelList {}

/// Builds lists of non-null strings, as [`LabelList`] declares them.
#[derive(Debug)]
pub struct LabelListBuilder(ListBuilder<StringBuilder>);

impl Default for LabelListBuilder {
    fn default() -> Self {
        LabelListBuilder(
            ListBuilder::new(StringBuilder::new())
                .with_field(Field::new_list_field(DataType::Utf8, false)),
        )
    }
}

impl ColumnKind for LabelList {
    type Value<'a> = &'a [String];
    type Builder = LabelListBuilder;
    fn field(name: &'static str) -> Field {
        Field::new(
            name,
            DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, false))),
            false,
        )
    }
    fn check(row: RowContext, name: &'static str, v: &[String]) -> Result<(), ColumnError> {
        v.iter()
            .try_for_each(|item| row.text(name, item, MAX_VALUE_BYTES))
    }
    fn put(builder: &mut LabelListBuilder, v: &[String]) {
        for item in v {
            builder.0.values().append_value(item);
        }
        builder.0.append(true);
    }
    fn finish(builder: &mut LabelListBuilder, _: &mut SharedNulls) -> ArrayRef {
        Arc::new(builder.0.finish())
    }
}

/// String keys to string values, null where the map is empty (a pod's
/// kept labels): DuckDB reads it as `MAP(VARCHAR, VARCHAR)` and Spark as
/// `map<string,string>`, and both address a key as `column['key']`.
#[derive(Debug)]
pub enum LabelMap {}

/// Builds [`LabelMap`] columns.
#[derive(Debug)]
pub struct LabelMapBuilder(MapBuilder<StringBuilder, StringBuilder>);

impl Default for LabelMapBuilder {
    fn default() -> Self {
        LabelMapBuilder(MapBuilder::new(
            Some(map_field_names()),
            StringBuilder::new(),
            StringBuilder::new(),
        ))
    }
}

/// The names Parquet's MAP logical type gives a map's parts.
fn map_field_names() -> MapFieldNames {
    MapFieldNames {
        entry: "key_value".into(),
        key: "key".into(),
        value: "value".into(),
    }
}

impl ColumnKind for LabelMap {
    type Value<'a> = &'a std::collections::BTreeMap<String, String>;
    type Builder = LabelMapBuilder;
    fn field(name: &'static str) -> Field {
        let names = map_field_names();
        let entries = Field::new(
            names.entry,
            DataType::Struct(
                vec![
                    Field::new(names.key, DataType::Utf8, false),
                    Field::new(names.value, DataType::Utf8, true),
                ]
                .into(),
            ),
            false,
        );
        Field::new(name, DataType::Map(Arc::new(entries), false), true)
    }
    fn check(
        row: RowContext,
        name: &'static str,
        v: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), ColumnError> {
        if v.len() > MAX_MAP_ENTRIES {
            return Err(row.fail(name, "a map of more than 64 entries"));
        }
        v.iter().try_for_each(|(key, value)| {
            if key.is_empty() {
                return Err(row.fail(name, "a map with an empty key"));
            }
            row.text(name, key, MAX_VALUE_BYTES)?;
            row.text(name, value, MAX_VALUE_BYTES)
        })
    }
    fn put(builder: &mut LabelMapBuilder, v: &std::collections::BTreeMap<String, String>) {
        for (key, value) in v {
            builder.0.keys().append_value(key);
            builder.0.values().append_value(value);
        }
        // Building into a field declared above cannot fail.
        let _ = builder.0.append(!v.is_empty());
    }
    fn finish(builder: &mut LabelMapBuilder, _: &mut SharedNulls) -> ArrayRef {
        Arc::new(builder.0.finish())
    }
}

/// A nullable column's builder that holds nothing until the column's first
/// value: a column that is null in every row of a flush (the MIG columns
/// outside MIG mode, a pod on a Slurm node, profiling metrics on a GPU
/// without them, retired pages on a GPU that remaps rows instead) costs a
/// count instead of its full width in every row. The nulls before the first
/// value are appended when it comes.
#[derive(Debug, Default)]
pub struct Lazy<B> {
    /// Rows the builder is made with room for.
    room: usize,
    /// Nulls appended before the first value.
    nulls: usize,
    values: Option<B>,
}

/// What [`Lazy`] needs of the builder it puts off making.
pub trait DeferredBuilder: ArrayBuilder {
    /// What one value is.
    type Value<'a>;
    fn with_room(rows: usize) -> Self;
    fn append_value(&mut self, v: Self::Value<'_>);
    fn append_nulls(&mut self, n: usize);
}

impl<T: ArrowPrimitiveType> DeferredBuilder for PrimitiveBuilder<T> {
    type Value<'a> = T::Native;
    fn with_room(rows: usize) -> Self {
        Self::with_capacity(rows)
    }
    fn append_value(&mut self, v: T::Native) {
        PrimitiveBuilder::append_value(self, v);
    }
    fn append_nulls(&mut self, n: usize) {
        PrimitiveBuilder::append_nulls(self, n);
    }
}

impl DeferredBuilder for BooleanBuilder {
    type Value<'a> = bool;
    fn with_room(rows: usize) -> Self {
        Self::with_capacity(rows)
    }
    fn append_value(&mut self, v: bool) {
        BooleanBuilder::append_value(self, v);
    }
    fn append_nulls(&mut self, n: usize) {
        BooleanBuilder::append_nulls(self, n);
    }
}

impl DeferredBuilder for Dictionary {
    type Value<'a> = &'a str;
    fn with_room(rows: usize) -> Self {
        dictionary(rows)
    }
    fn append_value(&mut self, v: &str) {
        Dictionary::append_value(self, v);
    }
    fn append_nulls(&mut self, n: usize) {
        Dictionary::append_nulls(self, n);
    }
}

impl<B: DeferredBuilder> Lazy<B> {
    /// A builder that, once a value comes, has room for `rows` rows.
    pub fn with_room(rows: usize) -> Self {
        Self {
            room: rows,
            nulls: 0,
            values: None,
        }
    }

    pub fn append_option(&mut self, v: Option<B::Value<'_>>) {
        match (v, &mut self.values) {
            (None, None) => self.nulls += 1,
            (None, Some(values)) => values.append_nulls(1),
            (Some(v), Some(values)) => values.append_value(v),
            (Some(v), None) => {
                let mut values = B::with_room(self.room.max(self.nulls + 1));
                values.append_nulls(self.nulls);
                values.append_value(v);
                self.values = Some(values);
            }
        }
    }

    /// The rows appended so far as an array of `data_type` (if no value
    /// came, `shared`'s all-null array of that type and length); starts over
    /// with no builder.
    pub fn finish(&mut self, data_type: &DataType, shared: &mut SharedNulls) -> ArrayRef {
        let nulls = std::mem::take(&mut self.nulls);
        match self.values.take() {
            Some(mut values) => values.finish(),
            None => shared.of(data_type, nulls),
        }
    }
}

/// Bytes of room a [`Packed`] column starts with per row it is made for.
/// Most values take one or two (see [`Packed`]); a column whose values take
/// more grows as it fills.
const PACKED_ROOM_BYTES: usize = 2;

/// Integers held packed until their column is finished: each value as the
/// zigzag LEB128 varint of its difference from the value before it in the
/// column, the rows without one in a validity bitmap made at the first of
/// them. The write buffer's rows come a node's tick at a time, so a value's
/// neighbour is the same tick's next GPU or port: timestamps, clocks,
/// memory sizes, limits and error counts differ from it by little or
/// nothing and take a byte, where Arrow's builders take 4 or 8 for every
/// row (benches/README.md, "the write buffer's integers packed"). The
/// column becomes an Arrow array only when it is finished, one column at a
/// time as a flush encodes it.
#[derive(Debug, Default)]
pub struct Packed {
    /// Rows the first value makes room for.
    room: usize,
    bytes: Vec<u8>,
    /// The value the next one is a difference from.
    last: i64,
    rows: usize,
    /// Rows with a value.
    values: usize,
    /// Which rows have a value; None until a row has none.
    validity: Option<BooleanBufferBuilder>,
}

impl Packed {
    /// A column that, once a value comes, has room for `rows` rows.
    pub fn with_room(rows: usize) -> Self {
        Self {
            room: rows,
            ..Self::default()
        }
    }

    /// Appends a row's value, or a row without one.
    pub fn append(&mut self, v: Option<i64>) {
        match v {
            Some(v) => {
                if self.bytes.capacity() == 0 {
                    self.bytes
                        .reserve(self.room.max(self.rows + 1) * PACKED_ROOM_BYTES);
                }
                let delta = v.wrapping_sub(self.last);
                self.last = v;
                let mut zigzag = ((delta << 1) ^ (delta >> 63)) as u64;
                while zigzag >= 0x80 {
                    self.bytes.push(zigzag as u8 | 0x80);
                    zigzag >>= 7;
                }
                self.bytes.push(zigzag as u8);
                self.values += 1;
                if let Some(validity) = &mut self.validity {
                    validity.append(true);
                }
            }
            None => {
                let (rows, room) = (self.rows, self.room);
                self.validity
                    .get_or_insert_with(|| {
                        let mut validity = BooleanBufferBuilder::new(room.max(rows + 1));
                        validity.append_n(rows, true);
                        validity
                    })
                    .append(false);
            }
        }
        self.rows += 1;
    }

    /// The rows appended so far as an array of `data_type`, whose values
    /// are `T`'s (if no row has a value, `shared`'s all-null array of that
    /// type and length); starts over, its memory freed.
    pub fn finish<T: ArrowPrimitiveType>(
        &mut self,
        data_type: &DataType,
        shared: &mut SharedNulls,
    ) -> ArrayRef
    where
        T::Native: TryFrom<i64>,
    {
        std::mem::take(self).array::<T>(data_type, shared)
    }

    /// The rows appended so far as an array, as [`Packed::finish`] makes
    /// it, but keeping them.
    pub fn array<T: ArrowPrimitiveType>(
        &self,
        data_type: &DataType,
        shared: &mut SharedNulls,
    ) -> ArrayRef
    where
        T::Native: TryFrom<i64>,
    {
        if self.values == 0 && self.rows > 0 {
            return shared.of(data_type, self.rows);
        }
        let nulls = self
            .validity
            .as_ref()
            .map(|v| NullBuffer::new(v.finish_cloned()));
        let mut values = Vec::with_capacity(self.rows);
        let mut bytes = self.bytes.iter();
        let mut last = 0i64;
        for row in 0..self.rows {
            if nulls.as_ref().is_some_and(|n| n.is_null(row)) {
                values.push(T::Native::default());
                continue;
            }
            let mut zigzag = 0u64;
            let mut shift = 0;
            for &byte in bytes.by_ref() {
                zigzag |= u64::from(byte & 0x7f) << shift;
                if byte < 0x80 {
                    break;
                }
                shift += 7;
            }
            last = last.wrapping_add((zigzag >> 1) as i64 ^ -((zigzag & 1) as i64));
            // The kinds' checks keep every value within its type.
            values.push(T::Native::try_from(last).unwrap_or_default());
        }
        Arc::new(PrimitiveArray::<T>::new(values.into(), nulls).with_data_type(data_type.clone()))
    }

    /// Whether columns of `data_type` can be held packed: the tables'
    /// integer and timestamp types.
    pub fn holds(data_type: &DataType) -> bool {
        matches!(
            data_type,
            DataType::Int32 | DataType::Int64 | DataType::Timestamp(TimeUnit::Microsecond, _)
        )
    }

    /// [`Packed::array`] with the value type that `data_type`, one
    /// [`Packed::holds`], has.
    pub fn array_of(&self, data_type: &DataType, shared: &mut SharedNulls) -> ArrayRef {
        match data_type {
            DataType::Int32 => self.array::<Int32Type>(data_type, shared),
            DataType::Int64 => self.array::<Int64Type>(data_type, shared),
            _ => self.array::<TimestampMicrosecondType>(data_type, shared),
        }
    }

    /// Appends every row of `array`, an integer or timestamp array; false
    /// (and nothing appended) for an array of another type.
    pub fn extend_from(&mut self, array: &dyn Array) -> bool {
        fn extend<T: ArrowPrimitiveType>(packed: &mut Packed, array: &dyn Array)
        where
            T::Native: Into<i64>,
        {
            for v in array.as_primitive::<T>() {
                packed.append(v.map(Into::into));
            }
        }
        match array.data_type() {
            DataType::Int32 => extend::<Int32Type>(self, array),
            DataType::Int64 => extend::<Int64Type>(self, array),
            DataType::Timestamp(TimeUnit::Microsecond, _) => {
                extend::<TimestampMicrosecondType>(self, array);
            }
            _ => return false,
        }
        true
    }

    /// Bytes the values take packed.
    pub fn packed_bytes(&self) -> usize {
        self.bytes.len()
    }
}

/// Declares integer kinds held [`Packed`]: `Kind(value type) => Arrow
/// type, nullable, check, conversion to an optional i64` (a value the
/// check passed fits the Arrow type).
macro_rules! packed_kind {
    ($(#[$doc:meta])* $kind:ident($value:ty) => $arrow:ty, nullable: $nullable:literal,
     check: |$row:ident, $name:ident, $v:ident| $check:expr, store: |$s:ident| $store:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub enum $kind {}

        impl ColumnKind for $kind {
            type Value<'a> = $value;
            type Builder = Packed;
            fn builder(rows: usize) -> Packed {
                Packed::with_room(rows)
            }
            fn field(name: &'static str) -> Field {
                Field::new(name, <$arrow as ArrowPrimitiveType>::DATA_TYPE, $nullable)
            }
            fn check($row: RowContext, $name: &'static str, $v: $value) -> Result<(), ColumnError> {
                $check
            }
            fn put(builder: &mut Packed, $s: $value) {
                builder.append($store);
            }
            fn finish(builder: &mut Packed, nulls: &mut SharedNulls) -> ArrayRef {
                builder.finish::<$arrow>(&<$arrow as ArrowPrimitiveType>::DATA_TYPE, nulls)
            }
        }
    };
}

/// Declares float and flag kinds, all nullable: `Kind(value type) => Arrow
/// type, builder, check, conversion to the stored type`. Their builder is
/// [`Lazy`].
macro_rules! number_kind {
    ($(#[$doc:meta])* $kind:ident($value:ty) => $data_type:expr, $builder:ty, nullable: true,
     check: |$row:ident, $name:ident, $v:ident| $check:expr, store: |$s:ident| $store:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub enum $kind {}

        impl ColumnKind for $kind {
            type Value<'a> = $value;
            type Builder = Lazy<$builder>;
            fn builder(rows: usize) -> Lazy<$builder> {
                Lazy::with_room(rows)
            }
            fn field(name: &'static str) -> Field {
                Field::new(name, $data_type, true)
            }
            fn check($row: RowContext, $name: &'static str, $v: $value) -> Result<(), ColumnError> {
                $check
            }
            fn put(builder: &mut Lazy<$builder>, $s: $value) {
                builder.append_option($store);
            }
            fn finish(builder: &mut Lazy<$builder>, nulls: &mut SharedNulls) -> ArrayRef {
                builder.finish(&$data_type, nulls)
            }
        }
    };
}

packed_kind!(
    /// An unsigned 32-bit value stored as INT32 (at most 2^31-1).
    U32(u32) => Int32Type, nullable: false,
    check: |row, name, v| row.int32(name, v),
    store: |v| Some(i64::from(v))
);
packed_kind!(
    /// An optional unsigned 32-bit value stored as INT32 (at most 2^31-1).
    OptU32(Option<u32>) => Int32Type, nullable: true,
    check: |row, name, v| v.map_or(Ok(()), |v| row.int32(name, v)),
    store: |v| v.map(i64::from)
);
packed_kind!(
    /// An optional unsigned 32-bit value stored as INT64 (milliwatts: no range to check).
    OptU32Wide(Option<u32>) => Int64Type, nullable: true,
    check: |_row, _name, _v| Ok(()),
    store: |v| v.map(i64::from)
);
packed_kind!(
    /// An unsigned 64-bit value stored as INT64 (at most 2^63-1).
    U64(u64) => Int64Type, nullable: false,
    check: |row, name, v| row.int64(name, v),
    store: |v| Some(v as i64)
);
packed_kind!(
    /// An optional unsigned 64-bit value stored as INT64 (at most 2^63-1).
    OptU64(Option<u64>) => Int64Type, nullable: true,
    check: |row, name, v| v.map_or(Ok(()), |v| row.int64(name, v)),
    store: |v| v.map(|v| v as i64)
);
packed_kind!(
    /// A signed 64-bit count the collector computes itself.
    I64(i64) => Int64Type, nullable: false,
    check: |_row, _name, _v| Ok(()),
    store: |v| Some(v)
);
number_kind!(
    /// An optional 32-bit float that cannot be negative (a share in percent,
    /// a load average); NaN, infinities and negative numbers are refused.
    OptNonNegF32(Option<f32>) => DataType::Float32, Float32Builder, nullable: true,
    check: |row, name, v| v.map_or(Ok(()), |v| row.non_negative(name, f64::from(v))),
    store: |v| v
);
number_kind!(
    /// An optional 64-bit float that cannot be negative (a rate, a power);
    /// NaN, infinities and negative numbers are refused.
    OptNonNegF64(Option<f64>) => DataType::Float64, Float64Builder, nullable: true,
    check: |row, name, v| v.map_or(Ok(()), |v| row.non_negative(name, v)),
    store: |v| v
);
number_kind!(
    /// An optional 64-bit float of either sign (an alert rule's threshold);
    /// NaN and infinities are refused.
    OptF64(Option<f64>) => DataType::Float64, Float64Builder, nullable: true,
    check: |row, name, v| v.map_or(Ok(()), |v| row.finite(name, v)),
    store: |v| v
);
number_kind!(
    /// An optional flag.
    OptBool(Option<bool>) => DataType::Boolean, BooleanBuilder, nullable: true,
    check: |_row, _name, _v| Ok(()),
    store: |v| v
);

/// Whose an `event` row is: one GPU's (an agent's event), or a whole
/// node's (the collector's own node events, with no GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventScope {
    Gpu,
    Node,
}

/// An event's kind: a protocol enum on the wire, its name in the table.
/// Only the kinds the protocol defines (not "unspecified") are accepted,
/// each in its own scope: an agent's GPU event cannot carry a node kind
/// (`node_silent`, `node_back` are the collector's to raise).
#[derive(Debug)]
pub enum EventKindName {}

impl ColumnKind for EventKindName {
    type Value<'a> = (i32, EventScope);
    type Builder = Dictionary;
    fn field(name: &'static str) -> Field {
        dictionary_field(name, false)
    }
    fn check(
        row: RowContext,
        name: &'static str,
        (v, scope): (i32, EventScope),
    ) -> Result<(), ColumnError> {
        match (EventKind::try_from(v), scope) {
            (Ok(EventKind::Unspecified) | Err(_), _) => {
                Err(row.fail(name, "not a known event kind"))
            }
            (Ok(kind), EventScope::Gpu) if kind.is_node_wide() => Err(row.fail(
                name,
                "a node event kind, which only the collector raises; an agent sends GPU events",
            )),
            (Ok(kind), EventScope::Node) if !kind.is_node_wide() => {
                Err(row.fail(name, "a GPU event kind on a node event"))
            }
            (Ok(_), _) => Ok(()),
        }
    }
    fn put(builder: &mut Dictionary, (v, _): (i32, EventScope)) {
        builder.append_value(EventKind::try_from(v).map_or("unspecified", EventKind::name));
    }
    fn finish(builder: &mut Dictionary, _: &mut SharedNulls) -> ArrayRef {
        ArrayBuilder::finish(builder)
    }
}

/// Where a GPU row's profiling metrics come from: a protocol enum on the
/// wire, its name ("gpm", "dcgm") in the table, null when unset. Only the
/// sources the protocol defines (not "unspecified") are accepted.
#[derive(Debug)]
pub enum OptProfilingSourceName {}

impl ColumnKind for OptProfilingSourceName {
    type Value<'a> = Option<i32>;
    type Builder = Lazy<Dictionary>;
    fn builder(rows: usize) -> Lazy<Dictionary> {
        Lazy::with_room(rows)
    }
    fn field(name: &'static str) -> Field {
        dictionary_field(name, true)
    }
    fn check(row: RowContext, name: &'static str, v: Option<i32>) -> Result<(), ColumnError> {
        match v.map(ProfilingSource::try_from) {
            None | Some(Ok(ProfilingSource::Gpm | ProfilingSource::Dcgm)) => Ok(()),
            Some(_) => Err(row.fail(name, "not a known profiling source")),
        }
    }
    fn put(builder: &mut Lazy<Dictionary>, v: Option<i32>) {
        builder.append_option(
            v.map(|v| ProfilingSource::try_from(v).map_or("unspecified", ProfilingSource::name)),
        );
    }
    fn finish(builder: &mut Lazy<Dictionary>, nulls: &mut SharedNulls) -> ArrayRef {
        builder.finish(&dictionary_type(), nulls)
    }
}

/// Whether bit `mask` is set in an optional bitmask: the throttle columns
/// split `clock_event_reasons` into one flag per reason.
pub fn flag(bits: Option<u64>, mask: u64) -> Option<bool> {
    bits.map(|b| b & mask != 0)
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{Array, DictionaryArray, Int64Array};

    use super::*;

    #[test]
    fn a_column_null_in_every_row_makes_no_builder_and_finishes_as_nulls_of_its_type() {
        let mut b = OptU64::builder(1000);
        for _ in 0..5 {
            OptU64::put(&mut b, None);
        }
        assert_eq!(b.bytes.capacity(), 0, "no room before the first value");
        let array = OptU64::finish(&mut b, &mut SharedNulls::default());
        assert_eq!(array.data_type(), &DataType::Int64);
        assert_eq!((array.len(), array.null_count()), (5, 5));

        let mut b = OptLabel::builder(1000);
        OptLabel::put(&mut b, None);
        OptLabel::put(&mut b, None);
        assert!(b.values.is_none());
        let array = OptLabel::finish(&mut b, &mut SharedNulls::default());
        assert_eq!(array.data_type(), &dictionary_type());
        assert_eq!((array.len(), array.null_count()), (2, 2));
    }

    #[test]
    fn columns_without_a_value_share_one_array_of_their_type_and_length() {
        let mut nulls = SharedNulls::default();
        let (mut a, mut b, mut c, mut label) = (
            OptU64::builder(8),
            OptU32Wide::builder(8),
            OptU64::builder(8),
            OptLabel::builder(8),
        );
        for _ in 0..3 {
            OptU64::put(&mut a, None);
            OptU32Wide::put(&mut b, None);
            OptU64::put(&mut c, Some(5));
            OptLabel::put(&mut label, None);
        }
        let a = OptU64::finish(&mut a, &mut nulls);
        let b = OptU32Wide::finish(&mut b, &mut nulls);
        let c = OptU64::finish(&mut c, &mut nulls);
        let label = OptLabel::finish(&mut label, &mut nulls);
        // Both Int64 and null in every row: one array.
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!((a.len(), a.null_count()), (3, 3));
        // A column with values is its own.
        assert_eq!(c.as_primitive::<Int64Type>().values(), &[5, 5, 5]);
        // Another type, another array.
        assert_eq!(label.data_type(), &dictionary_type());
        assert_eq!((label.len(), label.null_count()), (3, 3));
        // Another length, another array.
        let short = nulls.of(&DataType::Int64, 2);
        assert_eq!((short.len(), short.null_count()), (2, 2));
        assert!(Arc::ptr_eq(&nulls.of(&DataType::Int64, 3), &a));
    }

    #[test]
    fn nulls_before_the_first_value_keep_their_rows() {
        let mut b = OptU64::builder(4);
        for v in [None, None, Some(7), None, Some(9)] {
            OptU64::put(&mut b, v);
        }
        let array = OptU64::finish(&mut b, &mut SharedNulls::default());
        assert_eq!(
            array.as_primitive::<Int64Type>(),
            &Int64Array::from(vec![None, None, Some(7), None, Some(9)])
        );

        let mut b = OptLabel::builder(0);
        for v in [None, Some("job-1"), None, Some("job-1"), Some("job-2")] {
            OptLabel::put(&mut b, v);
        }
        let array = OptLabel::finish(&mut b, &mut SharedNulls::default());
        let want: DictionaryArray<Int32Type> =
            vec![None, Some("job-1"), None, Some("job-1"), Some("job-2")]
                .into_iter()
                .collect();
        assert_eq!(array.as_dictionary::<Int32Type>(), &want);

        let mut b = OptBool::builder(0);
        for v in [None, Some(true), Some(false)] {
            OptBool::put(&mut b, v);
        }
        let array = OptBool::finish(&mut b, &mut SharedNulls::default());
        let got: Vec<_> = array.as_boolean().iter().collect();
        assert_eq!(got, [None, Some(true), Some(false)]);
    }

    #[test]
    fn a_finished_column_starts_over() {
        let mut b = OptU32::builder(0);
        OptU32::put(&mut b, None);
        OptU32::put(&mut b, Some(3));
        assert_eq!(OptU32::finish(&mut b, &mut SharedNulls::default()).len(), 2);
        OptU32::put(&mut b, None);
        let array = OptU32::finish(&mut b, &mut SharedNulls::default());
        assert_eq!((array.len(), array.null_count()), (1, 1));
        assert_eq!((b.rows, b.bytes.capacity()), (0, 0));
        assert_eq!(OptU32::finish(&mut b, &mut SharedNulls::default()).len(), 0);
    }

    /// Every value comes back as it went in, whatever the differences
    /// between neighbours: none, a sign change, the extremes of i64 (whose
    /// difference wraps), nulls before, between and after values.
    #[test]
    fn packed_integers_come_back_exactly() {
        let cases: Vec<Vec<Option<i64>>> = vec![
            vec![
                Some(0),
                Some(0),
                Some(1),
                Some(-1),
                Some(63),
                Some(64),
                Some(-64),
                Some(-65),
            ],
            vec![
                Some(i64::MAX),
                Some(i64::MIN),
                Some(i64::MAX),
                Some(0),
                Some(i64::MIN),
            ],
            vec![None, None, Some(7), None, Some(9), Some(9), None],
            vec![
                Some(1_700_000_000_000_000),
                Some(1_700_000_000_000_000),
                Some(1_700_000_001_000_000),
            ],
            (0..1000)
                .map(|i| (i % 7 != 0).then_some(i * i * 1_000_003 - 500_000_000))
                .collect(),
        ];
        for values in cases {
            let mut b = Packed::with_room(4);
            for &v in &values {
                b.append(v);
            }
            let array = b.finish::<Int64Type>(&DataType::Int64, &mut SharedNulls::default());
            assert_eq!(array.as_primitive::<Int64Type>(), &Int64Array::from(values));
        }
        let mut b = OptU32::builder(0);
        for v in [
            Some(0),
            None,
            Some(u32::try_from(i32::MAX).expect("fits")),
            Some(80),
        ] {
            OptU32::put(&mut b, v);
        }
        let array = OptU32::finish(&mut b, &mut SharedNulls::default());
        assert_eq!(
            array.as_primitive::<Int32Type>(),
            &arrow_array::Int32Array::from(vec![Some(0), None, Some(i32::MAX), Some(80)])
        );
        let mut b = Timestamp::builder(0);
        Timestamp::put(&mut b, 1_795_172_400_000_000);
        let array = Timestamp::finish(&mut b, &mut SharedNulls::default());
        assert_eq!(array.data_type(), &timestamp_type());
        assert_eq!(
            array.as_primitive::<TimestampMicrosecondType>().value(0),
            1_795_172_400_000_000
        );
    }

    /// What a tick of a node's 8 GPUs takes packed, against Arrow's 8 bytes
    /// a value: the same timestamp, a memory total, ECC counts of zero and
    /// power that differs from GPU to GPU.
    #[test]
    fn neighbouring_values_take_a_byte_or_two() {
        let packed_bytes = |values: &[i64]| {
            let mut b = Packed::with_room(values.len());
            for &v in values {
                b.append(Some(v));
            }
            b.bytes.len()
        };
        let ticks = |per_tick: &dyn Fn(i64, i64) -> i64| -> Vec<i64> {
            (0..100)
                .flat_map(|t| (0..8).map(move |gpu| (t, gpu)))
                .map(|(t, g)| per_tick(t, g))
                .collect()
        };
        // 800 values each: 100 ticks of 8 GPUs.
        let ts = packed_bytes(&ticks(&|t, _| 1_795_172_400_000_000 + t * 1_000_000));
        let total = packed_bytes(&ticks(&|_, _| 85_520_809_984));
        let ecc = packed_bytes(&ticks(&|_, _| 0));
        let power = packed_bytes(&ticks(&|t, g| 500_000 + (t * 37 + g * 1013) % 40_000));
        // The first value is whole; after it, a tick's step of a second is
        // 3 bytes and the same time again 1.
        assert_eq!(ts, 8 + 99 * 3 + 700);
        assert_eq!(total, 6 + 799);
        assert_eq!(ecc, 800);
        assert!(power < 800 * 3, "{power}");
    }
}
