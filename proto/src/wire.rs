//! The collector's side of the stream, decoded in two steps so that memory
//! is bounded before anything is allocated.
//!
//! Protobuf lets a few bytes stand for a large struct: an empty `GpuSample`
//! is two bytes on the wire and several hundred once decoded, so a 16 MiB
//! message of empty rows decodes into gigabytes. The collector's codec
//! therefore hands the stream raw messages ([`RawAgentMessage`]); the
//! collector takes a [`census`] of each (a walk over the wire format that
//! allocates nothing), refuses or waits for memory according to
//! [`Census::decoded_bytes_bound`], and only then decodes it with prost.

use std::mem::size_of;

use bytes::{Buf, Bytes};
use prost::encoding::{WireType, decode_key, decode_varint};
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

use crate::v1::{
    AgentMessage, CollectorMessage, GpuEvent, GpuProcess, GpuSample, IbPortSample, NodeSample,
};

/// One message of the agent's stream, not yet decoded.
#[derive(Debug, Clone)]
pub struct RawAgentMessage(pub Bytes);

/// The collector's codec: messages to the agent are encoded with prost,
/// messages from it are passed on raw.
#[derive(Debug, Clone, Copy, Default)]
pub struct CollectorCodec;

/// Each stream's decode buffer starts at this size and grows by it
/// (tonic's default is 8 KiB): a collector holds one stream per agent, and
/// a batch of 8 GPUs takes a few KiB, so the default is mostly empty at
/// 1000 agents.
pub const STREAM_BUFFER_BYTES: usize = 2048;

/// Each stream's encode buffer, for what the collector sends: an ack is a
/// dozen bytes with its gRPC header, a welcome a few dozen. Acks are sent as
/// they come, each a slice of this buffer, and the buffer starts again at
/// its front once h2 has written them, so it is written through in turn;
/// 128 bytes rather than 2 KiB keeps up to 1.9 KB less of each stream
/// resident (1.6 KB after 150 s of acks, benches/README.md). A larger
/// message (a reject's text) grows it.
pub const ACK_BUFFER_BYTES: usize = 128;

fn buffer_settings(size: usize) -> BufferSettings {
    // Acks are sent as they come; there is rarely more than one to batch.
    BufferSettings::new(size, 8 * STREAM_BUFFER_BYTES)
}

impl Codec for CollectorCodec {
    type Encode = CollectorMessage;
    type Decode = RawAgentMessage;
    type Encoder = ProstEncoder<CollectorMessage>;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(buffer_settings(ACK_BUFFER_BYTES))
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawDecoder
    }
}

/// Takes a whole message off tonic's buffer without copying it.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawDecoder;

impl Decoder for RawDecoder {
    type Item = RawAgentMessage;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        Ok(Some(RawAgentMessage(buf.copy_to_bytes(buf.remaining()))))
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer_settings(STREAM_BUFFER_BYTES)
    }
}

/// What kind of message a census found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No `kind` set.
    Empty,
    Hello,
    /// A batch, with its sequence number (0 when unset).
    Batch {
        seq: u64,
    },
}

/// What an encoded [`AgentMessage`] holds, counted without decoding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Census {
    pub kind: Kind,
    /// Encoded size of the whole message.
    pub bytes: usize,
    /// Rows of a batch, per table.
    pub gpu: u64,
    pub node: u64,
    pub ib: u64,
    pub event: u64,
    pub gpu_process: u64,
    /// Entries of repeated string fields (`NodeSample.jobs`).
    pub list_strings: u64,
    /// Non-empty string fields, each of which is one heap allocation.
    pub strings: u64,
}

/// Bytes one heap allocation may take beyond what it was asked for: a
/// string of up to 8 bytes still gets 8, and glibc's malloc rounds every
/// request up to 16 bytes plus an 8-byte header, 32 at the least.
const ALLOCATION_OVERHEAD: u64 = 32;

impl Census {
    /// Rows in the batch, all tables together.
    pub fn rows(&self) -> u64 {
        self.gpu + self.node + self.ib + self.event + self.gpu_process
    }

    /// An upper bound of the memory decoding this message takes, the
    /// encoded bytes included: each repeated field becomes a `Vec` of at
    /// most twice its length (at least four), each non-empty string one allocation of at
    /// most its encoded length plus [`ALLOCATION_OVERHEAD`], and nothing
    /// else in these messages allocates.
    pub fn decoded_bytes_bound(&self) -> u64 {
        let bytes = self.bytes as u64;
        bytes
            + size_of::<AgentMessage>() as u64
            + vec_of::<GpuSample>(self.gpu)
            + vec_of::<NodeSample>(self.node)
            + vec_of::<IbPortSample>(self.ib)
            + vec_of::<GpuEvent>(self.event)
            + vec_of::<GpuProcess>(self.gpu_process)
            // One list per node row.
            + 2 * self.list_strings * size_of::<String>() as u64
            + self.node * MIN_VEC_CAPACITY * size_of::<String>() as u64
            // String contents are at most the encoded bytes (counted once
            // more, as the raw message is still held while decoding).
            + bytes
            + self.strings * ALLOCATION_OVERHEAD
    }
}

/// The capacity a `Vec` of elements up to 1 KiB takes at its first push.
const MIN_VEC_CAPACITY: u64 = 4;

/// The most a `Vec` of `n` elements grown one push at a time can take:
/// capacity doubles, from [`MIN_VEC_CAPACITY`].
fn vec_of<T>(n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    (2 * n).max(MIN_VEC_CAPACITY) * size_of::<T>() as u64
}

/// Why a message could not be counted: it is not valid protobuf, or not in
/// the shape of an `AgentMessage`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed message: {}", self.0)
    }
}

impl std::error::Error for Malformed {}

/// Counts what an encoded [`AgentMessage`] holds. Allocates nothing and
/// reads each byte once; a message it accepts may still fail to decode
/// (a bad enum value, invalid UTF-8), which prost then reports.
pub fn census(message: &[u8]) -> Result<Census, Malformed> {
    let mut census = Census {
        kind: Kind::Empty,
        bytes: message.len(),
        gpu: 0,
        node: 0,
        ib: 0,
        event: 0,
        gpu_process: 0,
        list_strings: 0,
        strings: 0,
    };
    let mut buf = message;
    while buf.has_remaining() {
        match field(&mut buf)? {
            (1, Value::Bytes(hello)) => {
                census.kind = Kind::Hello;
                census.strings += count_strings(hello, None)?.0;
            }
            (2, Value::Bytes(batch)) => count_batch(batch, &mut census)?,
            (1 | 2, _) => return Err(malformed("the message's kind is not length-delimited")),
            _ => {}
        }
    }
    Ok(census)
}

fn count_batch(mut batch: &[u8], census: &mut Census) -> Result<(), Malformed> {
    // A batch field seen twice is merged by prost: the rows of both are
    // decoded, so both are counted; the last sequence number wins.
    let mut seq = match census.kind {
        Kind::Batch { seq } => seq,
        _ => 0,
    };
    while batch.has_remaining() {
        let (number, value) = field(&mut batch)?;
        let row = match (number, value) {
            (1, Value::Varint(v)) => {
                seq = v;
                continue;
            }
            (2..=6, Value::Bytes(row)) => row,
            (1..=6, _) => return Err(malformed("a batch field has the wrong wire type")),
            _ => continue,
        };
        // A node row's jobs (field 13) are a list: each entry is a slot of
        // its `Vec` as well as a string.
        let list = (number == 3).then_some(13);
        let (strings, entries) = count_strings(row, list)?;
        census.strings += strings;
        census.list_strings += entries;
        match number {
            2 => census.gpu += 1,
            3 => census.node += 1,
            4 => census.ib += 1,
            5 => census.event += 1,
            _ => census.gpu_process += 1,
        }
    }
    census.kind = Kind::Batch { seq };
    Ok(())
}

/// Non-empty length-delimited fields of a message whose length-delimited
/// fields are all strings (every row type and the hello), and the
/// occurrences of field `list` among them, in one pass.
fn count_strings(mut message: &[u8], list: Option<u32>) -> Result<(u64, u64), Malformed> {
    let (mut strings, mut entries) = (0, 0);
    while message.has_remaining() {
        let (number, value) = field(&mut message)?;
        if Some(number) == list {
            entries += 1;
        }
        if let Value::Bytes(b) = value
            && !b.is_empty()
        {
            strings += 1;
        }
    }
    Ok((strings, entries))
}

/// The bytes of field `number` of a message when it occurs exactly once,
/// length-delimited: a batch's encoding inside the message that carried it,
/// for instance, which the collector logs as received instead of encoding
/// the decoded batch again. None when it is absent, repeated (prost would
/// merge the occurrences) or not length-delimited, or the message is
/// malformed.
pub fn single_field(mut message: &[u8], number: u32) -> Option<&[u8]> {
    let mut found = None;
    while message.has_remaining() {
        let (n, value) = field(&mut message).ok()?;
        if n != number {
            continue;
        }
        // Twice, or not length-delimited: not one field's bytes.
        let Value::Bytes(bytes) = value else {
            return None;
        };
        if found.replace(bytes).is_some() {
            return None;
        }
    }
    found
}

enum Value<'a> {
    Varint(u64),
    Fixed,
    Bytes(&'a [u8]),
}

/// Reads one field off `buf`.
fn field<'a>(buf: &mut &'a [u8]) -> Result<(u32, Value<'a>), Malformed> {
    let (number, wire_type) = decode_key(buf).map_err(|e| malformed(&e.to_string()))?;
    let value = match wire_type {
        WireType::Varint => {
            Value::Varint(decode_varint(buf).map_err(|e| malformed(&e.to_string()))?)
        }
        WireType::SixtyFourBit => {
            take(buf, 8)?;
            Value::Fixed
        }
        WireType::ThirtyTwoBit => {
            take(buf, 4)?;
            Value::Fixed
        }
        WireType::LengthDelimited => {
            let len = decode_varint(buf).map_err(|e| malformed(&e.to_string()))?;
            let len = usize::try_from(len).map_err(|_| malformed("length out of range"))?;
            Value::Bytes(take(buf, len)?)
        }
        WireType::StartGroup | WireType::EndGroup => {
            return Err(malformed("groups are not used by this protocol"));
        }
    };
    Ok((number, value))
}

fn take<'a>(buf: &mut &'a [u8], len: usize) -> Result<&'a [u8], Malformed> {
    if buf.len() < len {
        return Err(malformed("a field runs past the end of its message"));
    }
    let (head, tail) = buf.split_at(len);
    *buf = tail;
    Ok(head)
}

fn malformed(reason: &str) -> Malformed {
    Malformed(reason.to_owned())
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::v1::{Batch, Hello, agent_message};

    fn batch(batch: Batch) -> Vec<u8> {
        AgentMessage {
            kind: Some(agent_message::Kind::Batch(batch)),
        }
        .encode_to_vec()
    }

    #[test]
    fn counts_rows_strings_and_the_sequence_number() {
        let message = batch(Batch {
            seq: 42,
            gpu: vec![
                GpuSample {
                    uuid: "GPU-1".into(),
                    model: "NVIDIA H100".into(),
                    ..Default::default()
                },
                GpuSample::default(),
            ],
            node: vec![NodeSample {
                jobs: vec!["1".into(), "2".into(), String::new()],
                ..Default::default()
            }],
            ib: vec![IbPortSample::default(); 3],
            event: vec![GpuEvent::default()],
            gpu_process: vec![GpuProcess {
                command: "python".into(),
                ..Default::default()
            }],
        });
        let census = census(&message).unwrap();
        assert_eq!(census.kind, Kind::Batch { seq: 42 });
        assert_eq!(census.bytes, message.len());
        assert_eq!(
            (
                census.gpu,
                census.node,
                census.ib,
                census.event,
                census.gpu_process
            ),
            (2, 1, 3, 1, 1)
        );
        assert_eq!(census.rows(), 8);
        assert_eq!(census.list_strings, 3);
        // uuid, model, two jobs, command; the empty job allocates nothing.
        assert_eq!(census.strings, 5);
    }

    #[test]
    fn a_hello_and_an_empty_message() {
        let hello = AgentMessage {
            kind: Some(agent_message::Kind::Hello(Hello {
                node: "node-a".into(),
                agent_id: "a".into(),
                ..Default::default()
            })),
        }
        .encode_to_vec();
        let census = census(&hello).unwrap();
        assert_eq!(census.kind, Kind::Hello);
        assert_eq!((census.rows(), census.strings), (0, 2));
        assert_eq!(super::census(&[]).unwrap().kind, Kind::Empty);
    }

    #[test]
    fn empty_rows_are_bounded_by_their_decoded_size() {
        let rows = 10_000;
        let message = batch(Batch {
            seq: 1,
            gpu: vec![GpuSample::default(); rows],
            ..Default::default()
        });
        // Two bytes a row on the wire, hundreds decoded.
        assert!(message.len() < 3 * rows);
        let bound = census(&message).unwrap().decoded_bytes_bound();
        assert!(bound >= (rows * size_of::<GpuSample>()) as u64);
        assert!(bound <= (2 * rows * size_of::<GpuSample>() + 4 * message.len() + 1024) as u64);
    }

    #[test]
    fn a_single_field_is_found_and_a_repeated_one_is_not() {
        let inner = Batch {
            seq: 3,
            gpu: vec![GpuSample::default()],
            ..Default::default()
        };
        let message = batch(inner.clone());
        assert_eq!(single_field(&message, 2), Some(&inner.encode_to_vec()[..]));
        assert_eq!(single_field(&message, 1), None);
        let twice = [message.clone(), message].concat();
        assert_eq!(single_field(&twice, 2), None);
        // Field 2 as a varint.
        assert_eq!(single_field(&[0x10, 0x01], 2), None);
    }

    #[test]
    fn malformed_messages_are_refused_with_a_reason() {
        let good = batch(Batch {
            seq: 7,
            gpu: vec![GpuSample {
                uuid: "GPU-1".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        let truncated = &good[..good.len() - 1];
        assert_eq!(
            census(truncated).unwrap_err().to_string(),
            "malformed message: a field runs past the end of its message"
        );
        // Field 2 (batch) as a varint.
        assert_eq!(
            census(&[0x10, 0x01]).unwrap_err().to_string(),
            "malformed message: the message's kind is not length-delimited"
        );
        // A group start.
        assert!(census(&[0x0b]).is_err());
        // A length far past the end.
        assert!(census(&[0x12, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
    }
}
