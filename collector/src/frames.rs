//! Agents' request bodies handed to tonic one part of a gRPC message at a
//! time: each message's 5-byte header on its own, then its body.
//!
//! tonic keeps one receive buffer per stream for the stream's life and never
//! shrinks it. Once it has read a message's header it reserves room for the
//! whole body beyond what the buffer already holds, even when the body is
//! already in it; and the buffer (`BytesMut`) can move what it holds to its
//! front only when that does not overlap. So a message a little larger than
//! the one before it, which agents send every 10th tick (the slow reads),
//! doubles the buffer: it settles at 3 to 5 times a message, 16 KiB a
//! stream with every field of 8 GPUs, 8 KiB with the load generator's rows
//! (benches/README.md, "each message's header apart from its body"). Handed a header
//! alone, tonic reserves the body's room in an empty buffer, which then moves
//! to its front and holds one message: the buffer stays at the largest
//! message (rounded up to a power of two from
//! [`gputel_proto::wire::STREAM_BUFFER_BYTES`]). The bytes are not copied:
//! each part is a slice of the frame h2 received.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};

/// gRPC's message prefix: a compression flag and a 4-byte big-endian length.
const HEADER_BYTES: usize = 5;

/// A request body whose data frames are cut where each gRPC message's header
/// and body begin. Frames other than data (trailers) pass as they come.
#[derive(Debug)]
pub struct MessageParts<B> {
    inner: B,
    /// What of the last data frame is not yet handed on.
    rest: Bytes,
    /// Where the stream is in its messages.
    at: At,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// In a header, of which `have` bytes passed; `len` holds the length's
    /// bytes seen so far.
    Header { have: usize, len: [u8; 4] },
    /// In a body, `left` bytes before the next header.
    Body { left: u64 },
}

const MESSAGE_START: At = At::Header {
    have: 0,
    len: [0; 4],
};

impl<B> MessageParts<B> {
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            rest: Bytes::new(),
            at: MESSAGE_START,
        }
    }

    /// Cuts the next part off `rest`: up to the end of the header or body
    /// the stream is in.
    fn next_part(&mut self) -> Bytes {
        match self.at {
            At::Header { have, mut len } => {
                let take = (HEADER_BYTES - have).min(self.rest.len());
                let part = self.rest.split_to(take);
                for (i, &byte) in part.iter().enumerate() {
                    // Byte 0 is the compression flag, for tonic to check.
                    if let Some(slot) = (have + i).checked_sub(1) {
                        len[slot] = byte;
                    }
                }
                let have = have + take;
                self.at = if have < HEADER_BYTES {
                    At::Header { have, len }
                } else {
                    match u32::from_be_bytes(len) {
                        0 => MESSAGE_START,
                        left => At::Body {
                            left: u64::from(left),
                        },
                    }
                };
                part
            }
            At::Body { left } => {
                let take = usize::try_from(left)
                    .unwrap_or(usize::MAX)
                    .min(self.rest.len());
                let part = self.rest.split_to(take);
                let left = left - take as u64;
                self.at = if left == 0 {
                    MESSAGE_START
                } else {
                    At::Body { left }
                };
                part
            }
        }
    }
}

impl<B> Body for MessageParts<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        loop {
            if this.rest.has_remaining() {
                return Poll::Ready(Some(Ok(Frame::data(this.next_part()))));
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.rest = data,
                    Err(other) => return Poll::Ready(Some(Ok(other))),
                },
                end_or_error => return Poll::Ready(end_or_error),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(rest));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use bytes::{BufMut, BytesMut};
    use http_body_util::{BodyExt, StreamBody};

    use super::*;

    fn message(flag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend_from_slice(&u32::try_from(body.len()).expect("small").to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    /// The parts a body of these data frames is handed on as.
    async fn parts(frames: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        let frames = frames
            .into_iter()
            .map(|f| Ok::<_, Infallible>(Frame::data(Bytes::from(f))));
        let mut body = MessageParts::new(StreamBody::new(futures::stream::iter(frames)));
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.expect("no error").into_data().expect("data");
            out.push(data.to_vec());
        }
        out
    }

    #[test]
    fn an_empty_body_ends_at_once() {
        let body = MessageParts::new(http_body_util::Empty::<Bytes>::new());
        assert!(body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(0));
    }

    #[tokio::test]
    async fn the_size_hint_counts_what_is_not_yet_handed_on() {
        let a = message(0, b"0123456789");
        let mut body = MessageParts::new(http_body_util::Full::new(Bytes::from(a.clone())));
        assert_eq!(body.size_hint().exact(), Some(a.len() as u64));
        let header = body.frame().await.expect("a part").expect("no error");
        assert_eq!(header.into_data().expect("data").len(), HEADER_BYTES);
        assert_eq!(body.size_hint().exact(), Some(10));
        assert!(!body.is_end_stream());
        let rest = body.frame().await.expect("a part").expect("no error");
        assert_eq!(rest.into_data().expect("data"), &b"0123456789"[..]);
        assert!(body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(0));
    }

    #[tokio::test]
    async fn each_header_and_each_body_is_a_part_of_its_own() {
        let a = message(0, b"first");
        let b = message(1, b"second!");
        let empty = message(0, b"");
        let frame = [a.clone(), empty.clone(), b.clone()].concat();
        assert_eq!(
            parts(vec![frame]).await,
            vec![
                a[..5].to_vec(),
                b"first".to_vec(),
                empty.clone(),
                b[..5].to_vec(),
                b"second!".to_vec(),
            ]
        );
    }

    #[tokio::test]
    async fn headers_and_bodies_split_across_frames_come_out_whole_in_order() {
        let a = message(0, &[7; 300]);
        let b = message(0, &[9; 40]);
        let all = [a.clone(), b.clone()].concat();
        // Cut inside a's header, inside a's body, inside b's header.
        let frames = vec![
            all[..2].to_vec(),
            all[2..100].to_vec(),
            all[100..307].to_vec(),
            all[307..].to_vec(),
        ];
        let got = parts(frames).await;
        assert_eq!(got.concat(), all, "every byte, in order");
        assert_eq!(
            got,
            vec![
                a[..2].to_vec(),
                a[2..5].to_vec(),
                a[5..100].to_vec(),
                a[100..].to_vec(),
                b[..2].to_vec(),
                b[2..5].to_vec(),
                b[5..].to_vec(),
            ]
        );
    }

    /// What the parts are for: tonic's buffer, fed the way tonic feeds it
    /// (append a frame, read a header, reserve the body's length, take the
    /// body), stays at one message when each header comes alone and grows
    /// to several messages when whole frames come.
    #[tokio::test]
    async fn a_receive_buffer_fed_by_parts_stays_at_one_message() {
        // Every 10th message larger, as the agent's slow reads make it.
        let sizes: Vec<usize> = (0..60)
            .map(|i| if i % 10 == 0 { 3_416 } else { 3_112 })
            .collect();
        let frames: Vec<Vec<u8>> = sizes.iter().map(|&n| message(0, &vec![1; n])).collect();
        let whole = largest_buffer(frames.clone(), false).await;
        let parted = largest_buffer(frames, true).await;
        assert_eq!(parted, 4_096, "by parts");
        assert!(whole > 8_192, "whole frames: {whole} bytes");
    }

    /// The largest allocation tonic's way of buffering makes for `frames`:
    /// from where the buffer's memory ends, and the lowest start seen since
    /// it last moved.
    async fn largest_buffer(frames: Vec<Vec<u8>>, by_parts: bool) -> usize {
        let frames = frames
            .into_iter()
            .map(|f| Ok::<_, Infallible>(Frame::data(Bytes::from(f))));
        let stream = StreamBody::new(futures::stream::iter(frames));
        let mut body: Pin<Box<dyn Body<Data = Bytes, Error = Infallible> + Send>> = if by_parts {
            Box::pin(MessageParts::new(stream))
        } else {
            Box::pin(stream)
        };
        let mut buf = BytesMut::with_capacity(gputel_proto::wire::STREAM_BUFFER_BYTES);
        let end = |b: &BytesMut| b.as_ptr() as usize + b.capacity();
        let (mut alloc_end, mut lowest) = (end(&buf), buf.as_ptr() as usize);
        let mut largest = 0;
        let mut watch = |b: &BytesMut| {
            if end(b) != alloc_end {
                alloc_end = end(b);
                lowest = b.as_ptr() as usize;
            }
            lowest = lowest.min(b.as_ptr() as usize);
            largest = largest.max(alloc_end - lowest);
        };
        let mut body_len = None;
        while let Some(frame) = body.frame().await {
            buf.put(frame.expect("no error").into_data().expect("data"));
            watch(&buf);
            loop {
                if body_len.is_none() && buf.len() >= HEADER_BYTES {
                    buf.advance(1);
                    let len = buf.get_u32() as usize;
                    buf.reserve(len);
                    watch(&buf);
                    body_len = Some(len);
                }
                match body_len {
                    Some(len) if buf.len() >= len => {
                        drop(buf.split_to(len).freeze());
                        watch(&buf);
                        body_len = None;
                    }
                    _ => break,
                }
            }
        }
        largest
    }
}
