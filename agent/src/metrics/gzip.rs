//! gzip (RFC 1952) of pages, with one deflate compressor kept from page to
//! page.
//!
//! `flate2::write::GzEncoder` allocates its compressor for every stream:
//! hash chains, window and symbol buffer, a few hundred KB, which the
//! kernel maps in anew each time. For a page a second that was ~29 page
//! faults and 0.18 ms of system CPU per gzip scrape, as much as the
//! compression itself (`benches/scripts/metrics-scrape.sh`). `Compress`
//! resets without reallocating, and made with `new_gzip` it writes the
//! gzip framing itself (a fixed header, the CRC-32 and length trailer),
//! taking the CRC as it copies the text into its window rather than in a
//! pass of its own. The deflate is zlib-rs (flate2's `zlib-rs` backend):
//! on the 89 KB page at level 1, 50 µs against miniz_oxide's 76 µs
//! (criterion `metrics_scrape/gzip`); with flate2's `runtime_detection`,
//! which lets zlib-rs pick its SIMD CRC-32 and matching for the CPU it runs
//! on, a page's compression and CRC take a third less again (78 → 53 µs,
//! `first_gzip_of_a_page`).

use std::io;

use flate2::{Compress, Compression, FlushCompress, Status};

/// A gzip compressor at one level; its deflate state is made on first use
/// and kept.
#[derive(Debug)]
pub(super) struct Gzip {
    level: u32,
    deflate: Option<Compress>,
}

impl Gzip {
    /// A compressor at flate2's `level` (0-9).
    pub(super) fn new(level: u32) -> Self {
        Self {
            level,
            deflate: None,
        }
    }

    /// `text` as one gzip member.
    pub(super) fn compress(&mut self, text: &[u8]) -> io::Result<Vec<u8>> {
        let level = self.level;
        let deflate = self
            .deflate
            .get_or_insert_with(|| Compress::new_gzip(Compression::new(level), 15));
        deflate.reset();
        // Pages compress about tenfold; the loop grows the buffer if not.
        let mut out = Vec::with_capacity(text.len() / 8 + 64);
        let mut rest = text;
        loop {
            let before = deflate.total_in();
            let status = deflate.compress_vec(rest, &mut out, FlushCompress::Finish)?;
            rest = &rest[(deflate.total_in() - before) as usize..];
            match status {
                Status::StreamEnd => return Ok(out),
                Status::Ok | Status::BufError => out.reserve(out.capacity().max(4096)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    fn gunzip(bytes: &[u8]) -> Vec<u8> {
        let mut text = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .read_to_end(&mut text)
            .expect("a gzip member");
        text
    }

    #[test]
    fn one_compressor_makes_members_that_decompress_to_their_text() {
        let mut gzip = Gzip::new(1);
        let page: Vec<u8> = (0..20_000)
            .flat_map(|i| format!("series{{gpu=\"{}\"}} {i}\n", i % 8).into_bytes())
            .collect();
        // Random bytes do not compress: the output grows past its first
        // buffer.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let noise: Vec<u8> = (0..100_000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        for text in [&page[..], b"", b"x", &noise, &page] {
            let member = gzip.compress(text).expect("compress");
            assert_eq!(gunzip(&member), text);
        }
        let member = gzip.compress(&page).expect("compress");
        assert!(member.len() * 4 < page.len(), "{}", member.len());
        // GzEncoder's framing at this level and others: the same header
        // but for its last byte, the OS (zlib's 3, Unix, where GzEncoder
        // writes 255, unknown), and the same trailer (CRC-32, length)
        // around a deflate stream of the same text. A reset compressor
        // writes what a new one writes.
        for level in [1, 6, 9] {
            let mut encoder = flate2::write::GzEncoder::new(Vec::new(), Compression::new(level));
            std::io::Write::write_all(&mut encoder, &page).expect("compress");
            let theirs = encoder.finish().expect("compress");
            let mut ours = Gzip::new(level);
            ours.compress(&noise).expect("compress");
            let reused = ours.compress(&page).expect("compress");
            assert_eq!(reused[..9], theirs[..9], "header, level {level}");
            assert_eq!(reused[9], 3, "OS, level {level}");
            assert_eq!(
                reused[reused.len() - 8..],
                theirs[theirs.len() - 8..],
                "trailer, level {level}"
            );
            assert_eq!(gunzip(&reused), page);
            assert!(reused.len().abs_diff(theirs.len()) <= 8, "level {level}");
            assert_eq!(
                reused,
                Gzip::new(level).compress(&page).expect("compress"),
                "level {level}"
            );
        }
    }
}
