#!/usr/bin/env python3
"""How few bytes a value the stored metric values could take, column by column.

For each metric column of the gpu, node and ib tables in STORE (numeric and
not a key: the `metric_columns` of gputel-benches), taken per series (a GPU,
a node, an IB port) in time order, this computes the empirical order-0
entropy of the values, of their first differences and of their second
differences, and keeps the least: what an ideal coder that codes each
value alone, or its difference from the one before, would need. Beside it,
the bytes the column's chunks take in STORE's Parquet files. The sum over
all columns is a floor for coders of that kind (delta coding, as Parquet's
DELTA_BINARY_PACKED and VictoriaMetrics' do, and zstd above them). It is
no floor for a coder that predicts one column from another or from longer
history. Where most differences are distinct (a busy port's byte counts),
the plug-in estimate is below the true entropy, so the floor errs low.

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
    """Total bits of the order-0 entropy of `expr` over the column's values."""
    series = ", ".join(key)
    sql = f"""
        with v as (select {column} as x, ts, {series} from {src} where {column} is not null),
             d as (select {expr} as d from v),
             k as (select count(*) as k from d where d is not null group by d),
             n as (select sum(k) as n from k)
        select coalesce(sum(k * log2(n / k)), 0) from k, n"""
    return float(rows(duckdb, sql)[0][0])


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    duckdb, store = sys.argv[1], sys.argv[2]
    total_values = total_floor = total_stored = 0
    print(f"{'table':5s} {'column':28s} {'values':>9s} {'value':>7s} {'diff':>7s} {'diff2':>7s}"
          f" {'floor':>7s} {'stored':>7s}   (bytes a value)")
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
            floor = min(bits) / 8
            total_values += n
            total_floor += floor
            total_stored += stored.get(name, 0)
            per = [b / 8 / n for b in bits]
            print(f"{table:5s} {name:28s} {n:9d} {per[0]:7.3f} {per[1]:7.3f} {per[2]:7.3f}"
                  f" {floor / n:7.3f} {stored.get(name, 0) / n:7.3f}")
    print(f"all   {total_values} metric values: floor {total_floor / total_values:.3f} bytes a value"
          f" ({total_floor:.0f} bytes), their columns stored in {total_stored / total_values:.3f}"
          f" ({total_stored} bytes)")


if __name__ == "__main__":
    main()
