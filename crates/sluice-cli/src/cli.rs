//! The `sluice` command line (docs/configuration.md lists every command and flag).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use sluice_server::config::{
    Config, ConfigSource, DEMO, Given, NoFile, Overrides, Setting, StoreConfig,
};

/// Sluice: a distributed rate limiter.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about = "Sluice: a distributed rate limiter")]
pub(crate) struct Cli {
    /// Log format [env: SLUICE_LOG_FORMAT] [default: human].
    // The variable is read by `log_format`, not by clap, so that a bad value is named as the
    // variable rather than as this flag.
    #[arg(long, global = true, value_enum)]
    pub(crate) log_format: Option<LogFormat>,
    /// Log filter: a level (error, warn, info, debug, trace) or tracing directives such as
    /// `info,sluice_redis=debug`; without it, `RUST_LOG`, else `info`.
    #[arg(long, global = true, env = "SLUICE_LOG_LEVEL", value_name = "FILTER")]
    pub(crate) log_level: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The log format: `--log-format`, else `SLUICE_LOG_FORMAT`, else human; with where it came
/// from. A variable naming no format is an error naming it.
pub(crate) fn log_format(flag: Option<LogFormat>) -> anyhow::Result<(LogFormat, String)> {
    if let Some(format) = flag {
        return Ok((format, "flag --log-format".to_owned()));
    }
    match std::env::var("SLUICE_LOG_FORMAT") {
        Ok(text) => LogFormat::from_str(text.trim(), true)
            .map(|f| (f, "env SLUICE_LOG_FORMAT".to_owned()))
            .map_err(|_| {
                anyhow::anyhow!(
                    "env SLUICE_LOG_FORMAT: `{text}` is not a log format; expected human or json"
                )
            }),
        Err(_) => Ok((LogFormat::Human, "default".to_owned())),
    }
}

/// Log formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Lines for people.
    Human,
    /// One JSON object per line.
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the servers. Without --config: the in-memory store and a demo policy.
    Serve(ConfigArgs),
    /// Ask a running server for a decision (exit 0 allowed, 1 denied, 2 an error).
    Check {
        /// The policy.
        #[arg(long)]
        policy: String,
        /// The key.
        #[arg(long)]
        key: String,
        /// The cost.
        #[arg(long, default_value_t = 1)]
        cost: u64,
        /// The server: http:// or https://.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Only look (`POST /v1/peek`): the decision a check would get now, recording nothing.
        #[arg(long)]
        peek: bool,
        /// How to reach the server: --cacert for https://, an admin token.
        #[command(flatten)]
        client: sluice_bench::ClientArgs,
    },
    /// Load a server (HTTP or gRPC) or the library in-process, and report decisions/s and
    /// latency. Stops by itself after --duration or --requests.
    Bench(sluice_bench::BenchArgs),
    /// Run a traffic through one or more policies on a manual clock, faster than real time,
    /// and compare what each admits and denies (docs/simulate.md).
    Simulate(SimulateArgs),
    /// Configuration tools.
    Config {
        /// What to do with a configuration.
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Print a completion script for a shell on standard output (docs/deploying.md says where
    /// to put it).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

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
    /// A recorded traffic: a log file (`-` for standard input), plain or gzip (`.gz`).
    #[arg(long)]
    pub(crate) log: Option<PathBuf>,
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
    use sluice_server::simulate::{self, Bounds, Simulation};

    let configured: Vec<sluice::Policy> = match &args.config {
        Some(path) => Config::load(path)?
            .policies
            .into_iter()
            .map(|p| p.policy)
            .collect(),
        None => Vec::new(),
    };
    let policies = args
        .policies
        .iter()
        .map(|p| simulate::policy_flag(p))
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
        print!("{}", simulate::render::table(&report));
        let decisions = report.events * report.policies.len() as u64;
        println!(
            "\nsimulated {decisions} decisions in {:.3} s ({:.0} decisions/s)",
            elapsed.as_secs_f64(),
            decisions as f64 / elapsed.as_secs_f64().max(1e-9)
        );
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, simulate::render::svg(&report))
            .map_err(|e| anyhow::anyhow!("--svg {}: {e}", path.display()))?;
        if !args.json {
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// The request's `traffic` from the flags: a `--log` with its options, or a generated
/// pattern; a flag of the other kind is refused.
fn simulate_traffic(
    args: &SimulateArgs,
) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    use serde_json::{Value, json};

    let mut traffic = serde_json::Map::new();
    let mut put = |name: &str, value: Option<Value>| {
        if let Some(v) = value {
            traffic.insert(name.to_owned(), v);
        }
    };
    if let Some(path) = &args.log {
        let text = read_log(path)?;
        put("log", Some(json!(text)));
        put("format", args.format.as_ref().map(|f| json!(f)));
        put("key", args.key.as_ref().map(|f| json!(f)));
        put("key_field", args.key_field.as_ref().map(|f| json!(f)));
        put("time_field", args.time_field.as_ref().map(|f| json!(f)));
        put("time_unit", args.time_unit.as_ref().map(|f| json!(f)));
        for (flag, given) in [
            ("--pattern", args.pattern.is_some()),
            ("--rate", args.rate.is_some()),
            ("--duration", args.duration.is_some()),
            ("--keys", args.keys.is_some()),
            ("--seed", args.seed.is_some()),
        ] {
            if given {
                anyhow::bail!("{flag} is for a generated traffic, not with --log");
            }
        }
    } else {
        if args.format.is_some()
            || args.key.is_some()
            || args.key_field.is_some()
            || args.time_field.is_some()
            || args.time_unit.is_some()
        {
            anyhow::bail!(
                "--format, --key, --key-field, --time-field and --time-unit describe a --log"
            );
        }
        let Some(pattern) = &args.pattern else {
            anyhow::bail!("give a traffic: --pattern steady|bursts|poisson|ramp, or --log FILE");
        };
        put("pattern", Some(json!(pattern)));
        put("rate", args.rate.map(|v| json!(v)));
        put("size", args.size.map(|v| json!(v)));
        put("every", args.every.as_ref().map(|v| json!(v)));
        put("from", args.from.map(|v| json!(v)));
        put("to", args.to.map(|v| json!(v)));
        put("duration", args.duration.as_ref().map(|v| json!(v)));
        put("keys", args.keys.map(|v| json!(v)));
        put("key_choice", args.key_choice.as_ref().map(|v| json!(v)));
        put("zipf_exponent", args.zipf_exponent.map(|v| json!(v)));
        put("seed", args.seed.map(|v| json!(v)));
        put("cost", args.cost.map(|v| json!(v)));
    }
    Ok(traffic)
}

/// `sluice config …`.
#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Validate a configuration file with the flags and SLUICE_* variables applied as
    /// `serve` would; exits non-zero with the reasons.
    Check {
        /// The file (instead of --config or SLUICE_CONFIG).
        file: Option<PathBuf>,
        /// Print each effective setting and where it came from (flag, env, file, default).
        #[arg(long)]
        explain: bool,
        /// The same settings as `serve`.
        #[command(flatten)]
        settings: ConfigArgs,
    },
}

/// Where the configuration comes from: a file and the settings an operator gives per
/// deployment as flags or `SLUICE_*` variables (a flag over its variable, either over the
/// file; docs/configuration.md, "Flags and environment").
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ConfigArgs {
    /// The configuration file (YAML).
    #[arg(long, env = "SLUICE_CONFIG", value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// The HTTP API's address, IP:port (listen.http).
    #[arg(long, env = "SLUICE_HTTP", value_name = "ADDR")]
    http: Option<String>,
    /// The gRPC address, IP:port (listen.grpc).
    #[arg(long, env = "SLUICE_GRPC", value_name = "ADDR")]
    grpc: Option<String>,
    /// The admin listener's address, IP:port (listen.admin).
    #[arg(long, env = "SLUICE_ADMIN", value_name = "ADDR")]
    admin: Option<String>,
    /// One Redis (redis://host:6379) instead of the file's memory store or single primary.
    // Its value may hold a password: `--help` never shows it.
    #[arg(
        long,
        env = "SLUICE_REDIS_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    redis_url: Option<String>,
    /// The Redis key prefix (store.key_prefix).
    #[arg(long, env = "SLUICE_KEY_PREFIX", value_name = "PREFIX")]
    key_prefix: Option<String>,
    /// The Envoy rate limit rules directory (rls.config_dir).
    #[arg(long, env = "SLUICE_RLS_CONFIG_DIR", value_name = "DIR")]
    rls_config_dir: Option<PathBuf>,
}

impl ConfigArgs {
    /// The configuration's source: these values, each marked flag or variable from `matches`
    /// (the subcommand's), and `file` (a positional file, which wins over `--config`'s
    /// variable).
    pub(crate) fn source(
        &self,
        matches: Option<&clap::ArgMatches>,
        file: Option<&PathBuf>,
    ) -> ConfigSource {
        let given = |id: &str| match matches.and_then(|m| m.value_source(id)) {
            Some(clap::parser::ValueSource::EnvVariable) => Given::Env,
            _ => Given::Flag,
        };
        let mut overrides = Overrides::none();
        let values = [
            (Setting::Http, "http", self.http.clone()),
            (Setting::Grpc, "grpc", self.grpc.clone()),
            (Setting::Admin, "admin", self.admin.clone()),
            (Setting::RedisUrl, "redis_url", self.redis_url.clone()),
            (Setting::KeyPrefix, "key_prefix", self.key_prefix.clone()),
            (
                Setting::RlsConfigDir,
                "rls_config_dir",
                self.rls_config_dir
                    .as_ref()
                    .map(|d| d.display().to_string()),
            ),
        ];
        for (setting, id, value) in values {
            if let Some(v) = value {
                overrides.set(setting, v, given(id));
            }
        }
        ConfigSource {
            file: file.or(self.config.as_ref()).cloned(),
            overrides,
        }
    }

    /// How `--explain` names where the file came from.
    pub(crate) fn file_origin(matches: Option<&clap::ArgMatches>, positional: bool) -> String {
        if positional {
            return "argument".to_owned();
        }
        match matches.and_then(|m| m.value_source("config")) {
            Some(clap::parser::ValueSource::EnvVariable) => "env SLUICE_CONFIG".to_owned(),
            Some(clap::parser::ValueSource::CommandLine) => "flag --config".to_owned(),
            _ => "default".to_owned(),
        }
    }
}

/// `sluice completions SHELL`: the completion script of this command line, generated by
/// `clap_complete` from the same definition the parser uses, so it never falls behind. Made
/// in memory (the generator panics on a failed write) and written by the caller, so a closed
/// pipe is an error, not a panic.
pub(crate) fn completions(shell: clap_complete::Shell) -> Vec<u8> {
    let mut command = <Cli as clap::CommandFactory>::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "sluice", &mut script);
    script
}

/// The body of the demo's example `curl`.
const DEMO_BODY: &str = "{\"policy\": \"demo\", \"key\": \"me\"}";

/// Loads the configuration for `serve` (the file, or the demo one, with the flags and
/// variables applied), saying what it serves when there is no file.
pub(crate) fn serve_config(source: &ConfigSource) -> anyhow::Result<Config> {
    source.overrides.check()?;
    let config = source.load()?;
    match source.without_file() {
        None => {}
        Some(NoFile::Demo) => {
            let store = match &config.store {
                StoreConfig::Memory => "the in-memory store".to_owned(),
                other => sluice_server::config::describe_store(other),
            };
            println!(
                "sluice: no --config given; serving {store} with this demo configuration:\n\n\
                 {DEMO}\nTry:\n  curl -s -X POST http://{}/v1/check -d '{DEMO_BODY}'\n",
                config.http
            );
        }
        Some(NoFile::RulesOnly) => {
            let dir = config
                .rls
                .as_ref()
                .and_then(|r| r.config_dir())
                .map(|d| d.display().to_string())
                .unwrap_or_default();
            println!(
                "sluice: no --config given; serving the Envoy rules of {dir} on {} (no policy \
                 for the HTTP API: give a file with policies for it)",
                sluice_server::config::describe_store(&config.store)
            );
        }
    }
    Ok(config)
}

/// `sluice config check`: exit 0 valid, 1 an invalid configuration, 2 a bad flag or variable.
/// With `explain`, each effective setting, its value and where it came from, one per line.
pub(crate) fn config_check(
    source: &ConfigSource,
    explain: bool,
    file_origin: &str,
    logging: &[(String, String)],
) -> ExitCode {
    if let Err(e) = source.overrides.check() {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    let config = match source.load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    let n = config.policies.len();
    let policies = if n == 1 { "policy" } else { "policies" };
    let name = source.file.as_ref().map_or_else(
        || match source.without_file() {
            Some(NoFile::Demo) => "the built-in demo configuration".to_owned(),
            _ => "the defaults".to_owned(),
        },
        |p| p.display().to_string(),
    );
    println!("{name}: valid ({n} {policies})");
    if explain {
        let file = match &source.file {
            Some(path) => path.display().to_string(),
            None => "none".to_owned(),
        };
        let origin = if source.file.is_some() {
            file_origin
        } else {
            "default"
        };
        println!(
            "{}",
            sluice_server::config::Explained::new("config", file, origin)
        );
        for line in source.explain(&config) {
            println!("{line}");
        }
        for (key, (value, origin)) in ["log.format", "log.level"].iter().zip(logging) {
            println!(
                "{}",
                sluice_server::config::Explained::new(*key, value.clone(), origin.clone())
            );
        }
    }
    ExitCode::SUCCESS
}

/// `sluice bench`: runs the load and prints the report; exit code 2, with the reason, when
/// the store decided nothing (every request failed, or every answer was degraded).
pub(crate) async fn bench(args: &sluice_bench::BenchArgs) -> anyhow::Result<ExitCode> {
    let report = sluice_bench::run(args).await?;
    if args.json {
        println!("{}", report.to_json(args));
    } else {
        print!("{}", report.to_text(args));
    }
    Ok(match report.measured_nothing() {
        Some(why) => {
            eprintln!("sluice bench: {why}");
            ExitCode::from(2)
        }
        None => ExitCode::SUCCESS,
    })
}

/// What `sluice check` asks.
#[derive(Debug)]
pub(crate) struct CheckRequest<'a> {
    pub(crate) url: &'a str,
    pub(crate) policy: &'a str,
    pub(crate) key: &'a str,
    pub(crate) cost: u64,
    /// `POST /v1/peek` instead of `/v1/check`.
    pub(crate) peek: bool,
}

/// `sluice check`: one decision from a running server (or, with `--peek`, the decision a
/// check would get, recording nothing), its body printed as JSON; `Ok(allowed)`, or an error
/// for any other answer.
pub(crate) async fn check(
    request: &CheckRequest<'_>,
    client: &sluice_bench::ClientArgs,
) -> anyhow::Result<bool> {
    let route = if request.peek { "peek" } else { "check" };
    let url = format!("{}/v1/{route}", request.url.trim_end_matches('/'));
    let body =
        serde_json::json!({"policy": request.policy, "key": request.key, "cost": request.cost});
    let response = client
        .http()?
        .post(&url)
        .json(&body)
        .send()
        .await
        .map_err(|e| {
            let text = sluice_bench::client::error_chain(&e);
            let hint = if text.contains("certificate") && client.cacert.is_none() {
                "; if the server's certificate is signed by a CA of your own, pass it as \
                 --cacert FILE"
            } else {
                ""
            };
            anyhow::anyhow!("{text}{hint}")
        })?;
    let status = response.status();
    let text = response.text().await?;
    println!("{text}");
    match status.as_u16() {
        // A peek answers 200 either way; the body says what a check would get.
        200 if request.peek => {
            let answer: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{url}: the answer is not JSON: {e}"))?;
            Ok(answer["allowed"] == serde_json::Value::Bool(true))
        }
        200 => Ok(true),
        429 => Ok(false),
        other => anyhow::bail!("{url} answered {other}"),
    }
}
