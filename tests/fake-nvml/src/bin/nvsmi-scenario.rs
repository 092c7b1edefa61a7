//! `nvsmi-scenario capture.xml > scenario.toml`: turns `nvidia-smi -q -x`
//! output into a fake-NVML scenario (see the crate's README).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [path] = args.as_slice() else {
        eprintln!(
            "usage: nvsmi-scenario CAPTURE.xml > scenario.toml\n\
             Turns `nvidia-smi -q -x` output into a gputel fake-NVML scenario."
        );
        return ExitCode::from(2);
    };
    let xml = match std::fs::read_to_string(path) {
        Ok(xml) => xml,
        Err(e) => {
            eprintln!("nvsmi-scenario: cannot read {path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match gputel_fake_nvml::nvsmi::convert(&xml) {
        Ok(toml) => {
            print!("{toml}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nvsmi-scenario: {path}: {e}");
            ExitCode::FAILURE
        }
    }
}
