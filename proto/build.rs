//! Compiles the wire protocol with protox (pure Rust), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["gputel/v1/telemetry.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["."])?;
    let mut config = tonic_prost_build::configure();
    // Rows serialize to JSON for `gputel-agent --once`.
    for message in [
        "GpuSample",
        "NodeSample",
        "IbPortSample",
        "GpuEvent",
        "GpuProcess",
    ] {
        config = config.type_attribute(
            format!(".gputel.v1.{message}"),
            "#[derive(serde::Serialize)]",
        );
    }
    config = config.field_attribute(
        ".gputel.v1.GpuEvent.kind",
        "#[serde(serialize_with = \"crate::serialize_event_kind\")]",
    );
    config = config.field_attribute(
        ".gputel.v1.GpuSample.profiling_source",
        "#[serde(serialize_with = \"crate::serialize_profiling_source\")]",
    );
    config.compile_fds(descriptors)?;
    Ok(())
}
