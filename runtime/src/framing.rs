//! The record framing of the agent's spool and the collector's write-ahead
//! log: `[payload length: u32 LE][xxh64 of the payload, seed 0: u64 LE][payload]`.
//! A reader stops at the first record that is short, too long or fails its
//! checksum: a crash mid-write leaves such a torn record at a file's end.

use twox_hash::XxHash64;

/// Bytes before each payload: its length and its checksum.
pub const HEADER_BYTES: usize = 12;
/// Largest payload written or read (64 MiB): a length above it is damage,
/// not a record.
pub const MAX_RECORD_BYTES: usize = 64 * 1024 * 1024;

/// A payload too large to frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("record of {bytes} bytes is too large (at most {MAX_RECORD_BYTES})")]
pub struct TooLarge {
    pub bytes: usize,
}

/// Why the bytes at some offset are not a whole, intact record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    ShortHeader,
    LengthOutOfRange,
    ShortRecord,
    Checksum,
}

impl Damage {
    /// The reason in words, as the logs give it.
    pub fn reason(self) -> &'static str {
        match self {
            Damage::ShortHeader => "short record header",
            Damage::LengthOutOfRange => "record length out of range",
            Damage::ShortRecord => "short record",
            Damage::Checksum => "checksum mismatch",
        }
    }
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for Damage {}

/// The payload with its header, ready to append.
pub fn frame(payload: &[u8]) -> Result<Vec<u8>, TooLarge> {
    let mut framed = Vec::with_capacity(HEADER_BYTES + payload.len());
    frame_into(payload, &mut framed)?;
    Ok(framed)
}

/// Appends the payload with its header to `out`, which holds records to be
/// written together; `out` is unchanged when the payload is too large.
pub fn frame_into(payload: &[u8], out: &mut Vec<u8>) -> Result<(), TooLarge> {
    let too_large = TooLarge {
        bytes: payload.len(),
    };
    if payload.len() > MAX_RECORD_BYTES {
        return Err(too_large);
    }
    let len = u32::try_from(payload.len()).map_err(|_| too_large)?;
    out.reserve(HEADER_BYTES + payload.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&XxHash64::oneshot(0, payload).to_le_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

/// The record at the start of `bytes`: its payload and the bytes it takes
/// with its header; None at the end of the bytes.
pub fn next_record(bytes: &[u8]) -> Result<Option<(&[u8], usize)>, Damage> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let Some((header, rest)) = bytes.split_first_chunk::<HEADER_BYTES>() else {
        return Err(Damage::ShortHeader);
    };
    let (len, hash) = header.split_at(4);
    let len = u32::from_le_bytes(len.try_into().map_err(|_| Damage::ShortHeader)?) as usize;
    let hash = u64::from_le_bytes(hash.try_into().map_err(|_| Damage::ShortHeader)?);
    if len > MAX_RECORD_BYTES {
        return Err(Damage::LengthOutOfRange);
    }
    let payload = rest.get(..len).ok_or(Damage::ShortRecord)?;
    if XxHash64::oneshot(0, payload) != hash {
        return Err(Damage::Checksum);
    }
    Ok(Some((payload, HEADER_BYTES + len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_damage_is_named() {
        let mut log = frame(b"first").expect("small");
        log.extend(frame(b"").expect("empty"));
        log.extend(frame(b"third record").expect("small"));
        // The layout other versions read: length, checksum, payload.
        assert_eq!(&log[..4], &5u32.to_le_bytes());
        assert_eq!(&log[4..12], &XxHash64::oneshot(0, b"first").to_le_bytes());

        let mut rest = log.as_slice();
        let mut payloads = Vec::new();
        while let Some((payload, used)) = next_record(rest).expect("intact") {
            payloads.push(payload.to_vec());
            rest = &rest[used..];
        }
        assert_eq!(
            payloads,
            [b"first".to_vec(), Vec::new(), b"third record".to_vec()]
        );

        let whole = frame(b"payload").expect("small");
        assert_eq!(next_record(&whole[..5]), Err(Damage::ShortHeader));
        assert_eq!(
            next_record(&whole[..whole.len() - 1]),
            Err(Damage::ShortRecord)
        );
        let mut flipped = whole.clone();
        flipped[HEADER_BYTES] ^= 1;
        assert_eq!(next_record(&flipped), Err(Damage::Checksum));
        let mut huge = whole;
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(next_record(&huge), Err(Damage::LengthOutOfRange));
        assert_eq!(
            frame(&vec![0; MAX_RECORD_BYTES + 1]),
            Err(TooLarge {
                bytes: MAX_RECORD_BYTES + 1
            })
        );
    }
}
