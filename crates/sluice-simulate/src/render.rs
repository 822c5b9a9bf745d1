//! A report for people: a summary table, and a chart of admitted and denied requests per time
//! bucket, one panel per policy on one scale, as a self-contained SVG.

use std::fmt::Write as _;

use super::{PolicyReport, Report};

/// `1m`, `250ms`, `1h30m`… the largest units that divide the value exactly.
pub fn human_ms(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    if ms == 0 {
        return "0ms".to_owned();
    }
    for (size, unit) in UNITS {
        if ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    if ms >= 1_000 {
        return format!("{:.3}s", ms as f64 / 1_000.0);
    }
    format!("{ms}ms")
}

/// `1 key`, `2 keys`.
pub(crate) fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// How a log was read: its format and key, how many lines were skipped and why, and the first
/// few skipped lines.
fn log_lines(out: &mut String, log: &super::LogReport) {
    let _ = writeln!(
        out,
        "log: {}{}, key {}, time {}; {} of {} read, {} skipped",
        log.format,
        if log.detected { " (detected)" } else { "" },
        log.key.join(","),
        log.time_field,
        log.read,
        count(log.lines, "line", "lines"),
        log.skipped
    );
    for r in &log.skip_reasons {
        let _ = writeln!(out, "  skipped {} × {}", r.lines, r.reason);
    }
    for s in &log.first_skipped {
        let _ = writeln!(out, "  line {}: {}", s.line, s.reason);
    }
}

/// The summary table: one row per policy, then each policy's keys with the most denials.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "traffic: {} over {}, {} (buckets of {}){}",
        count(report.events, "request", "requests"),
        count(report.keys, "key", "keys"),
        human_ms(report.duration_ms),
        human_ms(report.bucket_ms),
        report
            .seed
            .map(|s| format!(", seed {s}"))
            .unwrap_or_default()
    );
    if let Some(log) = &report.log {
        log_lines(&mut out, log);
    }
    let _ = writeln!(out);
    let rows: Vec<[String; 6]> = report.policies.iter().map(policy_row).collect();
    aligned_rows(&mut out, &rows);
    for p in &report.policies {
        if p.top_keys.is_empty() || p.denied == 0 {
            continue;
        }
        let _ = writeln!(out, "\n{}: keys by denials", p.name);
        for k in p.top_keys.iter().filter(|k| k.denied > 0) {
            let _ = writeln!(
                out,
                "  {:<32}  admitted {:>8}  denied {:>8}",
                k.key, k.admitted, k.denied
            );
        }
    }
    out
}

/// One policy's row of the summary table.
fn policy_row(p: &PolicyReport) -> [String; 6] {
    let total = p.admitted + p.denied;
    let pct = if total == 0 {
        0.0
    } else {
        p.denied as f64 * 100.0 / total as f64
    };
    [
        p.name.clone(),
        p.admitted.to_string(),
        format!("{} ({pct:.1}%)", p.denied),
        p.first_denial_ms.map_or("-".to_owned(), human_ms),
        p.retry_after_ms.map_or("-".to_owned(), |r| {
            format!(
                "{}/{}/{}/{}",
                human_ms(r.p50),
                human_ms(r.p90),
                human_ms(r.p99),
                human_ms(r.max)
            )
        }),
        p.limits.join(", "),
    ]
}

/// The header and the rows, each column as wide as its widest cell.
fn aligned_rows(out: &mut String, rows: &[[String; 6]]) {
    let header = [
        "policy",
        "admitted",
        "denied",
        "first denial",
        "retry_after p50/p90/p99/max",
        "limits",
    ];
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                let _ = write!(s, "{cell:<w$}  ");
            }
        }
        s.trim_end().to_owned()
    };
    let _ = writeln!(out, "{}", line(header.to_vec()));
    for row in rows {
        let _ = writeln!(out, "{}", line(row.iter().map(String::as_str).collect()));
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

// The chart's geometry.
const WIDTH: f64 = 900.0;
const PANEL: f64 = 170.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const PLOT_W: f64 = WIDTH - LEFT - RIGHT;
const PLOT_H: f64 = PANEL - 50.0;

/// The chart: per policy, admitted (green, below) and denied (red, stacked above) requests
/// per bucket, every panel on the same vertical scale.
pub fn svg(report: &Report) -> String {
    let height = TOP + PANEL * report.policies.len() as f64 + 10.0;
    let peak = report
        .policies
        .iter()
        .flat_map(|p| &p.buckets)
        .map(|b| b.admitted + b.denied)
        .max()
        .unwrap_or(0)
        .max(1);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r##"<rect width="100%" height="100%" fill="#ffffff"/>
<text x="{LEFT}" y="20" font-size="14">requests per {} bucket: admitted (green) and denied (red); {}, {}</text>"##,
        human_ms(report.bucket_ms),
        count(report.events, "request", "requests"),
        count(report.keys, "key", "keys")
    );
    for (i, p) in report.policies.iter().enumerate() {
        svg_panel(&mut s, TOP + PANEL * i as f64, p, peak, report.duration_ms);
    }
    s.push_str("</svg>\n");
    s
}

/// One policy's panel, its top at `y0`: a title, the axes and a bar per bucket.
fn svg_panel(s: &mut String, y0: f64, p: &PolicyReport, peak: u64, duration_ms: u64) {
    let base = y0 + 20.0 + PLOT_H;
    let _ = writeln!(s, r#"<g class="policy" data-name="{}">"#, escape(&p.name));
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="{:.1}" font-weight="bold">{}: {} admitted, {} denied ({})</text>"#,
        y0 + 12.0,
        escape(&p.name),
        p.admitted,
        p.denied,
        escape(&p.limits.join(", "))
    );
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{base:.1}" x2="{:.1}" y2="{base:.1}" stroke="#444"/>"##,
        LEFT + PLOT_W
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{peak}</text><text x="{:.1}" y="{base:.1}" text-anchor="end">0</text>"#,
        LEFT - 6.0,
        y0 + 24.0,
        LEFT - 6.0
    );
    let n = p.buckets.len().max(1) as f64;
    let bar_w = PLOT_W / n;
    for (j, b) in p.buckets.iter().enumerate() {
        let x = LEFT + bar_w * j as f64;
        let ha = b.admitted as f64 / peak as f64 * PLOT_H;
        let hd = b.denied as f64 / peak as f64 * PLOT_H;
        if b.admitted > 0 {
            let _ = writeln!(
                s,
                r##"<rect class="admitted" x="{x:.2}" y="{:.2}" width="{bar_w:.2}" height="{ha:.2}" fill="#3a9a4a"/>"##,
                base - ha
            );
        }
        if b.denied > 0 {
            let _ = writeln!(
                s,
                r##"<rect class="denied" x="{x:.2}" y="{:.2}" width="{bar_w:.2}" height="{hd:.2}" fill="#d0473d"/>"##,
                base - ha - hd
            );
        }
    }
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="{:.1}">0</text><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
        base + 14.0,
        LEFT + PLOT_W,
        base + 14.0,
        human_ms(duration_ms)
    );
    s.push_str("</g>\n");
}

#[cfg(test)]
mod tests {
    use super::human_ms;

    #[test]
    fn durations_print_in_their_largest_exact_unit() {
        assert_eq!(human_ms(60_000), "1m");
        assert_eq!(human_ms(50_000), "50s");
        assert_eq!(human_ms(250), "250ms");
        assert_eq!(human_ms(1_500), "1.500s");
        assert_eq!(human_ms(86_400_000), "1d");
    }
}
