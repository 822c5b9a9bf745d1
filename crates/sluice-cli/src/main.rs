//! `sluice`: parse the command line, then hand over to the library.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use sluice_server::app::{self, Listeners};
mod cli;
mod simulate;

use cli::{Cli, Command, ConfigCommand, LogFormat};

/// mimalloc rather than glibc's malloc: tonic and hyper allocate several buffers per gRPC
/// request (docs/benchmarks.md, "The server's allocator and the Envoy path"). Only the binary
/// chooses; the library crates leave the choice to whoever embeds them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let logs = cli::log_format(cli.log_format)
        .and_then(|format| Ok((format, log_filter(cli.log_level.as_deref(), &matches)?)));
    let ((log_format, format_origin), (filter, level, level_origin)) = match logs {
        Ok(logs) => logs,
        Err(e) => {
            eprintln!("sluice: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(log_format, filter);
    let logging = [
        (format!("{log_format:?}").to_lowercase(), format_origin),
        (level, level_origin),
    ];
    let result = tokio::runtime::Runtime::new()
        .map_err(|e| anyhow::anyhow!("cannot start the runtime: {e}"))
        .and_then(|runtime| runtime.block_on(run(cli.command, &matches, &logging)));
    result.unwrap_or_else(|e: anyhow::Error| {
        // A collector reading JSON lines gets the reason a server did not start as one too.
        match log_format {
            LogFormat::Human => eprintln!("sluice: {e:#}"),
            LogFormat::Json => tracing::error!("sluice: {e:#}"),
        }
        ExitCode::from(2)
    })
}

/// The log filter: `--log-level` or `SLUICE_LOG_LEVEL`, else `RUST_LOG`, else `info`; with
/// its text and where it came from. A filter that does not parse is an error naming it.
fn log_filter(
    given: Option<&str>,
    matches: &clap::ArgMatches,
) -> anyhow::Result<(tracing_subscriber::EnvFilter, String, String)> {
    let parse = |text: &str| tracing_subscriber::EnvFilter::builder().parse(text);
    if let Some(text) = given {
        let from = cli::origin(matches, "log_level", "--log-level", "SLUICE_LOG_LEVEL");
        let filter = parse(text).map_err(|e| {
            anyhow::anyhow!(
                "{from}: `{text}` is not a log filter ({e}); give a level (error, warn, info, \
                 debug, trace) or directives such as info,sluice_redis=debug"
            )
        })?;
        return Ok((filter, text.to_owned(), from));
    }
    if let Ok(text) = std::env::var("RUST_LOG")
        && !text.is_empty()
        && let Ok(filter) = parse(&text)
    {
        return Ok((filter, text, "env RUST_LOG".to_owned()));
    }
    // As before: a RUST_LOG that is unset, empty or does not parse falls back to `info`.
    Ok((parse("info")?, "info".to_owned(), "default".to_owned()))
}

/// Logs to stderr, filtered by `filter`, as text or JSON lines.
fn init_logging(format: LogFormat, filter: tracing_subscriber::EnvFilter) {
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
async fn run(
    command: Command,
    matches: &clap::ArgMatches,
    logging: &[(String, String)],
) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(args) => {
            let source = args.source(None);
            let settings = cli::serve_config(&source)?;
            let listeners = Listeners::bind(&settings).await?;
            app::run(listeners, settings, source, shutdown_signal()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check(args) => Ok(if cli::check(&args).await? {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        }),
        Command::Bench(args) => cli::bench(&args).await,
        Command::Simulate(args) => {
            simulate::simulate(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            use std::io::Write as _;
            std::io::stdout().write_all(&cli::completions(shell))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Config {
            command:
                ConfigCommand::Check {
                    file,
                    explain,
                    settings,
                },
        } => {
            let sub = matches
                .subcommand_matches("config")
                .and_then(|m| m.subcommand_matches("check"));
            let flag_config = sub.and_then(|m| m.value_source("config"))
                == Some(clap::parser::ValueSource::CommandLine);
            if file.is_some() && flag_config {
                anyhow::bail!("give the file once: as an argument or as --config, not both");
            }
            let source = settings.source(file.as_ref());
            let file_origin = cli::ConfigArgs::file_origin(sub, file.is_some());
            Ok(cli::config_check(&source, explain, &file_origin, logging))
        }
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
