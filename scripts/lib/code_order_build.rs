//! The build script of the agent and the collector (their Cargo.toml's
//! `build`): links the program's code in the order `scripts/package` asks
//! for.
//!
//! With `GPUTEL_AGENT_CODE_ORDER` or `GPUTEL_COLLECTOR_CODE_ORDER` naming an
//! ordering file (symbols, one a line, as `code_order.py resolve` writes
//! them for this build), lld lays those functions out first, together: the
//! code the program runs at work then fills a few MB of pages instead of
//! being spread over all of its executable, and only those pages are mapped
//! into it. Unset, the link is the default one.

fn main() {
    // The package and its one program share a name: gputel-agent, gputel-collector.
    let program = std::env::var("CARGO_PKG_NAME").expect("cargo sets CARGO_PKG_NAME");
    let order_var = format!(
        "GPUTEL_{}_CODE_ORDER",
        program.trim_start_matches("gputel-").to_uppercase()
    );
    println!("cargo:rerun-if-env-changed={order_var}");
    let Some(order) = std::env::var_os(&order_var).filter(|v| !v.is_empty()) else {
        return;
    };
    let order = order
        .into_string()
        .unwrap_or_else(|_| panic!("{order_var} must be a UTF-8 path"));
    println!("cargo:rerun-if-changed={order}");
    println!("cargo:rustc-link-arg-bin={program}=-Wl,--symbol-ordering-file={order}");
}
