//! Human sizes, rates and durations: parsing what users type (`256MiB`, `4G`, `800M`, `1Gbit`,
//! `60s`) and printing what they read (`1.5 GiB`, `943.2 Mbit/s`).
//!
//! Written by hand because the rules differ per quantity and the error messages must say what
//! is accepted: sizes use binary multiples for bare `K/M/G/T` (as `dd` and GridFTP's `-tcp-bs`
//! do) and decimal for `KB/MB/GB/TB`; rates are bits per second with decimal multiples, as
//! networks are rated.

use std::time::Duration;

fn split_number(s: &str) -> Option<(f64, &str)> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let value: f64 = s[..end].parse().ok()?;
    Some((value, s[end..].trim()))
}

/// Parses a byte size: `1048576`, `64K`, `256MiB`, `4G`, `1.5GB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let err = || {
        format!(
            "invalid size {s:?}: use a number with an optional unit K, M, G, T (x1024), KiB..TiB, or KB..TB (x1000)"
        )
    };
    let (v, unit) = split_number(s).ok_or_else(err)?;
    let mult: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(err()),
    };
    let bytes = v * mult;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(err());
    }
    Ok(bytes.round() as u64)
}

/// Parses a rate in bits per second: `800M`, `1G`, `1Gbit`, `2.5Gbps`, or bytes per second
/// with `B/s` (`100MB/s`).
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let err = || {
        format!(
            "invalid rate {s:?}: use bits per second like 800M, 1G, 1Gbit, 2.5Gbps, or bytes like 100MB/s"
        )
    };
    let (v, unit) = split_number(s).ok_or_else(err)?;
    let u = unit.to_string();
    let (prefix, bytes) = if let Some(p) = u.strip_suffix("B/s") {
        (p.to_string(), true)
    } else {
        let l = u.to_ascii_lowercase();
        let p = l
            .strip_suffix("bit/s")
            .or_else(|| l.strip_suffix("bps"))
            .or_else(|| l.strip_suffix("bit"))
            .or_else(|| l.strip_suffix("b"))
            .unwrap_or(&l)
            .to_string();
        (p, false)
    };
    let mult: f64 = match prefix.to_ascii_lowercase().as_str() {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        "t" => 1e12,
        _ => return Err(err()),
    };
    let bps = v * mult * if bytes { 8.0 } else { 1.0 };
    if !bps.is_finite() || bps < 1.0 || bps > u64::MAX as f64 {
        return Err(err());
    }
    Ok(bps.round() as u64)
}

/// Parses a duration: `60s`, `100ms`, `2m`, `1h`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let err = || {
        format!("invalid duration {s:?}: use a number with ms, s, m, h or d (e.g. 60s, 500ms, 7d)")
    };
    let (v, unit) = split_number(s).ok_or_else(err)?;
    let secs = match unit {
        "ms" => v / 1e3,
        "" | "s" => v,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        "d" => v * 86_400.0,
        _ => return Err(err()),
    };
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(err());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `1536` -> `1.5 KiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// `(1, "file", "files")` -> `1 file`; `(3, ...)` -> `3 files`.
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Bits per second -> `943.2 Mbit/s`.
pub fn format_rate(bps: f64) -> String {
    const UNITS: [&str; 5] = ["bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s"];
    let mut v = bps.max(0.0);
    let mut i = 0;
    while v >= 1000.0 && i + 1 < UNITS.len() {
        v /= 1000.0;
        i += 1;
    }
    format!("{v:.1} {}", UNITS[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        assert_eq!(count(0, "file", "files"), "0 files");
        assert_eq!(count(1, "file", "files"), "1 file");
        assert_eq!(count(2, "copy", "copies"), "2 copies");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("1.5GB"), Ok(1_500_000_000));
        assert!(
            parse_size("12 parsecs")
                .unwrap_err()
                .contains("invalid size")
        );
        assert!(parse_size("-5M").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("800M"), Ok(800_000_000));
        assert_eq!(parse_rate("1G"), Ok(1_000_000_000));
        assert_eq!(parse_rate("1Gbit"), Ok(1_000_000_000));
        assert_eq!(parse_rate("2.5Gbps"), Ok(2_500_000_000));
        assert_eq!(parse_rate("100MB/s"), Ok(800_000_000));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("1X").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(4 << 30), "4.0 GiB");
        assert_eq!(format_rate(943_200_000.0), "943.2 Mbit/s");
        assert_eq!(format_rate(12.0), "12.0 bit/s");
    }
}
