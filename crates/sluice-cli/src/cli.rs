//! The `sluice` command line (docs/configuration.md lists every command and flag).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::simulate::SimulateArgs;
use sluice_server::config::{
    Config, ConfigSource, DEMO, Explained, Given, NoFile, Overrides, SETTINGS, StoreConfig,
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
    Check(CheckArgs),
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
/// file; docs/configuration.md, "Flags and environment"). The flags and variables are those
/// of the server's one table of settings ([`SETTINGS`]), each marked flag or variable as
/// clap found it.
#[derive(Debug, Clone)]
pub(crate) struct ConfigArgs {
    /// The configuration file (`--config`, `SLUICE_CONFIG`).
    pub(crate) config: Option<PathBuf>,
    /// The settings given as flags or variables.
    overrides: Overrides,
}

impl clap::Args for ConfigArgs {
    fn augment_args(command: clap::Command) -> clap::Command {
        let config = clap::Arg::new("config")
            .long("config")
            .env("SLUICE_CONFIG")
            .value_name("FILE")
            .value_parser(clap::value_parser!(PathBuf))
            .help("The configuration file (YAML)");
        SETTINGS.iter().fold(command.arg(config), |command, s| {
            command.arg(
                clap::Arg::new(s.flag)
                    .long(s.flag)
                    .env(s.env)
                    .value_name(s.value_name)
                    .help(s.help)
                    .hide_env_values(s.secret),
            )
        })
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        Self::augment_args(command)
    }
}

impl clap::FromArgMatches for ConfigArgs {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut overrides = Overrides::default();
        for s in &SETTINGS {
            if let Some(value) = matches.get_one::<String>(s.flag) {
                let given = match matches.value_source(s.flag) {
                    Some(clap::parser::ValueSource::EnvVariable) => Given::Env,
                    _ => Given::Flag,
                };
                overrides.set(s.setting, value, given);
            }
        }
        Ok(Self {
            config: matches.get_one::<PathBuf>("config").cloned(),
            overrides,
        })
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl ConfigArgs {
    /// The configuration's source: these values and `file` (a positional file, which wins
    /// over `--config`'s variable).
    pub(crate) fn source(&self, file: Option<&PathBuf>) -> ConfigSource {
        ConfigSource {
            file: file.or(self.config.as_ref()).cloned(),
            overrides: self.overrides.clone(),
        }
    }

    /// How `--explain` names where the file came from.
    pub(crate) fn file_origin(matches: Option<&clap::ArgMatches>, positional: bool) -> String {
        if positional {
            return "argument".to_owned();
        }
        matches.map_or_else(
            || "default".to_owned(),
            |m| origin(m, "config", "--config", "SLUICE_CONFIG"),
        )
    }
}

/// Where a setting of the command line came from, as `config check --explain` prints it.
pub(crate) fn origin(matches: &clap::ArgMatches, id: &str, flag: &str, env: &str) -> String {
    match matches.value_source(id) {
        Some(clap::parser::ValueSource::CommandLine) => format!("flag {flag}"),
        Some(clap::parser::ValueSource::EnvVariable) => format!("env {env}"),
        _ => "default".to_owned(),
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
    let config = source.load()?;
    match source.without_file() {
        None => {}
        Some(NoFile::Demo) => {
            let store = match &config.store {
                StoreConfig::Memory => "the in-memory store".to_owned(),
                other => other.to_string(),
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
                config.store
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
    println!("{}: valid ({n} {policies})", source.file_name());
    if explain {
        let (file, origin) = source.file.as_ref().map_or_else(
            || ("none".to_owned(), "default"),
            |path| (path.display().to_string(), file_origin),
        );
        println!("{}", Explained::new("config", file, origin));
        for line in source.explain(&config) {
            println!("{line}");
        }
        for (key, (value, origin)) in ["log.format", "log.level"].iter().zip(logging) {
            println!("{}", Explained::new(*key, value.clone(), origin.clone()));
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

/// What `sluice check` asks, and how to reach the server.
#[derive(Debug, clap::Args)]
pub(crate) struct CheckArgs {
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
}

/// `sluice check`: one decision from a running server (or, with `--peek`, the decision a
/// check would get, recording nothing), its body printed as JSON; `Ok(allowed)`, or an error
/// for any other answer.
pub(crate) async fn check(request: &CheckArgs) -> anyhow::Result<bool> {
    let client = &request.client;
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
