//! An append-only log of text lines kept deflated: the report's records of a whole run (every CSI call,
//! every recorded API read), which are written once, read back whole only for a report, and at 100,000
//! pods number in the hundreds of thousands (issue #28: the call log alone was about 1 KB a call).
//!
//! Lines are gathered in blocks of [`BLOCK_LINES`]; the push that fills a block deflates it, outside the
//! lock, so writers on other threads are not held up by the compression. Until its deflated bytes replace
//! it, the full block stays readable as it was, so a reader always sees every line, in push order.

use std::io::{Read, Write};
use std::sync::Arc;

use flate2::Compression;
use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use parking_lot::Mutex;

/// Lines a block gathers before it is deflated: enough for the JSON's repeated keys and paths to compress
/// (about 10× here), few enough that the open block stays small.
pub const BLOCK_LINES: usize = 128;

/// A block of lines, full or deflated.
#[derive(Clone)]
enum Block {
    /// Full and being deflated by the push that filled it.
    Full(Arc<[Box<str>]>),
    /// The lines joined by `\n`, deflated.
    Deflated(Arc<[u8]>),
}

#[derive(Default)]
struct Inner {
    blocks: Vec<Block>,
    open: Vec<Box<str>>,
    len: usize,
}

/// The log. Lines must not contain `\n` (JSON lines never do).
#[derive(Default)]
pub struct DeflatedLines(Mutex<Inner>);

impl DeflatedLines {
    /// Appends a line; the push that fills a block deflates it.
    pub fn push(&self, line: String) {
        debug_assert!(!line.contains('\n'));
        let full = {
            let mut inner = self.0.lock();
            inner.len += 1;
            inner.open.push(line.into_boxed_str());
            if inner.open.len() < BLOCK_LINES {
                return;
            }
            let lines: Arc<[Box<str>]> = std::mem::take(&mut inner.open).into();
            inner.blocks.push(Block::Full(Arc::clone(&lines)));
            (inner.blocks.len() - 1, lines)
        };
        let (index, lines) = full;
        let deflated = deflate(&lines);
        self.0.lock().blocks[index] = Block::Deflated(deflated.into());
    }

    /// How many lines were pushed.
    pub fn len(&self) -> usize {
        self.0.lock().len
    }

    /// Whether no line was pushed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every line, in push order. The blocks are inflated outside the lock.
    pub fn lines(&self) -> Vec<String> {
        let (blocks, open) = {
            let inner = self.0.lock();
            (inner.blocks.clone(), inner.open.clone())
        };
        let mut lines = Vec::with_capacity(blocks.len() * BLOCK_LINES + open.len());
        for block in blocks {
            match block {
                Block::Full(full) => lines.extend(full.iter().map(|l| l.to_string())),
                Block::Deflated(bytes) => lines.extend(inflate(&bytes).lines().map(String::from)),
            }
        }
        lines.extend(open.into_iter().map(String::from));
        lines
    }
}

fn deflate(lines: &[Box<str>]) -> Vec<u8> {
    let mut encoder = DeflateEncoder::new(Vec::new(), Compression::fast());
    for line in lines {
        // Writing to a Vec cannot fail.
        let _ = encoder.write_all(line.as_bytes());
        let _ = encoder.write_all(b"\n");
    }
    encoder.finish().unwrap_or_default()
}

fn inflate(bytes: &[u8]) -> String {
    let mut text = String::new();
    // Bytes this module deflated from UTF-8 lines: they inflate.
    let _ = DeflateDecoder::new(bytes).read_to_string(&mut text);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_every_line_in_order_across_blocks_and_compresses() {
        let log = DeflatedLines::default();
        let count = BLOCK_LINES * 3 + 5;
        let line = |i: usize| {
            format!(r#"{{"driver":"local.inlet.dev","method":"NodePublishVolume","n":{i}}}"#)
        };
        for i in 0..count {
            log.push(line(i));
        }
        assert_eq!(log.len(), count);
        let lines = log.lines();
        assert_eq!(lines.len(), count);
        assert!(lines.iter().enumerate().all(|(i, l)| *l == line(i)));
        let inner = log.0.lock();
        assert_eq!(inner.blocks.len(), 3);
        assert_eq!(inner.open.len(), 5);
        let Block::Deflated(bytes) = &inner.blocks[0] else {
            panic!("a full block is deflated by the push that filled it")
        };
        let raw: usize = (0..BLOCK_LINES).map(|i| line(i).len() + 1).sum();
        assert!(bytes.len() * 4 < raw, "{} of {raw} bytes", bytes.len());
    }

    #[test]
    fn pushes_from_many_threads_lose_nothing() {
        let log = Arc::new(DeflatedLines::default());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let log = Arc::clone(&log);
                std::thread::spawn(move || (0..1000).for_each(|i| log.push(format!("{t}-{i}"))))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let mut lines = log.lines();
        lines.sort();
        lines.dedup();
        assert_eq!(lines.len(), 4000);
    }
}
