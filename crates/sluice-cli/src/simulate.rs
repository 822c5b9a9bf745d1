//! `sluice simulate`: its arguments, the log it reads and the traffic it builds.

use std::path::PathBuf;

use serde_json::Value;

use sluice_server::config::Config;

/// `sluice simulate …`: the policies, the traffic (a pattern or a log) and the output.
#[derive(Debug, clap::Args)]
pub(crate) struct SimulateArgs {
    /// A configuration file whose policies `--policy` may name.
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// A policy to simulate, repeatable (compared side by side, in order): `api` (a
    /// configured policy), `current=api` (the same, named current), or
    /// `candidate={limits: [{max: 100, per: 1m}]}` (inline, the shape of a `policies.<name>`
    /// entry).
    #[arg(long = "policy", required = true)]
    pub(crate) policies: Vec<String>,
    /// A generated traffic.
    #[command(flatten)]
    pub(crate) generated: Generated,
    /// A recorded traffic: a log file (`-` for standard input), plain or gzip (`.gz`).
    #[arg(long)]
    pub(crate) log: Option<PathBuf>,
    /// How to read the log.
    #[command(flatten)]
    pub(crate) recorded: Recorded,
    /// The width of a time bucket, e.g. 10s (by default the smallest of 1s, 10s, 1m, 10m, 1h,
    /// 1d that makes at most 600).
    #[arg(long)]
    pub(crate) bucket: Option<String>,
    /// Keys listed per policy, by denials.
    #[arg(long)]
    pub(crate) top: Option<u64>,
    /// Write a chart of admitted and denied requests per bucket, per policy, to this SVG file.
    #[arg(long)]
    pub(crate) svg: Option<PathBuf>,
    /// Print the report as JSON (the body `POST /v1/simulate` answers) instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The flags of a generated traffic, by their names in the request's `traffic`.
#[derive(Debug, clap::Args, serde::Serialize)]
pub(crate) struct Generated {
    /// A generated traffic: steady, bursts, poisson or ramp.
    #[arg(long, conflicts_with = "log")]
    pub(crate) pattern: Option<String>,
    /// Requests per second (steady, poisson).
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    /// Requests per burst (bursts).
    #[arg(long)]
    pub(crate) size: Option<u64>,
    /// The interval between bursts (bursts), e.g. 10s.
    #[arg(long)]
    pub(crate) every: Option<String>,
    /// Requests per second at the start (ramp).
    #[arg(long)]
    pub(crate) from: Option<f64>,
    /// Requests per second at the end (ramp).
    #[arg(long)]
    pub(crate) to: Option<f64>,
    /// How long the generated traffic lasts, e.g. 1m.
    #[arg(long)]
    pub(crate) duration: Option<String>,
    /// Distinct keys of the generated traffic (key-1 … key-N).
    #[arg(long)]
    pub(crate) keys: Option<u64>,
    /// How a request's key is chosen: uniform or zipf.
    #[arg(long)]
    pub(crate) key_choice: Option<String>,
    /// The Zipf exponent (with --key-choice zipf; 1 by default).
    #[arg(long)]
    pub(crate) zipf_exponent: Option<f64>,
    /// The generator's seed: one seed, one traffic.
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// The cost of each generated request.
    #[arg(long)]
    pub(crate) cost: Option<u64>,
}

/// The flags that describe a `--log`, by their names in the request's `traffic`.
#[derive(Debug, clap::Args, serde::Serialize)]
pub(crate) struct Recorded {
    /// The log's format: auto (the default: detected), nginx, nginx_main, apache_common,
    /// apache_combined, envoy, istio, envoy_json, jsonl or csv.
    #[arg(long)]
    pub(crate) format: Option<String>,
    /// The key: a field, or fields separated by commas (`method,path,client`). By default the
    /// client's address for an access log, `key` for JSON lines and CSV.
    #[arg(long)]
    pub(crate) key: Option<String>,
    /// The field to key by (one; the same as --key with one field).
    #[arg(long, conflicts_with = "key")]
    pub(crate) key_field: Option<String>,
    /// The time field of a JSON lines or CSV log (timestamp by default).
    #[arg(long)]
    pub(crate) time_field: Option<String>,
    /// The unit of Unix times: s, ms, us or ns (by default told by their magnitude).
    #[arg(long)]
    pub(crate) time_unit: Option<String>,
}

/// The largest log file `sluice simulate` reads.
const MAX_LOG_FILE: u64 = 256 * 1024 * 1024;

/// A log file (or standard input for `-`) as text, at most [`MAX_LOG_FILE`] bytes; gzip
/// (told by its first bytes, whatever the name) is decompressed, and the bound holds for the
/// decompressed text. Bytes that are not UTF-8 become U+FFFD, so such a line is still counted.
fn read_log(path: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read;
    let shown = path.display();
    let mut raw = Vec::new();
    if path.as_os_str() == "-" {
        std::io::stdin()
            .take(MAX_LOG_FILE + 1)
            .read_to_end(&mut raw)
            .map_err(|e| anyhow::anyhow!("--log -: {e}"))?;
    } else {
        std::fs::File::open(path)
            .map_err(|e| anyhow::anyhow!("--log {shown}: {e}"))?
            .take(MAX_LOG_FILE + 1)
            .read_to_end(&mut raw)
            .map_err(|e| anyhow::anyhow!("--log {shown}: {e}"))?;
    }
    if raw.starts_with(&[0x1f, 0x8b]) && raw.len() as u64 <= MAX_LOG_FILE {
        let mut text = Vec::new();
        flate2::read::MultiGzDecoder::new(raw.as_slice())
            .take(MAX_LOG_FILE + 1)
            .read_to_end(&mut text)
            .map_err(|e| anyhow::anyhow!("--log {shown}: not a readable gzip file: {e}"))?;
        raw = text;
    }
    if raw.len() as u64 > MAX_LOG_FILE {
        anyhow::bail!(
            "--log {shown}: more than the {MAX_LOG_FILE} bytes this command reads (max log \
             file, decompressed); simulate a part of it"
        );
    }
    Ok(match String::from_utf8(raw) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// `sluice simulate`: builds the request `POST /v1/simulate` takes from the flags, runs it
/// with the same engine, prints the report and writes the chart.
pub(crate) fn simulate(args: &SimulateArgs) -> anyhow::Result<()> {
    use serde_json::json;
    use sluice_simulate::{Bounds, Simulation, policy_flag, render};

    let configured: Vec<sluice::Policy> = match &args.config {
        Some(path) => Config::load(path)?.policies,
        None => Vec::new(),
    };
    let policies = args
        .policies
        .iter()
        .map(|p| policy_flag(p))
        .collect::<Result<Vec<_>, _>>()?;
    let traffic = simulate_traffic(args)?;
    let mut request = json!({"policies": policies, "traffic": traffic});
    if let Some(b) = &args.bucket {
        request["bucket"] = json!(b);
    }
    if let Some(t) = args.top {
        request["top"] = json!(t);
    }
    let simulation = Simulation::from_request(&request, &configured, &Bounds::default())?;
    let started = std::time::Instant::now();
    let report = simulation.run()?;
    let elapsed = started.elapsed();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render::table(&report));
        let decisions = report.events * report.policies.len() as u64;
        println!(
            "\nsimulated {decisions} decisions in {:.3} s ({:.0} decisions/s)",
            elapsed.as_secs_f64(),
            decisions as f64 / elapsed.as_secs_f64().max(1e-9)
        );
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, render::svg(&report))
            .map_err(|e| anyhow::anyhow!("--svg {}: {e}", path.display()))?;
        if !args.json {
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// The flags of `group` that were given, by their names in the request.
fn given(group: &impl serde::Serialize) -> anyhow::Result<serde_json::Map<String, Value>> {
    let Value::Object(fields) = serde_json::to_value(group)? else {
        return Ok(serde_json::Map::new());
    };
    Ok(fields.into_iter().filter(|(_, v)| !v.is_null()).collect())
}

/// The request's `traffic` from the flags: a `--log` with its options, or a generated
/// pattern; a flag of the other kind is refused.
fn simulate_traffic(args: &SimulateArgs) -> anyhow::Result<serde_json::Map<String, Value>> {
    let generated = given(&args.generated)?;
    let mut recorded = given(&args.recorded)?;
    match (&args.log, generated.keys().next()) {
        (Some(_), Some(name)) => anyhow::bail!(
            "--{} is for a generated traffic, not with --log",
            name.replace('_', "-")
        ),
        (Some(path), None) => {
            recorded.insert("log".to_owned(), Value::String(read_log(path)?));
            Ok(recorded)
        }
        (None, _) if !recorded.is_empty() => anyhow::bail!(
            "--format, --key, --key-field, --time-field and --time-unit describe a --log"
        ),
        (None, _) if !generated.contains_key("pattern") => {
            anyhow::bail!("give a traffic: --pattern steady|bursts|poisson|ramp, or --log FILE")
        }
        (None, _) => Ok(generated),
    }
}
