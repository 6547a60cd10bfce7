//! Kubernetes resource quantities (`64Mi`, `1G`, `1.5Gi`, `2e3`) as byte counts.
//!
//! The grammar and the rounding follow `k8s.io/apimachinery/pkg/api/resource` (`quantity.go`): binary suffixes
//! Ki..Ei, decimal suffixes n, u, m, k, M..E, or a decimal exponent; a fractional byte count rounds up, as
//! `Quantity.Value()` does.

/// Parses a quantity into bytes. The error says what is wrong, for use in an INVALID_ARGUMENT message.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    parse_scaled(text, 1)
}

/// Parses a quantity into thousandths, rounded up as `Quantity.MilliValue()` rounds (`500m` is 500, `2` is
/// 2000): how CPU is counted.
pub fn parse_milli(text: &str) -> Result<u64, String> {
    parse_scaled(text, 1000)
}

/// The quantity times `factor`, rounded up.
fn parse_scaled(text: &str, factor: u128) -> Result<u64, String> {
    let s = text.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.starts_with('-') {
        return Err(format!("{text:?} is negative"));
    }
    let number_len = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_len);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() || frac_part.contains('.') {
        return Err(format!(
            "{text:?} is not a quantity (expected a number such as 64Mi or 1G)"
        ));
    }
    // value = mantissa / 10^frac_digits * numerator / denominator, all in u128 to avoid overflow.
    let digits = format!("{int_part}{frac_part}");
    let mantissa: u128 = digits
        .parse()
        .map_err(|_| format!("{text:?} is too large"))?;
    let denominator = 10u128
        .checked_pow(frac_part.len() as u32)
        .ok_or_else(|| format!("{text:?} has too many decimals"))?;
    let too_large = || format!("{text:?} is too large");
    let (numerator, divide) = match suffix_scale(suffix) {
        Some(Scale::By(numerator, divide)) => (numerator, divide),
        Some(Scale::Overflow) => return Err(too_large()),
        // So small a fraction of a byte still rounds up to one (zero stays zero).
        Some(Scale::Underflow) => return Ok(u64::from(mantissa > 0)),
        None => {
            return Err(format!(
                "{text:?} has an unknown suffix {suffix:?} (use Ki, Mi, Gi, Ti, k, M, G, T...)"
            ));
        }
    };
    // A denominator beyond u128 makes the value less than one byte: it rounds up to one (zero stays zero).
    let Some(denominator) = denominator.checked_mul(divide) else {
        return Ok(u64::from(mantissa > 0));
    };
    let scaled = mantissa
        .checked_mul(numerator)
        .and_then(|m| m.checked_mul(factor))
        .ok_or_else(too_large)?;
    let bytes = scaled.div_ceil(denominator);
    u64::try_from(bytes).map_err(|_| too_large())
}

/// How a suffix scales the number.
enum Scale {
    /// Multiply, then divide.
    By(u128, u128),
    /// A decimal exponent beyond any size (`1e40`).
    Overflow,
    /// A negative decimal exponent below any fraction this arithmetic holds (`1e-40`).
    Underflow,
}

/// How a suffix scales the number, or None when it is not one Kubernetes knows. A decimal exponent is signed,
/// as in `quantity.go` (`1e-3` is a thousandth).
fn suffix_scale(suffix: &str) -> Option<Scale> {
    let binary = |power: u32| Some(Scale::By(1u128 << (10 * power), 1));
    let decimal = |power: u32| Some(Scale::By(10u128.pow(power), 1));
    match suffix {
        "" => decimal(0),
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        "n" => Some(Scale::By(1, 1_000_000_000)),
        "u" => Some(Scale::By(1, 1_000_000)),
        "m" => Some(Scale::By(1, 1_000)),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        exp if exp.starts_with(['e', 'E']) => {
            let power: i32 = exp[1..].parse().ok()?;
            let scale = 10u128.checked_pow(power.unsigned_abs());
            Some(match (power >= 0, scale) {
                (true, Some(scale)) => Scale::By(scale, 1),
                (false, Some(scale)) => Scale::By(1, scale),
                (true, None) => Scale::Overflow,
                (false, None) => Scale::Underflow,
            })
        }
        _ => None,
    }
}

/// Formats bytes the way Kubernetes prints a binary quantity when it divides evenly (`64Mi`), else plain bytes.
pub fn format_bytes(bytes: u64) -> String {
    const SUFFIXES: [&str; 6] = ["Ei", "Pi", "Ti", "Gi", "Mi", "Ki"];
    for (i, suffix) in SUFFIXES.iter().enumerate() {
        let unit = 1u64 << (10 * (6 - i));
        if bytes >= unit && bytes % unit == 0 {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milli_values_round_up_as_milli_value_does() {
        assert_eq!(parse_milli("500m"), Ok(500));
        assert_eq!(parse_milli("2"), Ok(2000));
        assert_eq!(parse_milli("0.5"), Ok(500));
        assert_eq!(parse_milli("1n"), Ok(1));
        assert_eq!(parse_milli("1Ki"), Ok(1_024_000));
    }

    #[test]
    fn parses_the_forms_kubernetes_accepts() {
        assert_eq!(parse_bytes("64Mi"), Ok(64 << 20));
        assert_eq!(parse_bytes("10Gi"), Ok(10 << 30));
        assert_eq!(parse_bytes("1G"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_bytes("2e3"), Ok(2000));
        assert_eq!(parse_bytes("100"), Ok(100));
        assert_eq!(parse_bytes("+1k"), Ok(1000));
        assert_eq!(parse_bytes("1500m"), Ok(2), "fractional bytes round up");
        assert_eq!(parse_bytes(".5Ki"), Ok(512));
        assert_eq!(
            parse_bytes("1e-3"),
            Ok(1),
            "a signed exponent; a thousandth rounds up"
        );
        assert_eq!(parse_bytes("5E+2"), Ok(500));
        assert_eq!(parse_bytes("1e-40"), Ok(1));
        assert_eq!(parse_bytes("0e-40"), Ok(0));
        // Found by the fuzzer: many decimals and a negative exponent overflowed the denominator.
        assert_eq!(
            parse_bytes(".888899999999900000001040484529499615e-3"),
            Ok(1)
        );
    }

    #[test]
    fn the_fuzz_corpus_parses_without_a_panic() {
        let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/corpus/quantity");
        for entry in std::fs::read_dir(corpus).unwrap() {
            let text = std::fs::read(entry.unwrap().path()).unwrap();
            let _ = parse_bytes(&String::from_utf8_lossy(&text));
        }
    }

    #[test]
    fn sizes_beyond_any_disk_are_too_large() {
        for big in ["1e40", "1e20", "99999999999999Ei"] {
            let err = parse_bytes(big).unwrap_err();
            assert!(err.ends_with("is too large"), "{big}: {err}");
        }
    }

    #[test]
    fn rejects_what_kubernetes_rejects() {
        for bad in [
            "",
            "Mi",
            "-1Gi",
            "1.2.3",
            "12XB",
            "1 Gi",
            "abc",
            "1e",
            "1e3.5",
            "99999999999999Ei",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn formats_round_binary_sizes() {
        assert_eq!(format_bytes(64 << 20), "64Mi");
        assert_eq!(format_bytes(10 << 30), "10Gi");
        assert_eq!(format_bytes(1000), "1000");
    }
}
