//! `sluice`: parse the command line, then hand over to the library.

use std::process::ExitCode;

use clap::Parser;
use sluice_server::app::{self, Listeners};
mod cli;

use cli::{Cli, Command, ConfigCommand, LogFormat};
use sluice_server::config::Config;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let log_format = cli.log_format;
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            match log_format {
                LogFormat::Human => eprintln!("sluice: cannot start the runtime: {e}"),
                LogFormat::Json => tracing::error!("sluice: cannot start the runtime: {e}"),
            }
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(run(cli.command));
    result.unwrap_or_else(|e: anyhow::Error| {
        // A collector reading JSON lines gets the reason a server did not start as one too.
        match log_format {
            LogFormat::Human => eprintln!("sluice: {e:#}"),
            LogFormat::Json => tracing::error!("sluice: {e:#}"),
        }
        ExitCode::from(2)
    })
}

/// Logs to stderr, filtered by `RUST_LOG` (`info` by default), as text or JSON lines.
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only for a terminal: a log file or a collector gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Runs one command; its exit code.
async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve { config } => {
            let settings = cli::serve_config(config.as_ref())?;
            let listeners = Listeners::bind(&settings).await?;
            app::run(listeners, settings, config, shutdown_signal()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check {
            policy,
            key,
            cost,
            url,
            peek,
            client,
        } => {
            let request = cli::CheckRequest {
                url: &url,
                policy: &policy,
                key: &key,
                cost,
                peek,
            };
            let allowed = cli::check(&request, &client).await?;
            Ok(if allowed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Bench(args) => cli::bench(&args).await,
        Command::Simulate(args) => {
            cli::simulate(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            use std::io::Write as _;
            std::io::stdout().write_all(&cli::completions(shell))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Config {
            command: ConfigCommand::Check { file },
        } => match Config::load(&file) {
            Ok(c) => {
                let n = c.policies.len();
                let policies = if n == 1 { "policy" } else { "policies" };
                println!("{}: valid ({n} {policies})", file.display());
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => {
                eprintln!("{e}");
                Ok(ExitCode::from(1))
            }
        },
    }
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutting down: draining in-flight requests");
}
