//! Reloading: the configuration file (with its flags and variables applied again) and its
//! Envoy rate limit files, watched by content, and applied whole when valid; a reload that is
//! invalid, would switch the source of the Envoy rules, or would leave nothing to limit or
//! nothing guarding the admin routes is refused and the last good configuration stays.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, ConfigSource};
use crate::state::Shared;
use sluice_envoy_rules::RlsConfig;

/// How often the configuration file is checked for changes.
pub const RELOAD_POLL: Duration = Duration::from_millis(500);

/// Reads the Envoy rate limit service files, if configured.
pub fn load_rls(
    config: &Config,
) -> Result<Option<Arc<RlsConfig>>, sluice_envoy_rules::RlsConfigError> {
    let Some(settings) = &config.rls else {
        return Ok(None);
    };
    let options = sluice_envoy_rules::LoadOptions {
        merge_domains: settings.merge_domains,
        ignore_dot_files: settings.ignore_dot_files,
    };
    let Some(dir) = settings.config_dir() else {
        // `rls.xds`: the rules arrive from the control plane (crate::rls_xds).
        return Ok(None);
    };
    let rls = RlsConfig::load_dir_with(dir, &options)?;
    for w in rls.warnings() {
        tracing::warn!(warning = %w, "rate limit configuration");
    }
    Ok(Some(Arc::new(rls)))
}

/// What the configuration is made of on disk: the file's bytes, and the name and bytes of every
/// file under its `rls.config_dir`, so that editing an Envoy rate limit file reloads too (as
/// the reference service does). Contents, not modification times: two edits within one tick of
/// a coarse file system clock must not look the same. The files are small.
fn fingerprint(path: Option<&std::path::Path>, rls_dir: Option<&std::path::Path>) -> Vec<u8> {
    let mut out = path.and_then(|p| std::fs::read(p).ok()).unwrap_or_default();
    if let Some(dir) = rls_dir {
        // What the loader reads: not kubelet's `..data` and `..<timestamp>` (their files are
        // read through the mount's top-level links), nor a linked directory.
        let entries = walkdir::WalkDir::new(dir)
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|e| !sluice_envoy_rules::is_kubelet_entry(e.file_name()));
        for entry in entries.flatten().filter(|e| !e.path().is_dir()) {
            out.extend(entry.path().display().to_string().into_bytes());
            out.push(0);
            out.extend(std::fs::read(entry.path()).unwrap_or_default());
        }
    }
    out
}

/// Why a reload that would leave nothing to limit, or nothing guarding the admin routes, is
/// refused: the running configuration has policies (or Envoy rules, or an `admin` section) and
/// the new one has none. An editor's truncating write, or a file caught half-written, reads as
/// a configuration of nothing; applying it would answer every check `404 unknown_policy`, or
/// every admin route to anyone. Running without any is done by a restart.
fn refuse_emptying(
    running: &crate::state::Generation,
    next: &Config,
    next_rls: Option<&RlsConfig>,
) -> Option<String> {
    let mut names: Vec<&str> = running
        .limiter
        .policies()
        .map(sluice::Policy::name)
        .collect();
    if !names.is_empty() && next.policies.is_empty() {
        names.sort_unstable();
        return Some(format!(
            "the new configuration has no policies where the running one has {} ({}); a reload \
             never removes every policy at once (a file truncated by an editor or caught \
             half-written reads as none): restart the server to run without policies",
            names.len(),
            names.join(", ")
        ));
    }
    if running.admin.is_some() && next.admin.is_none() {
        return Some(
            "the new configuration has no admin section where the running one has one; a \
             reload never opens the admin routes to anyone (a file that lost the section by \
             mistake would): restart the server to run without one"
                .to_owned(),
        );
    }
    let running_domains: Vec<&str> = running
        .rls
        .as_deref()
        .map_or_else(Vec::new, |r| r.domains().collect());
    if !running_domains.is_empty() && next_rls.is_none_or(RlsConfig::is_empty) {
        return Some(format!(
            "the new configuration has no Envoy rate limit rules where the running one has the \
             domains {}; a reload never removes every rule at once (a rule file truncated by an \
             editor reads as none): restart the server to run without them",
            running_domains.join(", ")
        ));
    }
    None
}

/// Whether the server's Envoy rules come from xDS (`rls.xds` at start).
fn from_xds(shared: &Shared) -> bool {
    let started = shared.started_with().rls.as_ref();
    started.is_some_and(|r| r.xds().is_some())
}

/// Why a reload is refused; the last good configuration stays.
#[derive(Debug, thiserror::Error)]
enum ReloadRefused {
    /// The file (with the flags and variables) is not a valid configuration.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The Envoy rate limit files cannot be read.
    #[error(transparent)]
    Rls(#[from] sluice_envoy_rules::RlsConfigError),
    /// The rules would come from the other source (`rls.config_dir` or `rls.xds`).
    #[error(
        "rls: the source of the Envoy rules (config_dir or xds) changed; it is chosen at \
         start, restart the server to switch"
    )]
    RulesSource,
    /// The reload would leave nothing to limit ([`refuse_emptying`]).
    #[error("{0}")]
    Emptying(String),
}

/// The Envoy rules a reload of the configuration file applies: read from the rules directory,
/// or, when they come from xDS, the ones in force (the control plane replaces them, not the
/// file). Switching between a directory and xDS takes a restart.
fn reload_rls(shared: &Shared, next: &Config) -> Result<Option<Arc<RlsConfig>>, ReloadRefused> {
    let next_xds = next.rls.as_ref().is_some_and(|r| r.xds().is_some());
    match (from_xds(shared), next_xds) {
        (true, true) => Ok(shared.snapshot().rls.clone()),
        (false, false) => Ok(load_rls(next)?),
        _ => Err(ReloadRefused::RulesSource),
    }
}

/// Reloads the configuration on SIGHUP and when the file, or a file of its Envoy rate limit
/// directory, changes; the flags and variables of `source` are applied again each time.
pub(crate) async fn watch_config(source: ConfigSource, shared: Arc<Shared>) {
    let path = source.file.as_deref();
    let file = path.map_or_else(|| "<no file>".to_owned(), |p| p.display().to_string());
    let rls_dir = || {
        source
            .load()
            .ok()
            .and_then(|c| c.rls.and_then(|r| r.config_dir().map(PathBuf::from)))
    };
    let mut dir = rls_dir();
    let mut last = fingerprint(path, dir.as_deref());
    let mut tick = tokio::time::interval(RELOAD_POLL);
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        let forced = match hup.as_mut() {
            Some(h) => tokio::select! {
                _ = tick.tick() => false,
                _ = h.recv() => true,
            },
            None => {
                tick.tick().await;
                false
            }
        };
        #[cfg(not(unix))]
        let forced = {
            tick.tick().await;
            false
        };
        let now = fingerprint(path, dir.as_deref());
        if !forced && now == last {
            continue;
        }
        dir = rls_dir().or(dir);
        last = fingerprint(path, dir.as_deref());
        match source.load().map_err(ReloadRefused::from).and_then(|c| {
            let rls = reload_rls(&shared, &c)?;
            refuse_emptying(&shared.snapshot(), &c, rls.as_deref())
                .map_or(Ok((c, rls)), |reason| Err(ReloadRefused::Emptying(reason)))
        }) {
            Ok((config, rls)) => {
                for section in shared.started_with().restart_only_changes(&config) {
                    tracing::warn!(
                        file = %file,
                        "the {section} section changed: it is read at start only, so the change \
                         applies after a restart"
                    );
                }
                if from_xds(&shared) {
                    shared.apply_keeping_rls(&config);
                } else {
                    shared.apply(&config, rls);
                }
                tracing::info!(file = %file, policies = config.policies.len(), "configuration reloaded");
            }
            Err(e) => {
                tracing::error!(file = %file, error = %e, "configuration reload refused; keeping the last good one");
                shared.reload_failed(crate::state::ReloadSource::File, e.to_string());
            }
        }
    }
}
