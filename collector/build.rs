//! Links the collector's code in the order `scripts/package` asks for.
//!
//! With `GPUTEL_CODE_ORDER` naming an ordering file (symbols, one a line,
//! as `scripts/lib/code_order.py resolve` writes them for this build),
//! lld lays those functions out first, together: the code a serving
//! collector runs then fills a few MB of pages instead of being spread over
//! all 16 MB of its executable, and only those pages are mapped into it.
//! Unset, the link is the default one.

fn main() {
    println!("cargo:rerun-if-env-changed=GPUTEL_CODE_ORDER");
    let Some(order) = std::env::var_os("GPUTEL_CODE_ORDER").filter(|v| !v.is_empty()) else {
        return;
    };
    let order = order
        .into_string()
        .expect("GPUTEL_CODE_ORDER must be a UTF-8 path");
    println!("cargo:rerun-if-changed={order}");
    println!("cargo:rustc-link-arg-bin=gputel-collector=-Wl,--symbol-ordering-file={order}");
}
