//! Any `:authority` on a unix socket: a server-side connection wrapper for gRPC clients that send the
//! socket's path as the HTTP/2 `:authority`.
//!
//! The kubelet before 1.26 (grpc-go dialled with the socket path; kubernetes#112597 switched it to
//! `localhost`), grpc-java and Python's grpcio send `:authority: /var/lib/kubelet/plugins/x/csi.sock`.
//! That is not a valid URI authority, and h2 (under tonic) resets every such stream with PROTOCOL_ERROR
//! (hyperium/h2#487 would relax it; unmerged). So a real kubelet 1.20 cannot even register a tonic driver.
//!
//! [`AuthorityFix`] reads the client's bytes before h2 does. It decodes the first request's header block:
//! when its authority is valid (or absent), the connection is passed through untouched from then on, at no
//! cost. Otherwise every header block of the connection is decoded and encoded again (HPACK keeps state per
//! connection, so all blocks must go through the same pair), with an invalid `:authority` replaced by
//! `localhost`, as newer kubelets send. Frames other than HEADERS and CONTINUATION pass through as they are.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The frame size every HTTP/2 peer accepts (SETTINGS_MAX_FRAME_SIZE's initial value).
const MAX_FRAME: usize = 16_384;
/// What an invalid authority becomes.
const LOCALHOST: &[u8] = b"localhost";

/// What the wrapper does with the client's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Waiting for the connection preface.
    Preface,
    /// Waiting for the first header block, which decides.
    Sniff,
    /// Every header block is rewritten.
    Rewrite,
    /// Everything passes through untouched.
    PassThrough,
}

/// A header block being gathered from a HEADERS frame and its CONTINUATIONs.
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    /// The frames as received, to pass on untouched if the block needs no rewriting.
    original: Vec<u8>,
}

/// A server-side connection whose client may send any `:authority` (see the module doc).
pub struct AuthorityFix<S> {
    inner: S,
    mode: Mode,
    /// Bytes read from the client, not yet processed.
    raw: Vec<u8>,
    /// Processed bytes, for the server to read from `ready_at`.
    ready: Vec<u8>,
    ready_at: usize,
    block: Option<Block>,
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
}

impl<S> AuthorityFix<S> {
    /// Wraps a freshly accepted connection.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            mode: Mode::Preface,
            raw: Vec::new(),
            ready: Vec::new(),
            ready_at: 0,
            block: None,
            decoder: Decoder::new(),
            encoder: Encoder::new(),
        }
    }

    /// Moves what can be processed from `raw` to `ready`.
    fn process(&mut self) -> io::Result<()> {
        if self.mode == Mode::Preface {
            if self.raw.len() < PREFACE.len() {
                return Ok(());
            }
            if !self.raw.starts_with(PREFACE) {
                // Not HTTP/2 with prior knowledge: none of this wrapper's business.
                self.mode = Mode::PassThrough;
            } else {
                self.ready.extend(self.raw.drain(..PREFACE.len()));
                self.mode = Mode::Sniff;
            }
        }
        while self.mode != Mode::PassThrough && self.raw.len() >= FRAME_HEADER {
            let length = u32::from_be_bytes([0, self.raw[0], self.raw[1], self.raw[2]]) as usize;
            if self.raw.len() < FRAME_HEADER + length {
                return Ok(());
            }
            let frame: Vec<u8> = self.raw.drain(..FRAME_HEADER + length).collect();
            let kind = frame[3];
            if kind == HEADERS || kind == CONTINUATION || self.block.is_some() {
                self.header_frame(frame)?;
            } else {
                self.ready.extend_from_slice(&frame);
            }
        }
        if self.mode == Mode::PassThrough {
            self.ready.append(&mut self.raw);
        }
        Ok(())
    }

    fn header_frame(&mut self, frame: Vec<u8>) -> io::Result<()> {
        let (kind, flags) = (frame[3], frame[4]);
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[FRAME_HEADER..];
        match (kind, self.block.as_mut()) {
            (HEADERS, None) => {
                let (fragment, priority) = headers_payload(flags, payload)
                    .ok_or_else(|| protocol_error("a HEADERS frame shorter than its padding"))?;
                self.block = Some(Block {
                    stream,
                    end_stream: flags & END_STREAM != 0,
                    priority,
                    fragment: fragment.to_vec(),
                    original: Vec::new(),
                });
            }
            (CONTINUATION, Some(block)) if block.stream == stream => {
                block.fragment.extend_from_slice(payload);
            }
            // Anything else inside a header block is a connection error h2 reports itself.
            _ => {
                self.mode = Mode::PassThrough;
                if let Some(block) = self.block.take() {
                    self.ready.extend(block.original);
                }
                self.ready.extend(frame);
                return Ok(());
            }
        }
        let block = self.block.as_mut().expect("a block is being gathered");
        block.original.extend_from_slice(&frame);
        if flags & END_HEADERS != 0 {
            let block = self.block.take().expect("a block is being gathered");
            self.finish(block)?;
        }
        Ok(())
    }

    fn finish(&mut self, block: Block) -> io::Result<()> {
        let mut headers = self
            .decoder
            .decode(&block.fragment)
            .map_err(|e| protocol_error(&format!("undecodable header block: {e:?}")))?;
        let mut rewritten = false;
        for (name, value) in &mut headers {
            if name.as_slice() == b":authority"
                && http::uri::Authority::try_from(value.as_slice()).is_err()
            {
                *value = LOCALHOST.to_vec();
                rewritten = true;
            }
        }
        if self.mode == Mode::Sniff {
            if !rewritten {
                self.mode = Mode::PassThrough;
                self.ready.extend(block.original);
                return Ok(());
            }
            self.mode = Mode::Rewrite;
        }
        let encoded = self
            .encoder
            .encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let mut first = Vec::new();
        if let Some(priority) = block.priority {
            first.extend_from_slice(&priority);
        }
        let room = MAX_FRAME - first.len();
        let (head, mut rest) = encoded.split_at(encoded.len().min(room));
        first.extend_from_slice(head);
        let mut flags = if block.end_stream { END_STREAM } else { 0 };
        if block.priority.is_some() {
            flags |= PRIORITY;
        }
        if rest.is_empty() {
            flags |= END_HEADERS;
        }
        push_frame(&mut self.ready, HEADERS, flags, block.stream, &first);
        while !rest.is_empty() {
            let (chunk, next) = rest.split_at(rest.len().min(MAX_FRAME));
            let flags = if next.is_empty() { END_HEADERS } else { 0 };
            push_frame(&mut self.ready, CONTINUATION, flags, block.stream, chunk);
            rest = next;
        }
        Ok(())
    }
}

/// A HEADERS payload's header block fragment and priority fields, without its padding.
fn headers_payload(flags: u8, payload: &[u8]) -> Option<(&[u8], Option<[u8; 5]>)> {
    let mut body = payload;
    let mut padding = 0;
    if flags & PADDED != 0 {
        padding = usize::from(*body.first()?);
        body = &body[1..];
    }
    let mut priority = None;
    if flags & PRIORITY != 0 {
        priority = Some(body.get(..5)?.try_into().ok()?);
        body = &body[5..];
    }
    let end = body.len().checked_sub(padding)?;
    Some((&body[..end], priority))
}

fn push_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let length = u32::try_from(payload.len())
        .expect("frames are under 16 KiB")
        .to_be_bytes();
    out.extend_from_slice(&length[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

fn protocol_error(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("HTTP/2: {what}"))
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        loop {
            if me.ready_at < me.ready.len() {
                let n = buf.remaining().min(me.ready.len() - me.ready_at);
                buf.put_slice(&me.ready[me.ready_at..me.ready_at + n]);
                me.ready_at += n;
                if me.ready_at == me.ready.len() {
                    me.ready.clear();
                    me.ready_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if me.mode == Mode::PassThrough && me.raw.is_empty() {
                return Pin::new(&mut me.inner).poll_read(cx, buf);
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut me.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                // The client is gone: whatever is left, complete or not, is the server's to judge.
                me.mode = Mode::PassThrough;
                if let Some(block) = me.block.take() {
                    me.ready.extend(block.original);
                }
                me.ready.append(&mut me.raw);
                if me.ready.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            me.raw.extend_from_slice(read.filled());
            me.process()?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AuthorityFix<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A client's opening: preface, an empty SETTINGS, then each request's HEADERS (+ a DATA frame).
    fn client_bytes(authority: &[u8], requests: usize) -> Vec<u8> {
        let mut encoder = Encoder::new();
        let mut out = PREFACE.to_vec();
        push_frame(&mut out, 0x4, 0, 0, &[]);
        for i in 0..requests {
            let stream = 1 + 2 * i as u32;
            let path = format!("/csi.v1.Node/Call{i}");
            let block = encoder.encode([
                (&b":method"[..], &b"POST"[..]),
                (b":scheme", b"http"),
                (b":path", path.as_bytes()),
                (b":authority", authority),
                (b"content-type", b"application/grpc"),
            ]);
            // The first request's block is split over a CONTINUATION, with padding and priority.
            if i == 0 {
                let (a, b) = block.split_at(7);
                let mut payload = vec![2];
                payload.extend_from_slice(&[0, 0, 0, 0, 16]);
                payload.extend_from_slice(a);
                payload.extend_from_slice(&[0, 0]);
                push_frame(&mut out, HEADERS, PADDED | PRIORITY, stream, &payload);
                push_frame(&mut out, CONTINUATION, END_HEADERS, stream, b);
            } else {
                push_frame(&mut out, HEADERS, END_HEADERS, stream, &block);
            }
            push_frame(&mut out, 0x0, END_STREAM, stream, b"\0\0\0\0\0");
        }
        out
    }

    type Headers = Vec<(Vec<u8>, Vec<u8>)>;
    /// One frame: type, flags, stream, the decoded header block it ends (if any), payload.
    type Frame = (u8, u8, u32, Headers, Vec<u8>);

    /// Every frame of a server-side view.
    fn frames(bytes: &[u8]) -> Vec<Frame> {
        assert!(bytes.starts_with(PREFACE));
        let mut decoder = Decoder::new();
        let mut rest = &bytes[PREFACE.len()..];
        let mut out = Vec::new();
        let mut block = Vec::new();
        while !rest.is_empty() {
            let length = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
            let (kind, flags) = (rest[3], rest[4]);
            let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
            let payload = &rest[FRAME_HEADER..FRAME_HEADER + length];
            let mut headers = Vec::new();
            if kind == HEADERS || kind == CONTINUATION {
                let (fragment, _) = if kind == HEADERS {
                    headers_payload(flags, payload).unwrap()
                } else {
                    (payload, None)
                };
                block.extend_from_slice(fragment);
                if flags & END_HEADERS != 0 {
                    headers = decoder.decode(&block).unwrap();
                    block.clear();
                }
            }
            out.push((kind, flags, stream, headers, payload.to_vec()));
            rest = &rest[FRAME_HEADER + length..];
        }
        out
    }

    async fn through(input: Vec<u8>) -> Vec<u8> {
        let (mut client, server) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            client.write_all(&input).await.unwrap();
            client.shutdown().await.unwrap();
        });
        let mut fixed = AuthorityFix::new(server);
        let mut out = Vec::new();
        fixed.read_to_end(&mut out).await.unwrap();
        writer.await.unwrap();
        out
    }

    fn authority(headers: &[(Vec<u8>, Vec<u8>)]) -> Option<&[u8]> {
        headers
            .iter()
            .find(|(n, _)| n == b":authority")
            .map(|(_, v)| v.as_slice())
    }

    #[tokio::test]
    async fn a_valid_authority_passes_through_byte_for_byte() {
        let input = client_bytes(b"localhost", 3);
        assert_eq!(through(input.clone()).await, input);
    }

    #[tokio::test]
    async fn a_socket_path_authority_becomes_localhost_in_every_request() {
        let input = client_bytes(b"/var/lib/kubelet/plugins/local.inlet.dev/csi.sock", 3);
        let before = frames(&input);
        let after = frames(&through(input).await);
        let headers: Vec<_> = after.iter().filter(|f| !f.3.is_empty()).collect();
        assert_eq!(headers.len(), 3);
        for (i, frame) in headers.iter().enumerate() {
            assert_eq!(authority(&frame.3), Some(LOCALHOST));
            let path = format!("/csi.v1.Node/Call{i}");
            assert!(frame.3.contains(&(b":path".to_vec(), path.into_bytes())));
            assert_eq!(frame.1 & END_HEADERS, END_HEADERS);
        }
        // The first keeps its priority; padding and the CONTINUATION are folded in.
        assert_eq!(headers[0].1 & PRIORITY, PRIORITY);
        assert_eq!(&headers[0].4[..5], &[0, 0, 0, 0, 16]);
        // Other frames are untouched, in order.
        let others = |f: &[Frame]| {
            f.iter()
                .filter(|x| x.0 != HEADERS && x.0 != CONTINUATION)
                .map(|x| (x.0, x.1, x.2, x.4.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(others(&before), others(&after));
    }

    #[tokio::test]
    async fn a_truncated_connection_is_handed_on_as_it_came() {
        let mut input = client_bytes(b"/a/b.sock", 1);
        input.truncate(PREFACE.len() + FRAME_HEADER + 4);
        assert_eq!(through(input.clone()).await, input);
    }
}
