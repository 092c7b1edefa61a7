//! gputel agent: samples GPUs (NVML), the host (/proc) and InfiniBand ports (/sys),
//! and streams batches of rows to a collector over gRPC.

pub mod sampler;
