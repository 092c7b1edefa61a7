#!/usr/bin/env python3
"""How few bytes a value the stored metric values could take, column by column.

For each metric column of the gpu, node and ib tables in STORE (numeric and
not a key: the `metric_columns` of gputel-benches), taken per series (a GPU,
a node, an IB port) in time order, this computes the empirical order-0
entropy of the values, of their first differences and of their second
differences, and keeps the least: what an ideal coder that codes each
value, or its difference from the one before, alone would need. It does so
twice: with one code for the whole column ("pooled") and with a code for
each series ("series"). Beside them, the bytes the column's chunks take in
STORE's Parquet files.

These are estimates, not bounds on every coder. A coder that predicts one
column from another, or from longer histories, can go lower. The pooled
figure counts a run of zeros at the column's odds, not the series'. Counted
this way (the plug-in estimate) no figure can exceed log2 of the values it
counts in bits a value: the per-series figure log2 of a series' length,
the pooled one log2 of the column's (18.8 bits, 2.35 bytes, for 460 800
values). Both are far below the truth where the values are nearly all
distinct (a GPU's power readings, a busy port's byte counts).

So a third figure, "binned", counts the values of 2^16 or more in
magnitude, which are too spread for their counts to say anything, the way
a histogram estimates a density's entropy: in bins of 2^k, k the least for
which the bins average 16 values, each value within its bin taken as
uniform among the multiples of the largest power of two dividing every
such value (4 for byte counters counted in 4-byte words). A density smooth
at the bins' width comes out near its entropy; one with structure inside
a bin comes out above it. Values under 2^16 are counted as before, each
for itself, and so are all of a column's values when fewer than 64 are
wide. It is the pooled estimate with that correction, and the
column's floor where it is the least of the three expressions.

    entropy-floor.py DUCKDB STORE
"""

import collections
import math
import subprocess
import sys

TABLES = {"gpu": ["node", "gpu"], "node": ["node"], "ib": ["node", "device", "port"]}
# gputel-benches' KEY_COLUMNS that are numeric.
KEYS = {"ts", "gpu", "port", "gpu_instance_id", "compute_instance_id"}
NUMERIC = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER",
           "UBIGINT", "FLOAT", "DOUBLE")


def rows(duckdb, sql):
    out = subprocess.run([duckdb, "-csv", "-noheader", "-c", sql], capture_output=True,
                         text=True, check=True).stdout
    return [line.split(",") for line in out.strip().splitlines()]


# Values at least this large in magnitude are binned (see the docstring).
WIDE = 1 << 16
# Values a bin holds on average, at the least, when wide values are binned.
PER_BIN = 16


def plug_in_bits(counts):
    """Total bits of the order-0 entropy of values with these counts."""
    n = sum(counts)
    return sum(k * math.log2(n / k) for k in counts)


def binned_estimate_bits(values):
    """Total bits of the pooled estimate of values with these counts ({value:
    count}), with the values of WIDE or more in magnitude binned: each value
    under WIDE coded for itself, the others by their bin of 2^k and their
    place in it (see the docstring)."""
    wide = {d: k for d, k in values.items() if abs(d) >= WIDE}
    n_wide = sum(wide.values())
    if n_wide < 4 * PER_BIN:
        return plug_in_bits(list(values.values()))
    # The symbols: each small value, and "wide" once.
    bits = plug_in_bits([k for d, k in values.items() if abs(d) < WIDE] + [n_wide])
    # The largest power of two dividing every wide value.
    step = min((abs(d) & -abs(d)).bit_length() - 1 for d in wide)
    k = step
    while True:
        bins = collections.Counter()
        for d, c in wide.items():
            bins[d >> k] += c
        if len(bins) * PER_BIN <= n_wide:
            return bits + plug_in_bits(list(bins.values())) + n_wide * (k - step)
        k += 1


def entropy_bits(duckdb, src, column, key, expr, integer):
    """Total bits of the order-0 entropy of `expr` over the column's values,
    from one reading of its counts per series: pooled (one code for every
    series), per series (a code each), and pooled with wide values binned
    (integer columns; floats, few-valued here, as pooled)."""
    series = ", ".join(key)
    value = f"({expr})::hugeint" if integer else f"({expr})"
    sql = f"""
        with v as (select {column} as x, ts, {series} from {src} where {column} is not null),
             d as (select {value} as d, {series} from v)
        select d, count(*), {series} from d where d is not null group by all"""
    pooled = collections.Counter()
    per_series = collections.defaultdict(list)
    for d, k, *s in rows(duckdb, sql):
        pooled[d] += int(k)
        per_series[tuple(s)].append(int(k))
    plug_in = plug_in_bits(list(pooled.values()))
    binned = (binned_estimate_bits({int(d): k for d, k in pooled.items()}) if integer
              else plug_in)
    return plug_in, sum(plug_in_bits(c) for c in per_series.values()), binned


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    duckdb, store = sys.argv[1], sys.argv[2]
    total_values = total_stored = 0
    total_pooled = total_series = total_binned = 0.0
    print(f"{'table':5s} {'column':28s} {'values':>9s} {'value':>13s} {'diff':>13s} {'diff2':>13s}"
          f" {'floor':>13s} {'binned':>7s} {'stored':>7s}")
    print(f"{'':5s} {'':28s} {'':>9s}" + f" {'pooled/series':>13s}" * 4 + f" {'':>7s} {'':>7s}")
    for table, key in TABLES.items():
        files = f"{store}/{table}/*/*/*.parquet"
        src = f"read_parquet('{files}', hive_partitioning = false)"
        stored = {path: int(size) for path, size in rows(duckdb, f"""
            select replace(path_in_schema, ', ', '.'), sum(total_compressed_size)
            from parquet_metadata('{files}') group by 1""")}
        for name, kind in (r[:2] for r in rows(duckdb, f"describe select * from {src}")):
            if kind not in NUMERIC or name in KEYS:
                continue
            n = int(rows(duckdb, f"select count({name}) from {src}")[0][0])
            if n == 0:
                continue
            lag = f"lag(x, %d) over (partition by {', '.join(key)} order by ts)"
            integer = kind not in ("FLOAT", "DOUBLE")
            bits = [
                entropy_bits(duckdb, src, name, key, expr, integer)
                for expr in ("x", f"x - {lag % 1}", f"x - 2 * {lag % 1} + {lag % 2}")
            ]
            pooled, series, binned = (min(b[i] for b in bits) / 8 for i in range(3))
            total_values += n
            total_pooled += pooled
            total_series += series
            total_binned += binned
            total_stored += stored.get(name, 0)
            cells = " ".join(f"{b[0] / 8 / n:6.3f}/{b[1] / 8 / n:6.3f}" for b in bits)
            print(f"{table:5s} {name:28s} {n:9d} {cells} {pooled / n:6.3f}/{series / n:6.3f}"
                  f" {binned / n:7.3f} {stored.get(name, 0) / n:7.3f}")
    print(f"all   {total_values} metric values, bytes a value: floor {total_pooled / total_values:.3f}"
          f" with one code a column ({total_pooled:.0f} bytes), {total_series / total_values:.3f} with"
          f" one code a series ({total_series:.0f} bytes), {total_binned / total_values:.3f} with one"
          f" code a column and wide values binned ({total_binned:.0f} bytes); their columns stored in"
          f" {total_stored / total_values:.3f} ({total_stored} bytes)")


if __name__ == "__main__":
    main()
