//! Compiles the wire protocol with protox (pure Rust), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["gputel/v1/telemetry.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["."])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
