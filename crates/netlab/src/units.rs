//! Parsing of human-written quantities: rates ("1G", "800Mbit"), durations ("100ms", "2s"),
//! byte sizes ("12.5MB", "64KiB") and probabilities ("0.001", "0.1%").
//!
//! Pure functions with one-line error messages; the CLI and scenario files use them.

use std::time::Duration;

/// A quantity that could not be parsed; the message names the input and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(String);

fn split_number(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+' || c == 'e'))
        .unwrap_or(s.len());
    // "1e" followed by a non-digit would be a unit like "1eh"; keep it simple: only digits,
    // '.', sign and exponent markers are part of the number.
    s.split_at(end)
}

fn parse_number(what: &str, input: &str, num: &str) -> Result<f64, ParseError> {
    let v: f64 = num.parse().map_err(|_| {
        ParseError(format!(
            "invalid {what} {input:?}: expected a number followed by a unit"
        ))
    })?;
    if !v.is_finite() {
        return Err(ParseError(format!(
            "invalid {what} {input:?}: not a finite number"
        )));
    }
    if v < 0.0 {
        return Err(ParseError(format!(
            "invalid {what} {input:?}: must not be negative"
        )));
    }
    Ok(v)
}

/// Parses a link rate in bits per second. Decimal prefixes k, M, G, T (also lower case m/g/t),
/// optional suffix "bit", "bps", "bit/s" or "b/s": "1G", "1Gbit", "800M", "100kbit/s",
/// "2500000". Zero and negative rates are refused.
pub fn parse_rate(input: &str) -> Result<u64, ParseError> {
    let s = input.trim();
    let (num, unit) = split_number(s);
    let v = parse_number("rate", input, num)?;
    let unit = unit.trim();
    let (prefix, rest) = match unit.chars().next() {
        Some(c @ ('k' | 'K' | 'm' | 'M' | 'g' | 'G' | 't' | 'T')) => (Some(c), &unit[1..]),
        _ => (None, unit),
    };
    if !matches!(rest, "" | "bit" | "bps" | "bit/s" | "b/s") {
        return Err(ParseError(format!(
            "invalid rate {input:?}: unknown unit {unit:?}; use e.g. 1G, 1Gbit, 800M, 100kbit/s"
        )));
    }
    let mult = match prefix {
        None => 1.0,
        Some('k' | 'K') => 1e3,
        Some('m' | 'M') => 1e6,
        Some('g' | 'G') => 1e9,
        _ => 1e12,
    };
    let bps = v * mult;
    if bps < 1.0 {
        return Err(ParseError(format!(
            "invalid rate {input:?}: must be at least 1 bit/s (use \"unlimited\" for no limit)"
        )));
    }
    if bps > 1e15 {
        return Err(ParseError(format!(
            "invalid rate {input:?}: larger than 1 Pbit/s"
        )));
    }
    Ok(bps.round() as u64)
}

/// Parses a duration: units ns, us (or µs), ms, s, min, h; "0" alone is allowed without unit.
/// Examples: "100ms", "2s", "1.5s", "250us".
pub fn parse_duration(input: &str) -> Result<Duration, ParseError> {
    let s = input.trim();
    let (num, unit) = split_number(s);
    let v = parse_number("duration", input, num)?;
    let unit = unit.trim();
    let secs_per_unit = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" | "sec" => 1.0,
        "min" => 60.0,
        "h" => 3600.0,
        "" if v == 0.0 => 1.0,
        "" => {
            return Err(ParseError(format!(
                "invalid duration {input:?}: missing unit; use e.g. 100ms, 2s, 250us"
            )));
        }
        _ => {
            return Err(ParseError(format!(
                "invalid duration {input:?}: unknown unit {unit:?}; use ns, us, ms, s, min or h"
            )));
        }
    };
    let secs = v * secs_per_unit;
    if secs > 1e9 {
        return Err(ParseError(format!("invalid duration {input:?}: too long")));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a size in bytes: B, kB/KB (1000), KiB (1024), MB, MiB, GB, GiB; a bare number is bytes.
pub fn parse_size(input: &str) -> Result<u64, ParseError> {
    let s = input.trim();
    let (num, unit) = split_number(s);
    let v = parse_number("size", input, num)?;
    let mult = match unit.trim() {
        "" | "B" => 1.0,
        "k" | "K" | "kB" | "KB" => 1e3,
        "KiB" | "Ki" => 1024.0,
        "M" | "MB" => 1e6,
        "MiB" | "Mi" => 1024.0 * 1024.0,
        "G" | "GB" => 1e9,
        "GiB" | "Gi" => 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(ParseError(format!(
                "invalid size {input:?}: unknown unit {other:?}; use B, kB, KiB, MB, MiB, GB or GiB"
            )));
        }
    };
    let b = v * mult;
    if b > 1e15 {
        return Err(ParseError(format!("invalid size {input:?}: too large")));
    }
    Ok(b.round() as u64)
}

/// Parses a probability as a fraction ("0.001") or a percentage ("0.1%"); must be in [0, 1].
pub fn parse_probability(input: &str) -> Result<f64, ParseError> {
    let s = input.trim();
    let (num, pct) = match s.strip_suffix('%') {
        Some(n) => (n.trim(), true),
        None => (s, false),
    };
    let v: f64 = num.parse().map_err(|_| {
        ParseError(format!(
            "invalid probability {input:?}: expected a fraction like 0.001 or a percentage like 0.1%"
        ))
    })?;
    let p = if pct { v / 100.0 } else { v };
    if !(0.0..=1.0).contains(&p) || p.is_nan() {
        return Err(ParseError(format!(
            "invalid probability {input:?}: must be between 0 and 1 (0% and 100%)"
        )));
    }
    Ok(p)
}

/// Formats bits per second the way `parse_rate` reads them back ("1Gbit", "800Mbit", "1500bit").
pub fn format_rate(bps: u64) -> String {
    for (mult, p) in [
        (1_000_000_000_000u64, "T"),
        (1_000_000_000, "G"),
        (1_000_000, "M"),
        (1_000, "k"),
    ] {
        if bps >= mult && bps.is_multiple_of(mult) {
            return format!("{}{p}bit", bps / mult);
        }
    }
    for (mult, p) in [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")] {
        if bps as f64 >= mult {
            return format!("{:.3}{p}bit", bps as f64 / mult);
        }
    }
    format!("{bps}bit")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate("1Gbit").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate("800M").unwrap(), 800_000_000);
        assert_eq!(parse_rate("100kbit/s").unwrap(), 100_000);
        assert_eq!(parse_rate("2.5Gbps").unwrap(), 2_500_000_000);
        assert_eq!(parse_rate("12345").unwrap(), 12345);
        assert!(
            parse_rate("-1G")
                .unwrap_err()
                .to_string()
                .contains("negative")
        );
        assert!(parse_rate("0").is_err());
        assert!(
            parse_rate("1Gfoo")
                .unwrap_err()
                .to_string()
                .contains("unknown unit")
        );
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("100ms").unwrap(), Duration::from_millis(100));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(
            parse_duration("100")
                .unwrap_err()
                .to_string()
                .contains("missing unit")
        );
        assert!(parse_duration("-5ms").is_err());
        assert!(parse_duration("3 parsecs").is_err());
    }

    #[test]
    fn sizes_and_probabilities() {
        assert_eq!(parse_size("12.5MB").unwrap(), 12_500_000);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("9000").unwrap(), 9000);
        assert!(parse_size("1XB").is_err());
        assert_eq!(parse_probability("0.001").unwrap(), 0.001);
        assert!((parse_probability("0.1%").unwrap() - 0.001).abs() < 1e-12);
        assert!(parse_probability("1.5").is_err());
        assert!(parse_probability("-0.1").is_err());
        assert!(parse_probability("x").is_err());
    }

    #[test]
    fn rate_formatting_round_trips() {
        for r in [1_000_000_000, 800_000_000, 1500, 2_500_000_000] {
            assert_eq!(parse_rate(&format_rate(r)).unwrap(), r);
        }
    }
}
