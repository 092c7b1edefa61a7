//! What the collector does with one message of an agent's stream, up to the
//! Arrow rows it buffers: decode, validate, append, build the record batches.
//! Whatever the bytes, nothing panics, and every batch that passes validation
//! builds its Arrow rows.
#![no_main]

use gputel_collector::buffer::WriteBuffer;
use gputel_collector::validate::{validate_batch, validate_hello};
use gputel_proto::AgentMessage;
use gputel_proto::agent_message::Kind;
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// 2026-11-21T00:00:00Z: the collector's clock, fixed so that runs repeat.
const NOW_US: i64 = 1_795_219_200_000_000;

fuzz_target!(|data: &[u8]| {
    let Ok(message) = AgentMessage::decode(data) else {
        return;
    };
    match message.kind {
        Some(Kind::Hello(hello)) => {
            let _ = validate_hello(&hello);
        }
        Some(Kind::Batch(batch)) => {
            let Ok(valid) = validate_batch(&batch, NOW_US) else {
                return;
            };
            let mut buffer = WriteBuffer::default();
            buffer.append("node-1", valid);
            let buffered = buffer.rows();
            let taken = buffer
                .take()
                .expect("every validated row converts to Arrow");
            let built: usize = taken.iter().map(|(_, _, b)| b.num_rows()).sum();
            assert!(built >= buffered, "{buffered} rows buffered, {built} built");
        }
        None => {}
    }
});
