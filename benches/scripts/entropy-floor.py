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
figure counts a run of zeros at the column's odds, not the series'. The
per-series figure cannot exceed log2 of a series' length in bits a value,
so it is far below the truth where a series' readings are all distinct (a
GPU's power readings, a busy port's byte counts).

    entropy-floor.py DUCKDB STORE
"""

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


def entropy_bits(duckdb, src, column, key, expr):
    """Total bits of the order-0 entropy of `expr` over the column's values:
    pooled (one code for every series) and per series (a code each)."""
    series = ", ".join(key)
    sql = f"""
        with v as (select {column} as x, ts, {series} from {src} where {column} is not null),
             d as (select {expr} as d, {series} from v),
             k as (select {series}, count(*) as k from d where d is not null group by {series}, d),
             s as (select {series}, sum(k) as n from k group by {series}),
             p as (select d, count(*) as k from d where d is not null group by d),
             n as (select sum(k) as n from p)
        select (select coalesce(sum(k * log2(n / k)), 0) from p, n),
               (select coalesce(sum(k * log2(n / k)), 0) from k join s using ({series}))"""
    pooled, per_series = rows(duckdb, sql)[0]
    return float(pooled), float(per_series)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    duckdb, store = sys.argv[1], sys.argv[2]
    total_values = total_stored = 0
    total_pooled = total_series = 0.0
    print(f"{'table':5s} {'column':28s} {'values':>9s} {'value':>13s} {'diff':>13s} {'diff2':>13s}"
          f" {'floor':>13s} {'stored':>7s}")
    print(f"{'':5s} {'':28s} {'':>9s}" + f" {'pooled/series':>13s}" * 4 + f" {'':>7s}")
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
            bits = [
                entropy_bits(duckdb, src, name, key, "x"),
                entropy_bits(duckdb, src, name, key, f"x - {lag % 1}"),
                entropy_bits(duckdb, src, name, key, f"x - 2 * {lag % 1} + {lag % 2}"),
            ]
            pooled = min(b[0] for b in bits) / 8
            series = min(b[1] for b in bits) / 8
            total_values += n
            total_pooled += pooled
            total_series += series
            total_stored += stored.get(name, 0)
            cells = " ".join(f"{b[0] / 8 / n:6.3f}/{b[1] / 8 / n:6.3f}" for b in bits)
            print(f"{table:5s} {name:28s} {n:9d} {cells} {pooled / n:6.3f}/{series / n:6.3f}"
                  f" {stored.get(name, 0) / n:7.3f}")
    print(f"all   {total_values} metric values, bytes a value: floor {total_pooled / total_values:.3f}"
          f" with one code a column ({total_pooled:.0f} bytes), {total_series / total_values:.3f} with"
          f" one code a series ({total_series:.0f} bytes); their columns stored in"
          f" {total_stored / total_values:.3f} ({total_stored} bytes)")


if __name__ == "__main__":
    main()
