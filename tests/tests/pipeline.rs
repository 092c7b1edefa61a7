//! End to end: agent (fake NVML, fixture /proc and /sys) → gRPC → collector →
//! Parquet → the real DuckDB CLI.

use std::time::Duration;

use gputel_tests::{
    Running, SCENARIO_ENV, duckdb, duckdb_value, fixture_agent, start_collector, table_scan,
};
use serde_json::json;

const TICKS: u64 = 25;
const GPUS: u64 = 8;
/// Ports in tests/fixtures/sys/class/infiniband.
const IB_PORTS: u64 = 4;

/// Eight GPUs with constant readings, so stored values can be checked exactly.
const SCENARIO: &str = r#"
driver_version = "550.54.15"
[[gpu]]
count = 8
name = "NVIDIA H100 80GB HBM3"
fb_total_bytes = 85520809984
fb_used_bytes = 42949672960
temperature_c = 61
memory_temperature_c = 68
power_mw = 512000
sm_clock_mhz = 1980
memory_clock_mhz = 2619
gpu_util_pct = 97
memory_copy_util_pct = 41
enc_util_pct = 3
dec_util_pct = 9
fb_reserved_bytes = 566231040
"#;

fn summary_field(summary: &str, key: &str) -> u64 {
    summary
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {summary:?}"))
}

#[test]
fn every_row_the_agent_sends_is_queryable_in_duckdb() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let scenario = tmp.path().join("scenario.toml");
    std::fs::write(&scenario, SCENARIO).unwrap();

    let (collector, addr) = start_collector(&store, &["--flush-interval", "1s"]);

    let mut agent = fixture_agent("gpu-node-017");
    agent
        .args(["--collector", &format!("http://{addr}")])
        .args(["--interval", "100ms", "--ticks", &TICKS.to_string()])
        .args(["--slow-read-interval", "500ms"])
        .env(SCENARIO_ENV, &scenario);
    let agent = Running::spawn(agent).wait(Duration::from_secs(60));
    let summary = String::from_utf8_lossy(&agent.stdout).trim().to_owned();
    assert!(agent.status.success(), "agent failed: {summary}");
    assert_eq!(summary_field(&summary, "ticks"), TICKS, "{summary}");
    assert_eq!(summary_field(&summary, "acknowledged"), TICKS, "{summary}");
    assert_eq!(summary_field(&summary, "unacknowledged"), 0, "{summary}");
    let sent_gpu = summary_field(&summary, "gpu");
    let sent_node = summary_field(&summary, "node");
    let sent_ib = summary_field(&summary, "ib");
    assert_eq!(
        (sent_gpu, sent_node, sent_ib),
        (TICKS * GPUS, TICKS, TICKS * IB_PORTS)
    );

    let stopped = collector.terminate(Duration::from_secs(30));
    assert!(
        stopped.status.success(),
        "collector exit: {:?}",
        stopped.status
    );

    // Exactly the rows the agent had acknowledged, per table, none twice.
    for (table, sent, key) in [
        ("gpu", sent_gpu, "node, gpu, ts"),
        ("node", sent_node, "node, ts"),
        ("ib", sent_ib, "node, device, port, ts"),
    ] {
        let scan = table_scan(&store, table);
        assert_eq!(
            duckdb_value(tmp.path(), &format!("select count(*) from {scan}")),
            json!(sent),
            "{table}"
        );
        assert_eq!(
            duckdb_value(
                tmp.path(),
                &format!("select count(*) from (select distinct {key} from {scan})")
            ),
            json!(sent),
            "{table}: duplicate keys"
        );
    }

    // Types as readers see them: ts is TIMESTAMPTZ, date and hour come from
    // the path. Without `hive_types` DuckDB guesses the hour's type from the
    // partition values it finds ("05" stays text, "13" becomes BIGINT), so the
    // guess depends on the time of day: only a declared type is asserted.
    let types_of = |sql: String| -> Vec<(serde_json::Value, serde_json::Value)> {
        duckdb(tmp.path(), &sql)
            .iter()
            .map(|c| (c["column_name"].clone(), c["column_type"].clone()))
            .collect()
    };
    let gpu_files = format!("{}/gpu/**/*.parquet", store.display());
    assert_eq!(
        types_of(format!(
            "describe select ts, date from read_parquet('{gpu_files}', hive_partitioning = true)"
        )),
        [
            (json!("ts"), json!("TIMESTAMP WITH TIME ZONE")),
            (json!("date"), json!("DATE")),
        ]
    );
    assert_eq!(
        types_of(format!(
            "describe select date, hour from read_parquet('{gpu_files}', hive_partitioning = true, \
             hive_types = {{'date': DATE, 'hour': INTEGER}})"
        )),
        [
            (json!("date"), json!("DATE")),
            (json!("hour"), json!("INTEGER")),
        ]
    );
    // The partition of every row is its own UTC date and hour.
    assert_eq!(
        duckdb_value(
            tmp.path(),
            &format!(
                "select count(*) from {} where date <> cast(timezone('UTC', ts) as date) \
                 or cast(hour as integer) <> hour(timezone('UTC', ts))",
                table_scan(&store, "gpu")
            )
        ),
        json!(0)
    );

    // Values arrive as sampled: the scenario's constants, the fixtures' counters.
    let gpu = duckdb(
        tmp.path(),
        &format!(
            "select count(distinct gpu) as gpus, count(distinct uuid) as uuids, any_value(model) as model, \
             min(power_mw) as min_power, max(power_mw) as max_power, max(temperature_c) as temp, \
             max(memory_temperature_c) as mem_temp, max(sm_clock_mhz) as sm, max(gpu_util_pct) as util, \
             max(fb_used_bytes) as used, max(fb_total_bytes) as total, any_value(node) as node, \
             max(enc_util_pct) as enc, max(dec_util_pct) as dec, max(fb_reserved_bytes) as reserved, \
             count(distinct pci_bus_id) as buses, \
             string_agg(distinct pci_bus_id, ' ' order by pci_bus_id) filter (where gpu in (0, 7)) as bus_0_7 \
             from {}",
            table_scan(&store, "gpu")
        ),
    );
    assert_eq!(
        serde_json::Value::Object(gpu[0].clone()),
        json!({
            "gpus": 8, "uuids": 8, "model": "NVIDIA H100 80GB HBM3",
            "min_power": 512000, "max_power": 512000, "temp": 61, "mem_temp": 68,
            "sm": 1980, "util": 97, "used": 42949672960_u64, "total": 85520809984_u64,
            "node": "gpu-node-017",
            "enc": 3, "dec": 9, "reserved": 566231040_u64,
            // The fake's HGX bus numbers: one PCI address per GPU.
            "buses": 8, "bus_0_7": "00000000:18:00.0 00000000:DB:00.0"
        })
    );
    // The fixture's mlx5_0 port_rcv_data counts 4-byte words.
    assert_eq!(
        duckdb_value(
            tmp.path(),
            &format!(
                "select distinct rcv_bytes from {} where device = 'mlx5_0'",
                table_scan(&store, "ib")
            )
        ),
        json!(4 * 1_984_460_973_326_841_u64)
    );
    assert_eq!(
        duckdb_value(
            tmp.path(),
            &format!(
                "select distinct memory_total_kib from {}",
                table_scan(&store, "node")
            )
        ),
        json!(2_113_389_424_u64)
    );
    // The slow reads (energy, PCIe counters, graphics engine activity) are
    // in the rows of the first tick and of the first tick in each later
    // window of --slow-read-interval (500 ms), and only there: the tick on
    // its multiple, unless the agent woke late and skipped it (as it may
    // on a loaded machine), then the next one. power_avg_mw, the mean
    // power between two of them, is the scenario's 512 W give or take the
    // fake energy counter's millisecond steps: the reads are timed as they
    // are made, so a tick the agent woke late for does not skew it.
    let slow = duckdb(
        tmp.path(),
        &format!(
            "with g as (select *, ts = min(ts) over () as first, \
                    coalesce(epoch_us(ts) // 500000 \
                             <> epoch_us(lag(ts) over (partition by gpu order by ts)) // 500000, \
                             false) as new_interval \
                  from {}) \
             select count(*) filter (where energy_mj is not null) as slow_rows, \
               count(*) filter (where (energy_mj is not null) <> (first or new_interval)) as off_cadence, \
               count(*) filter (where (pcie_tx_bytes_per_s is not null) <> (energy_mj is not null and not first)) as pcie_off, \
               count(*) filter (where (gr_engine_active_pct is not null) <> (energy_mj is not null and not first)) as gr_off, \
               count(*) filter (where power_avg_mw is not null and power_avg_mw not between 480000 and 545000) as avg_off \
             from g",
            table_scan(&store, "gpu")
        ),
    );
    let slow_rows = slow[0]["slow_rows"].as_u64().expect("slow_rows");
    assert!(
        (8 * 2..=8 * (1 + TICKS / 5)).contains(&slow_rows),
        "{slow:?}"
    );
    assert_eq!(
        serde_json::Value::Object(slow[0].clone()),
        json!({"slow_rows": slow_rows, "off_cadence": 0, "pcie_off": 0, "gr_off": 0, "avg_off": 0})
    );
    // Rows of one tick share one timestamp, on a multiple of the interval.
    assert_eq!(
        duckdb_value(
            tmp.path(),
            &format!(
                "select count(*) from {} where epoch_us(ts) % 100000 <> 0",
                table_scan(&store, "gpu")
            )
        ),
        json!(0)
    );
    assert_eq!(
        duckdb_value(
            tmp.path(),
            &format!(
                "select count(distinct ts) from {}",
                table_scan(&store, "gpu")
            )
        ),
        json!(TICKS)
    );
}
