//! A tiny aligned-column table for terminal output: a header row, then rows, columns separated
//! by two spaces and padded to the widest cell (by characters); the last column is not padded,
//! so lines carry no trailing spaces. Also the byte and age formatting the tables share.

/// Rows of cells under a header.
#[derive(Debug, Clone)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells print empty, extra cells are dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
    }

    /// The table as lines, each ending in a newline.
    pub fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths = vec![0usize; columns];
        for line in std::iter::once(&self.header).chain(&self.rows) {
            for (w, cell) in widths.iter_mut().zip(line) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for line in std::iter::once(&self.header).chain(&self.rows) {
            let mut text = String::new();
            for (i, cell) in line.iter().enumerate() {
                if i > 0 {
                    text.push_str("  ");
                }
                text.push_str(cell);
                if i + 1 < columns {
                    let pad = widths[i] - cell.chars().count();
                    text.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `key: value` lines with the values aligned.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.len() + 1).max().unwrap_or(0);
    pairs
        .iter()
        .map(|(k, v)| format!("{:<width$} {v}\n", format!("{k}:")).replace(" \n", "\n"))
        .collect()
}

/// Bytes in binary units with one decimal: `512.0 MiB`, `2.0 GiB`; `-` for zero.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    if n == 0 {
        return "-".into();
    }
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Milliseconds as a short age: `850ms`, `12.3s`, `4m`; `-` for zero (unknown).
pub fn age_ms(ms: u64) -> String {
    match ms {
        0 => "-".into(),
        1..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        _ => format!("{}m", ms / 60_000),
    }
}

/// Unix milliseconds as UTC `YYYY-MM-DD HH:MM:SS`; `-` for zero.
pub fn utc(unix_ms: u64) -> String {
    if unix_ms == 0 {
        return "-".into();
    }
    let secs = unix_ms / 1000;
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_without_trailing_spaces() {
        let mut t = Table::new(&["NAME", "READY", "SOURCE"]);
        t.row(vec![
            "resnet50".into(),
            "2/2".into(),
            "file:///m/resnet50".into(),
        ]);
        t.row(vec!["bert".into(), "0/1".into()]);
        assert_eq!(
            t.render(),
            "NAME      READY  SOURCE\n\
             resnet50  2/2    file:///m/resnet50\n\
             bert      0/1\n"
        );
    }

    #[test]
    fn header_only_and_wide_characters() {
        let t = Table::new(&["A", "B"]);
        assert_eq!(t.render(), "A  B\n");
        let mut t = Table::new(&["K", "V"]);
        t.row(vec!["é".into(), "1".into()]);
        t.row(vec!["ab".into(), "2".into()]);
        assert_eq!(t.render(), "K   V\né   1\nab  2\n");
    }

    #[test]
    fn field_lines() {
        assert_eq!(
            fields(&[
                ("name", "m".into()),
                ("source", "s".into()),
                ("labels", String::new())
            ]),
            "name:   m\nsource: s\nlabels:\n"
        );
    }

    #[test]
    fn byte_and_age_units() {
        assert_eq!(bytes(0), "-");
        assert_eq!(bytes(100), "100 B");
        assert_eq!(bytes(512 << 20), "512.0 MiB");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
        assert_eq!(age_ms(0), "-");
        assert_eq!(age_ms(850), "850ms");
        assert_eq!(age_ms(12_345), "12.3s");
        assert_eq!(age_ms(240_000), "4m");
        assert_eq!(utc(0), "-");
        assert_eq!(utc(1_000), "1970-01-01 00:00:01 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_763_770_000_000), "2025-11-22 00:06:40 UTC");
    }
}
