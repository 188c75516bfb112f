//! Byte sizes as operators write them (`512Mi`, `2Gi`, `1.5Gi`, `1G`): one parser for every
//! command line that takes a memory size (`nereid ctl`, the placement simulator), and one
//! formatter for explanations (`2.0 GiB`).

/// Parses a byte count: plain digits, or a number with a binary (`Ki`, `Mi`, `Gi`, `Ti`) or
/// decimal (`K`, `M`, `G`, `T`) suffix; a trailing `B` is accepted (`2GiB`, `512MB`).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let t = t.strip_suffix(['B', 'b']).unwrap_or(t);
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, suffix) = t.split_at(split);
    let multiplier: u64 = match suffix.to_ascii_lowercase().as_str() {
        "" => 1,
        "k" => 1_000,
        "m" => 1_000_000,
        "g" => 1_000_000_000,
        "t" => 1_000_000_000_000,
        "ki" => 1 << 10,
        "mi" => 1 << 20,
        "gi" => 1 << 30,
        "ti" => 1 << 40,
        _ => {
            return Err(format!(
                "unknown size suffix in '{text}' (use Ki, Mi, Gi, Ti, K, M, G, T)"
            ));
        }
    };
    if number.is_empty() {
        return Err(format!("'{text}' is not a size"));
    }
    if let Ok(n) = number.parse::<u64>() {
        return n
            .checked_mul(multiplier)
            .ok_or_else(|| format!("size '{text}' is too large"));
    }
    let f: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size"))?;
    let bytes = f * multiplier as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("size '{text}' is too large"));
    }
    Ok(bytes.round() as u64)
}

/// A byte count for people: binary units with one decimal (`512 B`, `1.5 KiB`, `2.0 GiB`).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_suffixes() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("512Mi"), Ok(512 << 20));
        assert_eq!(parse_bytes("2Gi"), Ok(2 << 30));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_bytes("1G"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("4ki"), Ok(4096));
        assert!(parse_bytes("2Xi").is_err());
        assert!(parse_bytes("Gi").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("99999999999Ti").is_err());
    }

    #[test]
    fn bytes_format_in_binary_units() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(2 << 30), "2.0 GiB");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
    }
}
