//! An append-only log of JSON lines kept deflated: the report's records of a whole run (every CSI call,
//! every recorded API read), which are written once, read back whole only for a report, and at 100,000
//! pods number in the hundreds of thousands (issue #28: the call log alone was about 1 KB a call).
//!
//! Each record is serialized straight into the open block, which gathers [`BLOCK_LINES`] lines; the push
//! that fills a block deflates it, outside the lock, so writers on other threads are not held up by the
//! compression. Until its deflated bytes replace it, the full block stays readable as it was, so a reader
//! always sees every line, in push order.

use std::io::{Read, Write};
use std::sync::Arc;

use flate2::Compression;
use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use parking_lot::Mutex;

/// Lines a block gathers before it is deflated: enough for the JSON's repeated keys and paths to compress
/// (about 10× here), few enough that the open block stays small.
pub const BLOCK_LINES: usize = 128;

/// A block of lines, each ended by `\n`, full or deflated.
#[derive(Clone)]
enum Block {
    /// Full and being deflated by the push that filled it.
    Full(Arc<Vec<u8>>),
    /// Deflated.
    Deflated(Arc<[u8]>),
}

#[derive(Default)]
struct Inner {
    blocks: Vec<Block>,
    /// The open block's lines, each ended by `\n`: written in place, with no allocation of their own.
    open: Vec<u8>,
    open_lines: usize,
    len: usize,
}

/// The log of JSON lines.
#[derive(Default)]
pub struct DeflatedLines(Mutex<Inner>);

impl DeflatedLines {
    /// Appends `value` as a line of JSON, written straight into the open block.
    pub fn push_json<T: serde::Serialize>(&self, value: &T) {
        // Into a Vec, serializing fails only for a map whose keys are not strings, which no record has.
        self.append(|open| _ = serde_json::to_writer(open, value));
    }

    /// Appends the line `write` writes; the push that fills a block deflates it, outside the lock.
    fn append(&self, write: impl FnOnce(&mut Vec<u8>)) {
        let full = {
            let mut inner = self.0.lock();
            inner.len += 1;
            write(&mut inner.open);
            inner.open.push(b'\n');
            inner.open_lines += 1;
            if inner.open_lines < BLOCK_LINES {
                return;
            }
            let capacity = inner.open.len();
            let lines = Arc::new(std::mem::replace(
                &mut inner.open,
                Vec::with_capacity(capacity),
            ));
            inner.open_lines = 0;
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
        let mut lines = Vec::with_capacity(blocks.len() * BLOCK_LINES + BLOCK_LINES);
        let mut take = |text: &[u8]| {
            let text = String::from_utf8_lossy(text);
            lines.extend(text.lines().map(String::from));
        };
        for block in blocks {
            match block {
                Block::Full(text) => take(&text),
                Block::Deflated(bytes) => take(&inflate(&bytes)),
            }
        }
        take(&open);
        lines
    }
}

fn deflate(text: &[u8]) -> Vec<u8> {
    let mut encoder = DeflateEncoder::new(Vec::new(), Compression::fast());
    // Writing to a Vec cannot fail.
    let _ = encoder.write_all(text);
    encoder.finish().unwrap_or_default()
}

fn inflate(bytes: &[u8]) -> Vec<u8> {
    let mut text = Vec::new();
    // Bytes this module deflated: they inflate.
    let _ = DeflateDecoder::new(bytes).read_to_end(&mut text);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_every_line_in_order_across_blocks_and_compresses() {
        let log = DeflatedLines::default();
        let count = BLOCK_LINES * 3 + 5;
        let line = |i: usize| serde_json::json!({"driver": "local.inlet.dev", "method": "NodePublishVolume", "n": i});
        for i in 0..count {
            log.push_json(&line(i));
        }
        assert_eq!(log.len(), count);
        let lines = log.lines();
        assert_eq!(lines.len(), count);
        assert!(
            lines
                .iter()
                .enumerate()
                .all(|(i, l)| serde_json::from_str::<serde_json::Value>(l).unwrap() == line(i))
        );
        let inner = log.0.lock();
        assert_eq!(inner.blocks.len(), 3);
        assert_eq!(inner.open_lines, 5);
        let Block::Deflated(bytes) = &inner.blocks[0] else {
            panic!("a full block is deflated by the push that filled it")
        };
        let raw: usize = (0..BLOCK_LINES)
            .map(|i| line(i).to_string().len() + 1)
            .sum();
        assert!(bytes.len() * 4 < raw, "{} of {raw} bytes", bytes.len());
    }

    #[test]
    fn pushes_from_many_threads_lose_nothing() {
        let log = Arc::new(DeflatedLines::default());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let log = Arc::clone(&log);
                std::thread::spawn(move || {
                    (0..1000).for_each(|i| log.push_json(&format!("{t}-{i}")))
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let mut lines = log.lines();
        lines.sort();
        lines.dedup();
        assert_eq!(lines.len(), 4000);
    }
}
