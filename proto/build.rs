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
    // Labels in key order, so that a row's map is the same every time.
    config = config.btree_map(".gputel.v1.GpuSample.pod_labels");
    // The collector's server is generated below with its own codec; agents
    // use this client.
    config.build_server(false).compile_fds(descriptors)?;

    // The collector receives each agent message raw and decodes it only
    // once it knows the memory that takes (see `src/wire.rs`).
    let stream = tonic_build::manual::Method::builder()
        .name("stream")
        .route_name("Stream")
        .input_type("crate::wire::RawAgentMessage")
        .output_type("crate::v1::CollectorMessage")
        .codec_path("crate::wire::CollectorCodec")
        .client_streaming()
        .server_streaming()
        .build();
    let service = tonic_build::manual::Service::builder()
        .name("Telemetry")
        .package("gputel.v1")
        .method(stream)
        .build();
    tonic_build::manual::Builder::new()
        .build_client(false)
        .compile(&[service]);

    // The kubelet's pod-resources API: the agent's client, and the server
    // the tests' fake kubelet serves.
    let kubelet = "kubelet/podresources/v1/api.proto";
    println!("cargo:rerun-if-changed={kubelet}");
    let descriptors = protox::compile([kubelet], ["."])?;
    tonic_prost_build::configure()
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
