//! Row order by several columns, as `arrow_ord::sort::lexsort_to_indices`
//! gives it (ascending, nulls first), with ties kept in row order.
//!
//! The sort keys of the tables are a node name, a device number or name and
//! a time: a dictionary of a few thousand strings and integers of narrow
//! range. Each row's key is turned into one integer that orders as the row
//! does: a string its rank in the sorted dictionary, an integer its distance
//! from the column's least value, a null 0, each given the bits its column's
//! range needs, and the row's position in the lowest bits. Sorting those
//! integers replaces `lexsort_to_indices`, whose comparator calls a dynamic
//! comparison per column and compares dictionary strings byte by byte
//! (`memcmp`) at every step: a flush's sort takes about a fifth of its time
//! (`cargo bench -p gputel-benches --bench ingest -- 'ingest/sort$'`).
//! A key of up to 64 bits is sorted as a `u64` (8 bytes a row, twice the
//! indices lexsort makes), a wider one as a `u128`; keys whose columns do
//! not fit in 128 bits, or of other types, are sorted by
//! `lexsort_to_indices` with the position as a last column.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, TimestampMicrosecondType, UInt32Type};
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, PrimitiveArray, UInt32Array};
use arrow_ord::sort::{SortColumn, lexsort_to_indices, sort_to_indices};
use arrow_schema::{ArrowError, DataType, TimeUnit};

/// The indices of the rows of `columns` (all of one length) in the order
/// of their values, column after column: ascending, nulls first, rows with
/// equal keys in their order in the columns.
pub fn sorted_indices(columns: &[ArrayRef]) -> Result<UInt32Array, ArrowError> {
    let rows = columns.first().map_or(0, |c| c.len());
    if columns.iter().any(|c| c.len() != rows) {
        return Err(ArrowError::InvalidArgumentError(
            "sort columns of different lengths".to_owned(),
        ));
    }
    let rows = u32::try_from(rows)
        .map_err(|_| ArrowError::ComputeError(format!("{rows} rows are too many to sort")))?;
    let Some(plan) = Plan::of(columns, rows)? else {
        return lexsort_with_position(columns, rows);
    };
    Ok(if plan.bits <= u64::BITS {
        plan.sort::<u64>(rows)
    } else {
        plan.sort::<u128>(rows)
    })
}

/// `lexsort_to_indices` of `columns` and then the position: the same order.
fn lexsort_with_position(columns: &[ArrayRef], rows: u32) -> Result<UInt32Array, ArrowError> {
    let mut sort_columns: Vec<SortColumn> = columns
        .iter()
        .map(|c| SortColumn {
            values: Arc::clone(c),
            options: None,
        })
        .collect();
    sort_columns.push(SortColumn {
        values: Arc::new(UInt32Array::from_iter_values(0..rows)),
        options: None,
    });
    lexsort_to_indices(&sort_columns, None)
}

/// Bits that hold a row position below `rows`.
fn position_bits(rows: u32) -> u32 {
    u32::BITS - rows.saturating_sub(1).leading_zeros()
}

/// Bits that hold every integer up to `max`.
fn bits_for(max: u64) -> u32 {
    u64::BITS - max.leading_zeros()
}

/// How each column becomes bits of the packed key. A column's ordinal is 0
/// for a null, else 1 + the value's place, ordered as its values are.
struct Plan<'a> {
    columns: Vec<(Ordinal<'a>, u32)>,
    /// Bits of the whole key, the position's included.
    bits: u32,
}

enum Ordinal<'a> {
    /// 1 + the distance from the column's least value.
    Int32(&'a PrimitiveArray<Int32Type>, i64),
    Int64(&'a PrimitiveArray<Int64Type>, i64),
    UInt32(&'a PrimitiveArray<UInt32Type>, i64),
    Timestamp(&'a PrimitiveArray<TimestampMicrosecondType>, i64),
    /// 1 + the rank of the key's string among the dictionary's distinct
    /// strings (a dictionary may hold a string twice; both entries get its
    /// rank), 0 for a null entry.
    Dictionary(&'a PrimitiveArray<Int32Type>, Vec<u64>),
}

impl<'a> Plan<'a> {
    /// `None` when a column's type has no ordinals here or the key needs
    /// more than 128 bits.
    fn of(columns: &'a [ArrayRef], rows: u32) -> Result<Option<Self>, ArrowError> {
        let mut plan = Plan {
            columns: Vec::with_capacity(columns.len()),
            bits: position_bits(rows),
        };
        for column in columns {
            let Some((ordinal, max)) = ordinal_of(column)? else {
                return Ok(None);
            };
            let bits = bits_for(max);
            plan.bits += bits;
            if plan.bits > u128::BITS {
                return Ok(None);
            }
            plan.columns.push((ordinal, bits));
        }
        Ok(Some(plan))
    }

    /// Packs each row's key into a `K`, sorts them and returns the
    /// positions in that order.
    fn sort<K: Key>(&self, rows: u32) -> UInt32Array {
        let mut keys: Vec<K> = (0..rows).map(K::from_u32).collect();
        let mut shift = position_bits(rows);
        for (ordinal, bits) in self.columns.iter().rev() {
            if *bits > 0 {
                ordinal.or_into(&mut keys, shift);
            }
            shift += bits;
        }
        keys.sort_unstable();
        let mask = (1u64 << position_bits(rows)) - 1;
        keys.into_iter().map(|k| k.low(mask)).collect()
    }
}

/// A packed key: `u64` or `u128`.
trait Key: Copy + Ord {
    fn from_u32(position: u32) -> Self;
    /// `self | ordinal << shift`.
    fn or_shifted(self, ordinal: u64, shift: u32) -> Self;
    /// The position: the bits under `mask`.
    fn low(self, mask: u64) -> u32;
}

impl Key for u64 {
    fn from_u32(position: u32) -> Self {
        u64::from(position)
    }
    fn or_shifted(self, ordinal: u64, shift: u32) -> Self {
        self | ordinal << shift
    }
    fn low(self, mask: u64) -> u32 {
        (self & mask) as u32
    }
}

impl Key for u128 {
    fn from_u32(position: u32) -> Self {
        u128::from(position)
    }
    fn or_shifted(self, ordinal: u64, shift: u32) -> Self {
        self | u128::from(ordinal) << shift
    }
    fn low(self, mask: u64) -> u32 {
        (self & u128::from(mask)) as u32
    }
}

impl Ordinal<'_> {
    fn or_into<K: Key>(&self, keys: &mut [K], shift: u32) {
        fn ints<K: Key, T: ArrowPrimitiveType>(
            keys: &mut [K],
            shift: u32,
            array: &PrimitiveArray<T>,
            min: i64,
            wide: impl Fn(T::Native) -> i64,
        ) {
            for (key, v) in keys.iter_mut().zip(array.iter()) {
                let ordinal = v.map_or(0, |v| wide(v).abs_diff(min) + 1);
                *key = key.or_shifted(ordinal, shift);
            }
        }
        match self {
            Ordinal::Int32(a, min) => ints(keys, shift, *a, *min, i64::from),
            Ordinal::Int64(a, min) => ints(keys, shift, *a, *min, |v| v),
            Ordinal::UInt32(a, min) => ints(keys, shift, *a, *min, i64::from),
            Ordinal::Timestamp(a, min) => ints(keys, shift, *a, *min, |v| v),
            Ordinal::Dictionary(dictionary_keys, rank) => {
                for (key, k) in keys.iter_mut().zip(dictionary_keys.iter()) {
                    let ordinal = k.map_or(0, |k| rank[k as usize]);
                    *key = key.or_shifted(ordinal, shift);
                }
            }
        }
    }
}

/// A column's ordinals and the largest of them; `None` for a type that has
/// none here, or an integer range that does not fit in 64 bits (nearly all
/// of i64).
fn ordinal_of(column: &ArrayRef) -> Result<Option<(Ordinal<'_>, u64)>, ArrowError> {
    Ok(match column.data_type() {
        DataType::Int32 => {
            let a = column.as_primitive::<Int32Type>();
            range(a, i64::from).map(|(min, max)| (Ordinal::Int32(a, min), max))
        }
        DataType::Int64 => {
            let a = column.as_primitive::<Int64Type>();
            range(a, |v| v).map(|(min, max)| (Ordinal::Int64(a, min), max))
        }
        DataType::UInt32 => {
            let a = column.as_primitive::<UInt32Type>();
            range(a, i64::from).map(|(min, max)| (Ordinal::UInt32(a, min), max))
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            let a = column.as_primitive::<TimestampMicrosecondType>();
            range(a, |v| v).map(|(min, max)| (Ordinal::Timestamp(a, min), max))
        }
        DataType::Dictionary(key, value)
            if **key == DataType::Int32 && **value == DataType::Utf8 =>
        {
            let dictionary = column.as_dictionary::<Int32Type>();
            let (rank, max) = ranks(dictionary.values())?;
            Some((Ordinal::Dictionary(dictionary.keys(), rank), max))
        }
        _ => None,
    })
}

/// The least value of an integer column and its largest ordinal (0 when
/// every row is null); `None` when the ordinals do not fit in 64 bits.
fn range<T: ArrowPrimitiveType>(
    array: &PrimitiveArray<T>,
    wide: impl Fn(T::Native) -> i64,
) -> Option<(i64, u64)> {
    let (min, max) = array
        .iter()
        .flatten()
        .map(wide)
        .fold((i64::MAX, i64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if min > max {
        return Some((0, 0));
    }
    let top = u64::try_from(i128::from(max) - i128::from(min) + 1).ok()?;
    Some((min, top))
}

/// Each dictionary entry's ordinal, 1 + its string's rank among the
/// distinct strings (0 for a null entry), and the largest.
fn ranks(strings: &ArrayRef) -> Result<(Vec<u64>, u64), ArrowError> {
    let order = sort_to_indices(strings, None, None)?;
    let strings = strings.as_string::<i32>();
    let mut rank = vec![0u64; strings.len()];
    let mut next = 0u64;
    let mut previous: Option<&str> = None;
    for &i in order.values() {
        let i = i as usize;
        if strings.is_null(i) {
            continue;
        }
        let value = strings.value(i);
        if previous != Some(value) {
            next += 1;
            previous = Some(value);
        }
        rank[i] = next;
    }
    Ok((rank, next))
}

#[cfg(test)]
mod tests {
    use arrow_array::builder::StringDictionaryBuilder;
    use arrow_array::{BooleanArray, Int32Array, Int64Array, TimestampMicrosecondArray};

    use super::*;

    /// What `lexsort_to_indices` gives with the position as a last column.
    fn reference(columns: &[ArrayRef]) -> Vec<u32> {
        lexsort_with_position(columns, columns[0].len() as u32)
            .expect("lexsort")
            .values()
            .to_vec()
    }

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn names(rng: &mut Rng, rows: usize, distinct: u64, nulls: bool) -> ArrayRef {
        let mut b = StringDictionaryBuilder::<Int32Type>::new();
        for _ in 0..rows {
            if nulls && rng.below(5) == 0 {
                b.append_null();
            } else {
                // Names that share prefixes and differ in length.
                b.append_value(format!("node-{}", rng.below(distinct)));
            }
        }
        Arc::new(b.finish())
    }

    fn small_ints(rng: &mut Rng, rows: usize, nulls: bool) -> ArrayRef {
        Arc::new(Int32Array::from_iter((0..rows).map(|_| {
            (!(nulls && rng.below(4) == 0)).then(|| rng.below(9) as i32 - 4)
        })))
    }

    fn times(rng: &mut Rng, rows: usize) -> ArrayRef {
        const T0: i64 = 1_795_240_800_000_000;
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(
                (0..rows).map(|_| T0 + 1_000_000 * rng.below(20) as i64),
            )
            .with_timezone("UTC"),
        )
    }

    #[test]
    fn orders_as_lexsort_with_ties_in_row_order() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for rows in [0, 1, 2, 3, 17, 256, 1000, 4097] {
            for nulls in [false, true] {
                let cases: Vec<Vec<ArrayRef>> = vec![
                    vec![
                        names(&mut rng, rows, 7, false),
                        small_ints(&mut rng, rows, nulls),
                        times(&mut rng, rows),
                    ],
                    vec![
                        names(&mut rng, rows, 300, nulls),
                        names(&mut rng, rows, 3, nulls),
                        small_ints(&mut rng, rows, false),
                        times(&mut rng, rows),
                    ],
                    vec![small_ints(&mut rng, rows, nulls)],
                ];
                for columns in cases {
                    let ours = sorted_indices(&columns).expect("sort");
                    assert_eq!(ours.values().to_vec(), reference(&columns), "{rows} rows");
                }
            }
        }
    }

    #[test]
    fn keys_wider_than_64_bits_sort_as_u128() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let rows = 3000;
        let wide = |rng: &mut Rng, range: u64| -> ArrayRef {
            Arc::new(Int64Array::from_iter((0..rows).map(|_| {
                // Few distinct values, far apart: ties and a wide range.
                (rng.below(4) != 0).then(|| (rng.below(6) * (range / 6)) as i64 - 7)
            })))
        };
        let columns = [
            wide(&mut rng, 1 << 50),
            names(&mut rng, rows, 5, true),
            wide(&mut rng, 1 << 30),
        ];
        let plan = Plan::of(&columns, rows as u32)
            .expect("ordinals")
            .expect("packs");
        assert!(plan.bits > 64 && plan.bits <= 128, "{}", plan.bits);
        let ours = sorted_indices(&columns).expect("sort");
        assert_eq!(ours.values().to_vec(), reference(&columns));
    }

    #[test]
    fn a_dictionary_with_repeated_and_unused_strings_ranks_by_string() {
        // Keys 0 and 3 are the same string; "a" is never used.
        let keys = Int32Array::from(vec![3, 1, 0, 2, 3, 0]);
        let values = arrow_array::StringArray::from(vec!["m", "z", "b", "m", "a"]);
        let dictionary: ArrayRef = Arc::new(
            arrow_array::DictionaryArray::<Int32Type>::try_new(keys, Arc::new(values))
                .expect("dictionary"),
        );
        let columns = [dictionary];
        let ours = sorted_indices(&columns).expect("sort");
        // b (row 3), then m m m m in row order, then z (row 1).
        assert_eq!(ours.values().to_vec(), [3, 0, 2, 4, 5, 1]);
        assert_eq!(ours.values().to_vec(), reference(&columns));
    }

    #[test]
    fn keys_too_wide_to_pack_or_of_other_types_fall_back_to_lexsort() {
        let wide: ArrayRef = Arc::new(Int64Array::from(vec![i64::MAX, i64::MIN, 0, i64::MAX]));
        let columns = [Arc::clone(&wide), Arc::clone(&wide)];
        assert!(Plan::of(&columns, 4).expect("ordinals").is_none());
        assert_eq!(
            sorted_indices(&columns).expect("sort").values().to_vec(),
            [1, 2, 0, 3]
        );
        let flags: ArrayRef = Arc::new(BooleanArray::from(vec![true, false, true]));
        assert!(
            Plan::of(&[Arc::clone(&flags)], 3)
                .expect("ordinals")
                .is_none()
        );
        assert_eq!(
            sorted_indices(&[flags]).expect("sort").values().to_vec(),
            [1, 0, 2]
        );
    }

    #[test]
    fn columns_of_different_lengths_are_an_error() {
        let a: ArrayRef = Arc::new(Int32Array::from(vec![1, 2]));
        let b: ArrayRef = Arc::new(Int32Array::from(vec![1]));
        assert!(sorted_indices(&[a, b]).is_err());
    }
}
