//! Local token reservation against direct Redis calls, in the same run: four limiters (as four
//! hosts, each with its own connection and leases) on one Redis, 32 tasks each.
//!
//! Two loads: only hot keys (4 keys far over their limit), and a mix (Zipf over 100,000 keys
//! plus the hot keys). Reported per mode: decisions/s, Redis script calls per decision (INFO
//! commandstats), and for the hot keys the units admitted per window against the ideal
//! (`min(max, offered)`). Writes `target/reservation.svg`, the admitted-per-window plot that
//! docs/benchmarks.md shows.
//!
//! `cargo bench -p sluice-redis --bench reservation` (about 40 s; `SLUICE_BENCH_SECS` sets the
//! seconds per run, default 5).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench fails loudly by design

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use sluice::{Batch, LimitSpec, Limiter, Policy, ReserveConfig, Reserving, SharedStore};
use sluice_testkit::RedisServer;

const HOSTS: usize = 4;
const TASKS: usize = 32;
const HOT_KEYS: u64 = 4;
/// The hot keys' limit: per second.
const MAX: u64 = 5_000;
/// 0.25 % of max: at most 4 hosts × 12 = 48 units (≈ 1 %) leased and unused per window.
const BATCH: f64 = 0.0025;

struct Run {
    decisions: u64,
    hot_decisions: u64,
    secs: f64,
    calls: u64,
    /// Hot key → window reset → (admitted, offered).
    windows: BTreeMap<u64, BTreeMap<u64, (u64, u64)>>,
}

async fn run(server: &RedisServer, reserve: bool, mix: bool, secs: u64) -> Run {
    server.cmd(&["FLUSHALL"]).unwrap();
    let policy = Policy::from_specs("api", vec![LimitSpec::fixed_window(MAX, 1_000)]).unwrap();
    let mut limiters = Vec::new();
    for _ in 0..HOSTS {
        let store = common::connect(server).await;
        let store = if reserve {
            SharedStore::new(Reserving::new(
                store,
                ReserveConfig::default().batch(Batch::Fraction(BATCH)),
            ))
        } else {
            SharedStore::new(store)
        };
        limiters.push(Arc::new(Limiter::new(store).with_policy(policy.clone())));
    }
    let before = server.command_calls("fcall").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let zipf = Zipf::new(100_000.0, 1.0).unwrap();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (h, limiter) in limiters.iter().enumerate() {
        for t in 0..TASKS {
            let (limiter, stop) = (limiter.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = SmallRng::seed_from_u64((h * 1_000 + t) as u64);
                let mut windows: BTreeMap<u64, BTreeMap<u64, (u64, u64)>> = BTreeMap::new();
                let (mut n, mut hot_n) = (0u64, 0u64);
                let mut key = String::new();
                while !stop.load(Ordering::Relaxed) {
                    // The mix: half the checks on the 4 hot keys, half Zipf over 100,000 keys.
                    let hot = !mix || rng.random_bool(0.5);
                    let k = if hot {
                        rng.random_range(0..HOT_KEYS)
                    } else {
                        zipf.sample(&mut rng) as u64
                    };
                    key.clear();
                    let _ = write!(key, "{}:{k}", if hot { "hot" } else { "user" });
                    let d = limiter.check("api", &key, 1).await.unwrap();
                    n += 1;
                    if hot {
                        hot_n += 1;
                        let w = windows
                            .entry(k)
                            .or_default()
                            .entry(d.reset_ms())
                            .or_default();
                        w.0 += u64::from(d.allowed);
                        w.1 += 1;
                    }
                    tokio::task::yield_now().await;
                }
                (n, hot_n, windows)
            }));
        }
    }
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut out = Run {
        decisions: 0,
        hot_decisions: 0,
        secs: 0.0,
        calls: 0,
        windows: BTreeMap::new(),
    };
    for t in tasks {
        let (n, hot_n, windows) = t.await.unwrap();
        out.decisions += n;
        out.hot_decisions += hot_n;
        for (k, ws) in windows {
            for (reset, (a, o)) in ws {
                let w = out.windows.entry(k).or_default().entry(reset).or_default();
                w.0 += a;
                w.1 += o;
            }
        }
    }
    out.secs = started.elapsed().as_secs_f64();
    out.calls = server.command_calls("fcall").unwrap() - before;
    out
}

/// (windows compared, largest over-admission, mean and worst under-admission as % of max)
/// over the hot keys' complete windows (the first and last of each key are partial).
fn accuracy(run: &Run) -> (usize, i64, f64, f64) {
    let (mut n, mut over, mut sum, mut worst) = (0usize, i64::MIN, 0.0, 0.0f64);
    for ws in run.windows.values() {
        let inner: Vec<_> = ws.values().collect();
        if inner.len() < 3 {
            continue;
        }
        for (admitted, offered) in &inner[1..inner.len() - 1] {
            let ideal = MAX.min(*offered);
            over = over.max(*admitted as i64 - MAX as i64);
            let under = (ideal.saturating_sub(*admitted)) as f64 * 100.0 / MAX as f64;
            sum += under;
            worst = worst.max(under);
            n += 1;
        }
    }
    (n, over, if n > 0 { sum / n as f64 } else { 0.0 }, worst)
}

/// Two panels: units admitted per window on one hot key (a line per mode, the max dashed),
/// and Redis calls per decision per load and mode (bars, log scale).
fn svg(series: &[(&str, &str, Vec<u64>)], bars: &[(String, &str, f64)]) -> String {
    let (w, h, pad) = (640.0, 300.0, 40.0);
    let longest = series.iter().map(|s| s.2.len()).max().unwrap_or(1).max(2);
    let top = (MAX as f64 * 1.15).max(1.0);
    let x = |i: usize| pad + (w - 2.0 * pad) * i as f64 / (longest - 1) as f64;
    let y = |v: f64| h - pad - (h - 2.0 * pad) * v / top;
    let mut s = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\n\
         <rect width='100%' height='100%' fill='white'/>\n\
         <text x='{pad}' y='20'>Units admitted per 1 s window on a hot key (max {MAX}), 4 hosts x 32 tasks</text>\n\
         <line x1='{pad}' y1='{my:.1}' x2='{x2}' y2='{my:.1}' stroke='gray' stroke-dasharray='4'/>\n\
         <text x='{x2}' y='{ty:.1}' text-anchor='end' fill='gray'>max</text>\n",
        my = y(MAX as f64),
        ty = y(MAX as f64) - 4.0,
        x2 = w - pad,
    );
    for (i, (label, color, values)) in series.iter().enumerate() {
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(j, v)| format!("{:.1},{:.1}", x(j), y(*v as f64)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill='none' stroke='{color}' stroke-width='2' points='{}'/>\n<text x='{pad}' y='{:.1}' fill='{color}'>{label}</text>",
            points.join(" "),
            h - 8.0 - 14.0 * i as f64
        );
    }
    // The bars, to the right of the lines: log10 scale from 0.0001 to 1 call per decision.
    let (bx, bw) = (w + 30.0, 60.0);
    let by = |v: f64| {
        let l = v.max(1e-4).log10(); // -4 ..= 0
        h - pad - (h - 2.0 * pad) * (l + 4.0) / 4.0
    };
    let _ = writeln!(
        s,
        "<text x='{bx}' y='20'>Redis calls per decision (log scale)</text>"
    );
    for (tick, label) in [(1.0, "1"), (0.01, "0.01"), (0.0001, "0.0001")] {
        let _ = writeln!(
            s,
            "<text x='{:.1}' y='{:.1}' text-anchor='end' fill='gray'>{label}</text>",
            bx - 4.0,
            by(tick) + 4.0
        );
    }
    for (i, (label, color, v)) in bars.iter().enumerate() {
        let x0 = bx + 10.0 + i as f64 * (bw + 10.0);
        let _ = writeln!(
            s,
            "<rect x='{x0:.1}' y='{:.1}' width='{bw}' height='{:.1}' fill='{color}'/>\n<text x='{:.1}' y='{:.1}' text-anchor='middle'>{v:.4}</text>\n<text x='{:.1}' y='{:.1}' text-anchor='middle' font-size='10'>{label}</text>",
            by(*v),
            (h - pad) - by(*v),
            x0 + bw / 2.0,
            by(*v) - 4.0,
            x0 + bw / 2.0,
            h - pad + 14.0,
        );
    }
    s.push_str("</svg>\n");
    s.replacen(
        &format!("width='{w}'"),
        &format!("width='{}'", w + 340.0),
        1,
    )
}

fn main() {
    let Some((secs, server, rt)) = common::start() else {
        return;
    };
    println!(
        "| load | mode | decisions/s | Redis calls per decision | hot-key windows | over max (worst) | under ideal, mean | under ideal, worst |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let mut plot = Vec::new();
    let mut bars = Vec::new();
    for mix in [false, true] {
        for reserve in [false, true] {
            let r = rt.block_on(run(&server, reserve, mix, secs));
            let (n, over, mean, worst) = accuracy(&r);
            let load = if mix {
                "Zipf 100k keys + 4 hot keys"
            } else {
                "4 hot keys"
            };
            let mode = if reserve {
                "reservation (batch 0.25 % of max)"
            } else {
                "direct"
            };
            println!(
                "| {load} | {mode} | {:.0} | {:.4} | {n} | {over} | {mean:.2} % | {worst:.2} % |",
                r.decisions as f64 / r.secs,
                r.calls as f64 / r.decisions as f64,
            );
            bars.push((
                format!(
                    "{} {}",
                    if mix { "mix" } else { "hot" },
                    if reserve { "reserve" } else { "direct" }
                ),
                if reserve { "#1f77b4" } else { "#d62728" },
                r.calls as f64 / r.decisions as f64,
            ));
            if !mix {
                let key0: Vec<u64> = r
                    .windows
                    .get(&0)
                    .map(|ws| ws.values().map(|w| w.0).collect())
                    .unwrap_or_default();
                plot.push((
                    if reserve { "reservation" } else { "direct" },
                    if reserve { "#1f77b4" } else { "#d62728" },
                    key0,
                ));
            }
            if !mix && reserve {
                // Hot keys only: every call is a hot-key call.
                println!(
                    "|  | (hot keys: {:.4} calls per decision) | | | | | | |",
                    r.calls as f64 / r.hot_decisions as f64
                );
            }
        }
    }
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/reservation.svg");
    std::fs::write(&path, svg(&plot, &bars)).unwrap();
    println!("\nplot: {}", path.display());
}
