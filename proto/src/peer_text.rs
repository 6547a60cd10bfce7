//! Text a peer controls (a driver's error message, a registration reason, a node id), made safe to print or
//! log: control characters escaped, so a peer cannot clear a terminal, move its cursor or forge a line, and
//! the length capped, so a peer cannot fill a log with one message.

use std::fmt::Write;

/// The longest peer text shown whole, in bytes: a long CSI error message fits, a megabyte does not.
pub const MAX_SHOWN: usize = 1024;

/// `text` as it may be shown: control characters (C0, DEL, C1, and the bidirectional overrides that reorder
/// a line) escaped as Rust's `escape_default` writes them, everything else kept, and at most `max` bytes of
/// the original shown, followed by how many were left out.
pub fn shown(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max) + 16);
    let mut taken = 0;
    for c in text.chars() {
        if taken + c.len_utf8() > max {
            let _ = write!(out, "... ({} more bytes)", text.len() - taken);
            return out;
        }
        taken += c.len_utf8();
        if needs_escape(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// [`shown`] with [`MAX_SHOWN`].
pub fn safe(text: &str) -> String {
    shown(text, MAX_SHOWN)
}

fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_moves_a_terminal_and_caps_the_length() {
        let hostile = "bad\n\x1b[2J\x1b[31mPASS\x07\r all checks passed\0";
        let safe = safe(hostile);
        assert!(!safe.chars().any(char::is_control), "{safe:?}");
        assert_eq!(
            safe,
            r"bad\n\u{1b}[2J\u{1b}[31mPASS\u{7}\r all checks passed\u{0}"
        );
        assert_eq!(shown("héllo wörld", 64), "héllo wörld");
        assert_eq!(shown("\u{202e}abc", 64), r"\u{202e}abc");
        let long = "x".repeat(3 << 20);
        let capped = super::safe(&long);
        assert!(capped.len() < MAX_SHOWN + 40, "{}", capped.len());
        assert!(capped.ends_with(&format!("... ({} more bytes)", (3 << 20) - MAX_SHOWN)));
        // A multi-byte character is never cut in half.
        assert_eq!(shown("ééé", 3), "é... (4 more bytes)");
    }
}
