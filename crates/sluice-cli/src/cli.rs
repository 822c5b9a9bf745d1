//! The `sluice` command line (docs/configuration.md lists every command and flag).

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use sluice_server::config::{Config, DEMO};

/// Sluice: a distributed rate limiter.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about = "Sluice: a distributed rate limiter")]
pub(crate) struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human)]
    pub(crate) log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
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
    Serve {
        /// The configuration file (YAML).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Ask a running server for a decision.
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
        /// The server.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// Load a server (HTTP or gRPC) or the library in-process, and report decisions/s and
    /// latency. Stops by itself after --duration or --requests.
    Bench(sluice_bench::BenchArgs),
    /// Configuration tools.
    Config {
        /// What to do with a configuration.
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

/// `sluice config …`.
#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Validate a configuration file; exits non-zero with the reasons.
    Check {
        /// The file.
        file: PathBuf,
    },
}

/// Loads the configuration for `serve`, or the demo one.
pub(crate) fn serve_config(file: Option<&PathBuf>) -> anyhow::Result<Config> {
    match file {
        Some(path) => Ok(Config::load(path)?),
        None => {
            let config = Config::demo();
            println!(
                "sluice: no --config given; serving the in-memory store with this demo \
                 configuration:\n\n{DEMO}\nTry:\n  curl -s -X POST http://{}/v1/check -d \
                 '{{\"policy\": \"demo\", \"key\": \"me\"}}'\n",
                config.http
            );
            Ok(config)
        }
    }
}

/// `sluice check`: one decision from a running server, printed as JSON; exit code 0 when
/// allowed, 1 when denied, 2 on errors.
pub(crate) async fn check(url: &str, policy: &str, key: &str, cost: u64) -> anyhow::Result<bool> {
    let body = serde_json::json!({"policy": policy, "key": key, "cost": cost});
    let response = reqwest::Client::new()
        .post(format!("{}/v1/check", url.trim_end_matches('/')))
        .json(&body)
        .send()
        .await?;
    let status = response.status();
    let text = response.text().await?;
    println!("{text}");
    match status.as_u16() {
        200 => Ok(true),
        429 => Ok(false),
        other => anyhow::bail!("the server answered {other}"),
    }
}
