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
//! Keys whose columns do not fit in 128 bits, or of other types, are sorted
//! by `lexsort_to_indices` with the position as a last column.

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
    match packed_keys(columns, rows)? {
        Some(mut keys) => {
            keys.sort_unstable();
            let position_mask = (1u128 << position_bits(rows)) - 1;
            Ok(keys
                .into_iter()
                .map(|k| (k & position_mask) as u32)
                .collect())
        }
        None => {
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
    }
}

/// Bits that hold a row position below `rows`.
fn position_bits(rows: u32) -> u32 {
    u32::BITS - rows.saturating_sub(1).leading_zeros()
}

/// One column's order as integers: 0 for a null, else 1 + the value's
/// place, ordered as the column's values are.
struct Ordinals {
    /// Bits the largest ordinal takes.
    bits: u32,
    /// Each row's ordinal.
    values: Vec<u64>,
}

impl Ordinals {
    fn new(max: u64, values: Vec<u64>) -> Self {
        Self {
            bits: u64::BITS - max.leading_zeros(),
            values,
        }
    }
}

/// Each row's key packed into a `u128`: the columns' ordinals from the most
/// significant bits down, the row's position in the lowest. `None` when a
/// column's type has no ordinals here or the key needs more than 128 bits.
fn packed_keys(columns: &[ArrayRef], rows: u32) -> Result<Option<Vec<u128>>, ArrowError> {
    let mut ordinals = Vec::with_capacity(columns.len());
    let mut bits = position_bits(rows);
    for column in columns {
        let Some(o) = ordinals_of(column)? else {
            return Ok(None);
        };
        bits += o.bits;
        if bits > u128::BITS {
            return Ok(None);
        }
        ordinals.push(o);
    }
    let mut keys: Vec<u128> = (0..rows).map(u128::from).collect();
    let mut shift = position_bits(rows);
    for o in ordinals.iter().rev() {
        if o.bits > 0 {
            for (key, &ordinal) in keys.iter_mut().zip(&o.values) {
                *key |= u128::from(ordinal) << shift;
            }
        }
        shift += o.bits;
    }
    Ok(Some(keys))
}

fn ordinals_of(column: &ArrayRef) -> Result<Option<Ordinals>, ArrowError> {
    Ok(match column.data_type() {
        DataType::Int32 => integer_ordinals::<Int32Type>(column, i64::from),
        DataType::Int64 => integer_ordinals::<Int64Type>(column, |v| v),
        DataType::UInt32 => integer_ordinals::<UInt32Type>(column, i64::from),
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            integer_ordinals::<TimestampMicrosecondType>(column, |v| v)
        }
        DataType::Dictionary(key, value)
            if **key == DataType::Int32 && **value == DataType::Utf8 =>
        {
            Some(dictionary_ordinals(column)?)
        }
        _ => None,
    })
}

/// Ordinals of an integer column: 1 + the distance from its least value;
/// `None` when that does not fit in 64 bits (a range of nearly all of i64).
fn integer_ordinals<T: ArrowPrimitiveType>(
    column: &ArrayRef,
    wide: impl Fn(T::Native) -> i64,
) -> Option<Ordinals> {
    let array: &PrimitiveArray<T> = column.as_primitive::<T>();
    let (min, max) = array
        .iter()
        .flatten()
        .map(&wide)
        .fold((i64::MAX, i64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if min > max {
        // No value: every ordinal 0.
        return Some(Ordinals::new(0, vec![0; array.len()]));
    }
    // max - min + 1 fits in u64 unless the range spans nearly all of i64.
    let top = u64::try_from(i128::from(max) - i128::from(min) + 1).ok()?;
    let values = array
        .iter()
        .map(|v| v.map_or(0, |v| wide(v).abs_diff(min) + 1))
        .collect();
    Some(Ordinals::new(top, values))
}

/// Ordinals of a dictionary of strings: 1 + the rank of the row's string
/// among the dictionary's distinct strings (a dictionary may hold a string
/// twice; both entries get its rank).
fn dictionary_ordinals(column: &ArrayRef) -> Result<Ordinals, ArrowError> {
    let dictionary = column.as_dictionary::<Int32Type>();
    let strings = dictionary.values().as_string::<i32>();
    let order = sort_to_indices(dictionary.values(), None, None)?;
    let mut rank = vec![0u64; strings.len()];
    let mut next = 0u64;
    let mut previous: Option<&str> = None;
    for &i in order.values() {
        let i = i as usize;
        // A null entry of the dictionary orders as a null row: rank 0.
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
    let keys = dictionary.keys();
    let values = (0..keys.len())
        .map(|row| {
            if keys.is_null(row) {
                0
            } else {
                rank[keys.value(row) as usize]
            }
        })
        .collect();
    Ok(Ordinals::new(next, values))
}

#[cfg(test)]
mod tests {
    use arrow_array::builder::StringDictionaryBuilder;
    use arrow_array::{BooleanArray, Int32Array, Int64Array, TimestampMicrosecondArray};

    use super::*;

    /// What `lexsort_to_indices` gives with the position as a last column.
    fn reference(columns: &[ArrayRef]) -> Vec<u32> {
        let rows = columns[0].len() as u32;
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
        assert!(packed_keys(&columns, 4).expect("ordinals").is_none());
        assert_eq!(
            sorted_indices(&columns).expect("sort").values().to_vec(),
            [1, 2, 0, 3]
        );
        let flags: ArrayRef = Arc::new(BooleanArray::from(vec![true, false, true]));
        assert!(
            packed_keys(&[Arc::clone(&flags)], 3)
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
