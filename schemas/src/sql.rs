//! The shipped DuckDB queries (schemas/sql/), built into the programs so
//! that a report can show the query behind each figure.

/// Every query file by name, views.sql first.
pub const FILES: [(&str, &str); 16] = [
    ("views.sql", include_str!("../sql/views.sql")),
    (
        "failure_share.sql",
        include_str!("../sql/failure_share.sql"),
    ),
    ("fleet_cdf.sql", include_str!("../sql/fleet_cdf.sql")),
    (
        "gpu_time_share.sql",
        include_str!("../sql/gpu_time_share.sql"),
    ),
    (
        "ib_idle_share.sql",
        include_str!("../sql/ib_idle_share.sql"),
    ),
    (
        "idle_gpu_power.sql",
        include_str!("../sql/idle_gpu_power.sql"),
    ),
    (
        "job_duration_vs_utilization.sql",
        include_str!("../sql/job_duration_vs_utilization.sql"),
    ),
    (
        "job_imbalance.sql",
        include_str!("../sql/job_imbalance.sql"),
    ),
    (
        "jobs_with_gpu_events.sql",
        include_str!("../sql/jobs_with_gpu_events.sql"),
    ),
    (
        "per_job_utilization.sql",
        include_str!("../sql/per_job_utilization.sql"),
    ),
    (
        "throttle_time.sql",
        include_str!("../sql/throttle_time.sql"),
    ),
    (
        "trace_job_cdf.sql",
        include_str!("../sql/trace_job_cdf.sql"),
    ),
    (
        "trace_job_type_cdf.sql",
        include_str!("../sql/trace_job_type_cdf.sql"),
    ),
    (
        "trace_job_types.sql",
        include_str!("../sql/trace_job_types.sql"),
    ),
    (
        "utilization_by_job_type.sql",
        include_str!("../sql/utilization_by_job_type.sql"),
    ),
    ("xid_failures.sql", include_str!("../sql/xid_failures.sql")),
];

/// The text of the query file `name` (e.g. "fleet_cdf.sql").
pub fn text(name: &str) -> Option<&'static str> {
    FILES.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_of_the_directory_is_built_in() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/sql");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".sql"))
            .collect();
        on_disk.sort();
        let mut built: Vec<String> = FILES.iter().map(|(n, _)| (*n).to_owned()).collect();
        built.sort();
        built.dedup();
        assert_eq!(built, on_disk);
        for (name, text) in FILES {
            assert_eq!(
                std::fs::read_to_string(format!("{dir}/{name}")).unwrap(),
                text
            );
        }
    }
}
