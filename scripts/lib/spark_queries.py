"""Runs gputel's characterization queries in Apache Spark (pyspark, local mode).

scripts/spark runs this with the Python environment that has pyspark; see
`scripts/spark --help`. The views are schemas/spark/views.sql, the queries
schemas/spark/<name>.sql: Spark SQL versions of schemas/sql/ (DuckDB), which
give the same results on the same store (tests/tests/spark.rs compares them).
"""

import argparse
import datetime
import decimal
import json
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPARK_SQL = os.path.join(ROOT, "schemas", "spark")

# A table view over a store directory: `CREATE OR REPLACE TEMPORARY VIEW t
# (columns) USING parquet OPTIONS (path '…', …)`.
TABLE_VIEW = re.compile(
    r"CREATE OR REPLACE TEMPORARY VIEW (\w+) \((.*)\)\s*USING parquet\s*"
    r"OPTIONS \(path '([^']*)'",
    re.DOTALL,
)
# Tables a store always has: without them the path is not a store.
REQUIRED_TABLES = {"gpu", "node_stored"}

DESCRIPTION = """\
Runs gputel's characterization queries (schemas/spark/*.sql, the Spark SQL
versions of schemas/sql/*.sql) in Apache Spark in local mode, on a store as the
collector wrote it: a directory, or an S3 bucket and prefix read through
Hadoop's S3A. Every table is a view over its directory with date and hour as
partition columns, so a filter on them reads only the matching directories.
"""

EPILOG = """\
examples:
  scripts/spark --store gputel-data per_job_utilization
  scripts/spark --store gputel-data --set cdf_window_s=15 fleet_cdf
  scripts/spark --store s3://telemetry/cluster-a --s3-endpoint http://10.0.0.5:9000 xid_failures
  scripts/spark --store gputel-data --explain \\
      --sql "SELECT count(*) FROM gpu WHERE date = DATE'2026-11-25' AND hour = 14"
  scripts/spark --list

S3: s3:// and s3a:// URLs are read through S3A (hadoop-aws). Credentials come
from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or S3A's other providers);
--s3-endpoint names an S3-compatible server (path-style requests). S3A needs
hadoop-aws and the AWS SDK it was built with on Spark's class path:
scripts/spark installs both (GPUTEL_SPARK_JARS); elsewhere give them with
--jars, or --packages org.apache.hadoop:hadoop-aws:<Spark's Hadoop version>
where Maven Central is reachable.

--explain prints each query's physical plan (PartitionFilters: the partition
directories a scan keeps) and, after running it, what every scan read: files
and partitions read against those in the table.
"""


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="scripts/spark",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("queries", nargs="*", metavar="QUERY",
                   help="a query of schemas/spark/ by name (fleet_cdf) or a .sql file; "
                        "several run in one Spark session")
    p.add_argument("--store", metavar="URL",
                   help="the store: a directory, file:/path, s3://bucket/prefix or s3a://…")
    p.add_argument("--sql", action="append", default=[], metavar="STATEMENT",
                   help="a Spark SQL statement to run after the views (repeatable)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a query variable: cdf_window_s (default NULL: no resampling), "
                        "cdf_points (default 21)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: each query's rows, seconds and scans")
    p.add_argument("--explain", action="store_true",
                   help="print the physical plan and the files and partitions each scan read")
    p.add_argument("--s3-endpoint", metavar="URL",
                   help="an S3-compatible server, e.g. http://127.0.0.1:9000 (path-style requests)")
    p.add_argument("--s3-region", metavar="REGION", help="the bucket's region")
    p.add_argument("--jars", default=os.environ.get("GPUTEL_SPARK_JARS", ""), metavar="JARS",
                   help="comma-separated jars for Spark's class path "
                        "(default: $GPUTEL_SPARK_JARS, the S3A jars scripts/spark installs)")
    p.add_argument("--packages", metavar="COORDS",
                   help="Maven coordinates Spark downloads (spark.jars.packages)")
    p.add_argument("--master", default="local[2]",
                   help="Spark master (default local[2])")
    p.add_argument("--shuffle-partitions", type=int, default=4, metavar="N",
                   help="spark.sql.shuffle.partitions (default 4)")
    p.add_argument("--list", action="store_true", help="list the queries and exit")
    args = p.parse_args(argv)
    if not args.list and not args.store:
        p.error("--store is required")
    if not args.list and not args.queries and not args.sql:
        p.error("name a query (--list shows them) or give --sql")
    return args


def query_names():
    return sorted(f[:-4] for f in os.listdir(SPARK_SQL) if f.endswith(".sql") and f != "views.sql")


def store_url(store):
    """A store path or URL as Hadoop reads it: s3:// as s3a://, a directory absolute."""
    if store.startswith("s3://"):
        return "s3a://" + store[len("s3://"):]
    if re.match(r"^[a-z][a-z0-9+.-]*:", store):
        return store.rstrip("/")
    return "file:" + os.path.abspath(store)


def statements(text):
    """A file's statements: each ends with a semicolon at the end of a line
    that is not a comment."""
    out, lines = [], []
    for line in text.splitlines():
        lines.append(line)
        if not line.strip().startswith("--") and line.rstrip().endswith(";"):
            out.append("\n".join(lines).rstrip()[:-1])
            lines = []
    out.append("\n".join(lines))
    return [
        s.strip() for s in out
        if any(line.strip() and not line.strip().startswith("--") for line in s.splitlines())
    ]


def substitute(text, variables):
    def value(m):
        name = m.group(1)
        if name not in variables:
            raise SystemExit(f"error: the SQL uses ${{{name}}}, which has no value (--set {name}=…)")
        return variables[name]

    return re.sub(r"\$\{(\w+)\}", value, text)


def session(args):
    os.environ["TZ"] = "UTC"
    time.tzset()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    b = (
        SparkSession.builder.appName("gputel")
        .master(args.master)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
        # The collector writes float columns BYTE_STREAM_SPLIT-encoded, which
        # Spark 3.5's vectorized Parquet reader cannot decode ("Unsupported
        # encoding: BYTE_STREAM_SPLIT"); parquet-mr's row reader can.
        .config("spark.sql.parquet.enableVectorizedReader", "false")
    )
    if args.jars:
        b = b.config("spark.jars", args.jars)
    if args.packages:
        b = b.config("spark.jars.packages", args.packages)
    if args.s3_endpoint:
        b = (
            b.config("spark.hadoop.fs.s3a.endpoint", args.s3_endpoint)
            .config("spark.hadoop.fs.s3a.path.style.access", "true")
            .config("spark.hadoop.fs.s3a.connection.ssl.enabled",
                    "true" if args.s3_endpoint.startswith("https:") else "false")
        )
    region = args.s3_region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        b = b.config("spark.hadoop.fs.s3a.endpoint.region", region)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def hadoop_path(spark, url):
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(url)
    return path, path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())


def parquet_files(spark, url):
    """The Parquet files under a table directory (none when it is missing)."""
    path, fs = hadoop_path(spark, url)
    if not fs.exists(path):
        return []
    files = []
    it = fs.listFiles(path, True)
    while it.hasNext():
        name = it.next().getPath().toString()
        if name.endswith(".parquet") and "/." not in name and "/_" not in name[len(url):]:
            files.append(name)
    return files


def create_views(spark, variables):
    with open(os.path.join(SPARK_SQL, "views.sql")) as f:
        text = substitute(f.read(), variables)
    for stmt in statements(text):
        m = TABLE_VIEW.search(stmt)
        if m and not parquet_files(spark, m.group(3)):
            view, columns, path = m.groups()
            if view in REQUIRED_TABLES:
                raise SystemExit(
                    f"error: no Parquet file under {path}: is {variables['store']} a gputel store?"
                )
            columns = "\n".join(line.split("--")[0] for line in columns.splitlines())
            spark.createDataFrame([], columns).createOrReplaceTempView(view)
            continue
        spark.sql(stmt)


def plain(value):
    """A Spark value as JSON: timestamps in UTC (ISO 8601, microseconds)."""
    if isinstance(value, datetime.datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def seq(scala_seq):
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def file_scans(plan):
    """Every file scan of an executed plan, adaptive stages included."""
    name = plan.getClass().getSimpleName()
    if name == "FileSourceScanExec":
        return [plan]
    if name == "AdaptiveSparkPlanExec":
        return file_scans(plan.executedPlan())
    if name.endswith("QueryStageExec"):
        return file_scans(plan.plan())
    if name == "ReusedExchangeExec":
        return file_scans(plan.child())
    return [scan for child in seq(plan.children()) for scan in file_scans(child)]


def metric(scan, name):
    m = scan.metrics().get(name)
    return int(m.get().value()) if m.isDefined() else None


def scans_read(spark, df):
    """What each file scan of an executed query read, against its table."""
    out = []
    for scan in file_scans(df._jdf.queryExecution().executedPlan()):
        roots = seq(scan.relation().location().rootPaths())
        root = roots[0].toString() if roots else ""
        files = parquet_files(spark, root) if root.endswith(tuple(["/" + t for t in TABLES])) else []
        partitions = {f.rsplit("/", 1)[0] for f in files}
        out.append({
            "table": root.rsplit("/", 1)[-1],
            "path": root,
            "partition_filters": scan.partitionFilters().mkString(", "),
            "files_read": metric(scan, "numFiles"),
            "partitions_read": metric(scan, "numPartitions"),
            "files_total": len(files),
            "partitions_total": len(partitions),
        })
    return out


def print_table(columns, rows):
    """Rows as an aligned text table."""
    def text(v):
        if v is None:
            return "NULL"
        if isinstance(v, float):
            return repr(v)
        if isinstance(v, (list, dict)):
            return json.dumps(v)
        return str(v)

    cells = [[text(r[c]) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())


TABLES = ("gpu", "node", "ib", "event", "alert", "gpu_process", "job", "scheduler_job")


def main(argv):
    args = parse_args(argv)
    if args.list:
        print("\n".join(query_names()))
        return 0
    variables = {"cdf_window_s": "NULL", "cdf_points": "21"}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"error: --set {item}: write NAME=VALUE")
        variables[name] = value
    variables["store"] = store_url(args.store)
    variables["xid_catalogue"] = "file:" + os.path.join(ROOT, "schemas", "xid", "xids.csv")

    jobs = []
    for q in args.queries:
        path = q if q.endswith(".sql") else os.path.join(SPARK_SQL, q + ".sql")
        if not os.path.exists(path):
            raise SystemExit(f"error: no query {q} (scripts/spark --list names them)")
        with open(path) as f:
            jobs.append((os.path.basename(path)[:-4], statements(substitute(f.read(), variables))))
    for n, stmt in enumerate(args.sql, 1):
        jobs.append((f"sql{n}" if len(args.sql) > 1 else "sql", [substitute(stmt, variables)]))

    started = time.monotonic()
    spark = session(args)
    session_s = time.monotonic() - started
    t = time.monotonic()
    create_views(spark, variables)
    views_s = time.monotonic() - t
    if not args.json:
        print(f"-- Spark {spark.version} up in {session_s:.1f} s; views over "
              f"{variables['store']} in {views_s:.1f} s", file=sys.stderr)

    results = {}
    for name, stmts in jobs:
        t = time.monotonic()
        try:
            for stmt in stmts[:-1]:
                spark.sql(stmt)
            df = spark.sql(stmts[-1])
        except Exception as e:
            raise SystemExit(f"error: {name}: {str(e).strip()}")
        if args.explain and not args.json:
            print(f"== {name}: physical plan")
            df.explain()
        rows = df.collect()
        seconds = time.monotonic() - t
        scans = scans_read(spark, df) if args.explain else []
        results[name] = {
            "rows": [plain(r.asDict(recursive=True)) for r in rows],
            "seconds": round(seconds, 3),
            "scans": scans,
        }
        if args.json:
            continue
        print(f"== {name}: {len(rows)} rows in {seconds:.2f} s")
        print_table(df.columns, results[name]["rows"])
        for s in scans:
            if s["table"] in TABLES:
                print(f"   scan of {s['table']}: read {s['files_read']} of {s['files_total']} files "
                      f"in {s['partitions_read']} of {s['partitions_total']} partitions "
                      f"(PartitionFilters: [{s['partition_filters']}])")
            else:
                print(f"   scan of {s['path']}: read {s['files_read']} files")
    if args.json:
        json.dump({"spark": spark.version, "session_s": round(session_s, 3),
                   "views_s": round(views_s, 3), "queries": results}, sys.stdout)
        print()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
