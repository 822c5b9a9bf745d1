//! Settings given as flags or `SLUICE_*` variables, applied onto a parsed [`Config`].
//!
//! Precedence is flag > environment > file > default (docs/configuration.md, "Flags and
//! environment"). The command line resolves flag over variable (clap's `env`); what reaches
//! here is one value per setting with where it came from. [`ConfigSource::load`] is the one
//! path from a file and these values to a [`Config`]: `serve`, `config check` and a reload
//! all take it, so a reload re-reads the file and re-applies the same values.
//!
//! [`SETTINGS`] is the one table of these settings: the command line builds its flags and
//! variables from it, and checking, applying and explaining a value all read its row.

use std::fmt;
use std::path::PathBuf;

use sluice_redis::{Shard, Topology};

use super::listen::{ListenAddr, check_listen};
use super::{Config, ConfigError, RlsSettings, RulesSource, StoreConfig, store};

/// A setting an operator may give as a flag or a variable instead of in the file; its row of
/// [`SETTINGS`] says everything else about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Setting {
    /// `listen.http`.
    Http,
    /// `listen.grpc`.
    Grpc,
    /// `listen.admin`.
    Admin,
    /// One Redis, replacing `store` (memory, or one shard without replicas).
    RedisUrl,
    /// `store.key_prefix`.
    KeyPrefix,
    /// `rls.config_dir`.
    RlsConfigDir,
}

/// One row of [`SETTINGS`]: how a setting is given, what it sets and how it is checked.
#[derive(Debug)]
pub struct Declared {
    /// Which setting.
    pub setting: Setting,
    /// The flag's long name: `http` for `--http`.
    pub flag: &'static str,
    /// The environment variable, e.g. `SLUICE_HTTP`.
    pub env: &'static str,
    /// What the flag's value is called in `--help`.
    pub value_name: &'static str,
    /// The flag's help.
    pub help: &'static str,
    /// Its value may hold a password: `--help` never shows the variable's, errors and
    /// `--explain` show it redacted.
    pub secret: bool,
    /// The key `--explain` names it by.
    key: &'static str,
    /// The file's keys that set it (for `--explain` to tell the file's value from a default).
    file_keys: &'static [&'static str],
    /// Checks the value on its own, before any file is read.
    check: fn(&Override) -> Result<(), ConfigError>,
    /// Applies the value onto a configuration read from the file named by the `&str`.
    apply: fn(&Override, &mut Config, &str) -> Result<(), ConfigError>,
    /// Its effective value for `--explain` (secrets redacted); `None`: not a line.
    shown: fn(&Config) -> Option<String>,
}

/// Every setting, in the order of `--help` and `config check --explain`.
pub const SETTINGS: [Declared; 6] = [
    Declared {
        setting: Setting::Http,
        flag: "http",
        env: "SLUICE_HTTP",
        value_name: "ADDR",
        help: "The HTTP API's address, IP:port (listen.http)",
        secret: false,
        key: "listen.http",
        file_keys: &["listen.http"],
        check: |o| listen_addr(o).map(drop),
        apply: |o, config, _| {
            config.http = listen_addr(o)?;
            Ok(())
        },
        shown: |config| Some(config.http.to_string()),
    },
    Declared {
        setting: Setting::Grpc,
        flag: "grpc",
        env: "SLUICE_GRPC",
        value_name: "ADDR",
        help: "The gRPC address, IP:port (listen.grpc)",
        secret: false,
        key: "listen.grpc",
        file_keys: &["listen.grpc"],
        check: |o| listen_addr(o).map(drop),
        apply: |o, config, _| {
            config.grpc = listen_addr(o)?;
            Ok(())
        },
        shown: |config| Some(config.grpc.to_string()),
    },
    Declared {
        setting: Setting::Admin,
        flag: "admin",
        env: "SLUICE_ADMIN",
        value_name: "ADDR",
        help: "The admin listener's address, IP:port (listen.admin)",
        secret: false,
        key: "listen.admin",
        file_keys: &["listen.admin"],
        check: |o| listen_addr(o).map(drop),
        apply: |o, config, _| {
            config.admin_http = Some(listen_addr(o)?);
            Ok(())
        },
        shown: |config| {
            Some(config.admin_http.map_or_else(
                || "none (admin routes on listen.http)".to_owned(),
                |a| a.to_string(),
            ))
        },
    },
    Declared {
        setting: Setting::RedisUrl,
        flag: "redis-url",
        env: "SLUICE_REDIS_URL",
        value_name: "URL",
        help: "One Redis (redis://host:6379) instead of the file's memory store or single primary",
        secret: true,
        key: "store",
        file_keys: &[
            "store.backend",
            "store.shards",
            "store.cluster",
            "store.sentinel",
            "store.regions",
        ],
        check: redis_url,
        apply: redis_store,
        shown: |config| Some(config.store.to_string()),
    },
    Declared {
        setting: Setting::KeyPrefix,
        flag: "key-prefix",
        env: "SLUICE_KEY_PREFIX",
        value_name: "PREFIX",
        help: "The Redis key prefix (store.key_prefix)",
        secret: false,
        key: "store.key_prefix",
        file_keys: &["store.key_prefix"],
        check: prefix,
        apply: key_prefix,
        shown: |config| match &config.store {
            StoreConfig::Memory => None,
            StoreConfig::Redis(redis) => Some(redis.key_prefix.clone()),
            StoreConfig::Regions(regions) => Some(regions.primary.key_prefix.clone()),
        },
    },
    Declared {
        setting: Setting::RlsConfigDir,
        flag: "rls-config-dir",
        env: "SLUICE_RLS_CONFIG_DIR",
        value_name: "DIR",
        help: "The Envoy rate limit rules directory (rls.config_dir)",
        secret: false,
        key: "rls.config_dir",
        file_keys: &["rls"],
        check: dir_named,
        apply: rules_dir,
        shown: |config| {
            Some(match config.rls.as_ref().map(|r| &r.source) {
                None => "none".to_owned(),
                Some(RulesSource::Dir(dir)) => dir.display().to_string(),
                Some(RulesSource::Xds(_)) => "none (rls.xds: from a control plane)".to_owned(),
            })
        },
    },
];

impl Setting {
    /// Its row of [`SETTINGS`] (which lists the settings in the order they are declared).
    pub fn declared(self) -> &'static Declared {
        &SETTINGS[self as usize]
    }
}

/// Where a value given outside the file came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Given {
    /// A command-line flag.
    Flag,
    /// An environment variable.
    Env,
}

/// One setting's value from a flag or a variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    /// Which setting.
    pub setting: Setting,
    /// The value as given.
    pub value: String,
    /// Flag or variable.
    pub given: Given,
}

impl Override {
    /// How errors and `--explain` name it: `flag --http` or `env SLUICE_HTTP`.
    pub fn origin(&self) -> String {
        let declared = self.setting.declared();
        match self.given {
            Given::Flag => format!("flag --{}", declared.flag),
            Given::Env => format!("env {}", declared.env),
        }
    }

    /// The value as it may be shown: a Redis URL without its password.
    pub fn shown(&self) -> String {
        if self.setting.declared().secret {
            sluice_redis::redact(&self.value)
        } else {
            self.value.clone()
        }
    }

    fn error(&self, message: impl fmt::Display) -> ConfigError {
        ConfigError {
            file: self.origin(),
            line: None,
            message: message.to_string(),
        }
    }
}

/// The values given outside the file, at most one per setting (the command line has already
/// chosen a flag over its variable).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides(Vec<Override>);

impl Overrides {
    /// Sets `setting`; a second value for the same setting replaces the first.
    pub fn set(&mut self, setting: Setting, value: impl Into<String>, given: Given) -> &mut Self {
        self.0.retain(|o| o.setting != setting);
        self.0.push(Override {
            setting,
            value: value.into(),
            given,
        });
        self.0.sort_by_key(|o| o.setting);
        self
    }

    /// The value of `setting`, if given.
    pub fn get(&self, setting: Setting) -> Option<&Override> {
        self.0.iter().find(|o| o.setting == setting)
    }

    /// Checks each value on its own (an address parses, a URL is a Redis URL, a prefix has no
    /// brace, a directory is named) before any file is read, so a bad flag or variable is
    /// named with its value whatever the file says; [`Overrides::apply`] runs them first.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.0
            .iter()
            .try_for_each(|o| (o.setting.declared().check)(o))
    }

    /// Checks every value ([`Overrides::check`]), then applies it onto `config`, which came
    /// from `file` (its name in errors). An invalid value, or one that contradicts the file (a
    /// Redis URL for a file naming a Cluster), is an error naming the flag or variable and the
    /// value; nothing is applied then.
    pub fn apply(&self, mut config: Config, file: &str) -> Result<Config, ConfigError> {
        self.check()?;
        for o in &self.0 {
            (o.setting.declared().apply)(o, &mut config, file)?;
        }
        if !self.0.is_empty() {
            check_listen(config.http, config.grpc, config.admin_http).map_err(|e| ConfigError {
                file: format!("{file} with {}", self.origins()),
                line: None,
                message: e.to_string(),
            })?;
        }
        Ok(config)
    }

    fn origins(&self) -> String {
        let names: Vec<String> = self.0.iter().map(Override::origin).collect();
        names.join(", ")
    }
}

fn listen_addr(o: &Override) -> Result<std::net::SocketAddr, ConfigError> {
    ListenAddr::parse(&o.value)
        .map(|a| a.0)
        .map_err(|e| o.error(e))
}

/// `SLUICE_REDIS_URL`: one Redis. It replaces a memory store (with every other `store`
/// setting at its default) or the primary of a file's single shard without replicas (keeping
/// the file's timeout, prefix, credentials…). A file naming a topology (several shards,
/// replicas, a Cluster, Sentinel) is an error naming both: one URL cannot stand for it, and
/// silently counting in one Redis instead of a fleet's would split the counts.
fn redis_store(o: &Override, config: &mut Config, file: &str) -> Result<(), ConfigError> {
    let url = o.value.trim();
    let redis = match &mut config.store {
        StoreConfig::Memory => {
            config.store = store::single_redis(url).map_err(|e| o.error(e))?;
            return Ok(());
        }
        StoreConfig::Redis(redis) => redis,
        StoreConfig::Regions(_) => return Err(topology_error(o, file, "regions (store.regions)")),
    };
    let what = match &redis.topology {
        Topology::Shards { shards } if shards.len() == 1 && shards[0].replicas.is_empty() => {
            redis.topology = Topology::Shards {
                shards: vec![Shard::new(url)],
            };
            return Ok(());
        }
        Topology::Shards { shards } if shards.len() > 1 => {
            format!("{} shards (store.shards)", shards.len())
        }
        Topology::Shards { .. } => "a primary with replicas (store.shards[0].replicas)".to_owned(),
        Topology::Cluster { .. } => "a Redis Cluster (store.cluster)".to_owned(),
        Topology::Sentinel { .. } => "Sentinel (store.sentinel)".to_owned(),
        other => format!("a Redis topology ({other:?})"),
    };
    Err(topology_error(o, file, &what))
}

fn redis_url(o: &Override) -> Result<(), ConfigError> {
    redis::IntoConnectionInfo::into_connection_info(o.value.trim())
        .map(drop)
        .map_err(|e| {
            o.error(format!(
                "`{}` is not a Redis URL ({e}); write redis://host:6379 or rediss://host:6380, \
                 with user:password@ before the host if needed",
                o.shown()
            ))
        })
}

fn prefix(o: &Override) -> Result<(), ConfigError> {
    sluice_redis::keys::validate_prefix(&o.value)
        .map_err(|e| o.error(format!("`{}`: {e}", o.value)))
}

fn dir_named(o: &Override) -> Result<(), ConfigError> {
    if o.value.trim().is_empty() {
        return Err(o.error("the rules directory is empty; name a directory"));
    }
    Ok(())
}

fn topology_error(o: &Override, file: &str, what: &str) -> ConfigError {
    o.error(format!(
        "`{}` names one Redis, but {file} names {what}; one URL does not replace a topology: \
         unset {} or change the file's store",
        o.shown(),
        o.setting.declared().env
    ))
}

/// `SLUICE_KEY_PREFIX`: the Redis store's key prefix; with the memory store (which has no
/// keys) it is an error, so that a forgotten `SLUICE_REDIS_URL` is not silent.
fn key_prefix(o: &Override, config: &mut Config, _: &str) -> Result<(), ConfigError> {
    match &mut config.store {
        StoreConfig::Memory => Err(o.error(format!(
            "`{}`: the store is memory, which has no keys to prefix; give a Redis store \
             (SLUICE_REDIS_URL, or store.backend: redis in the file)",
            o.value
        ))),
        StoreConfig::Redis(redis) => {
            o.value.clone_into(&mut redis.key_prefix);
            Ok(())
        }
        // Every region reads the others' keys under its own names: one prefix for all.
        StoreConfig::Regions(regions) => {
            o.value.clone_into(&mut regions.primary.key_prefix);
            for remote in &mut regions.remotes {
                o.value.clone_into(&mut remote.replica.key_prefix);
            }
            Ok(())
        }
    }
}

/// `SLUICE_RLS_CONFIG_DIR`: the Envoy rules directory. Without an `rls` section in the file,
/// the section's defaults with this directory; with `rls.config_dir`, this directory instead;
/// with `rls.xds`, an error naming both (the rules come from one source). A relative path is
/// relative to the working directory.
fn rules_dir(o: &Override, config: &mut Config, file: &str) -> Result<(), ConfigError> {
    let dir = PathBuf::from(&o.value);
    match &mut config.rls {
        None => config.rls = Some(RlsSettings::from_dir(dir)),
        Some(RlsSettings {
            source: RulesSource::Xds(_),
            ..
        }) => {
            return Err(o.error(format!(
                "`{}` names a rules directory, but {file} takes the Envoy rules from a control \
                 plane (rls.xds); the rules come from one source: unset {} or remove rls.xds",
                o.value,
                o.setting.declared().env
            )));
        }
        Some(settings) => settings.source = RulesSource::Dir(dir),
    }
    Ok(())
}

/// Where the configuration comes from: a file (or none) and the values given outside it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigSource {
    /// The file (`--config`, `SLUICE_CONFIG`); `None`: no file.
    pub file: Option<PathBuf>,
    /// Flags and variables.
    pub overrides: Overrides,
}

impl From<Option<PathBuf>> for ConfigSource {
    fn from(file: Option<PathBuf>) -> Self {
        Self {
            file,
            overrides: Overrides::default(),
        }
    }
}

/// What the configuration is built on when no file is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoFile {
    /// The built-in demo (memory store, the `demo` policy): what `sluice serve` runs alone.
    Demo,
    /// Every default and no policy: a rules directory was given, so the server serves those
    /// Envoy rules (what the reference service does from its environment alone).
    RulesOnly,
}

impl ConfigSource {
    /// What a missing file is replaced by: the demo, unless a rules directory is given.
    pub fn without_file(&self) -> Option<NoFile> {
        match (&self.file, self.overrides.get(Setting::RlsConfigDir)) {
            (Some(_), _) => None,
            (None, Some(_)) => Some(NoFile::RulesOnly),
            (None, None) => Some(NoFile::Demo),
        }
    }

    /// How errors and `config check` name the file.
    pub fn file_name(&self) -> String {
        match (&self.file, self.without_file()) {
            (Some(path), _) => path.display().to_string(),
            (None, Some(NoFile::Demo)) => "the built-in demo configuration".to_owned(),
            (None, _) => "the defaults".to_owned(),
        }
    }

    /// Reads the file (or takes what stands for none) and applies the overrides.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let base = match (&self.file, self.without_file()) {
            (Some(path), _) => Config::load(path)?,
            (None, Some(NoFile::RulesOnly)) => Config::parse("<defaults>", "{}")?,
            (None, _) => Config::demo(),
        };
        self.overrides.apply(base, &self.file_name())
    }

    /// Each effective setting, its value (secrets redacted) and where it came from, for
    /// `sluice config check --explain`. `config` is what [`ConfigSource::load`] gave.
    pub fn explain(&self, config: &Config) -> Vec<Explained> {
        let document: Option<serde_yaml_ng::Value> = self
            .file
            .as_deref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|t| serde_yaml_ng::from_str(&t).ok());
        // Whether the file sets `key` (`listen.http`).
        let in_file = |key: &str| {
            let mut at = document.as_ref();
            for part in key.split('.') {
                at = at.and_then(|v| v.get(part));
            }
            at.is_some()
        };
        let file = match (&self.file, self.without_file()) {
            (Some(path), _) => format!("file {}", path.display()),
            (None, Some(NoFile::Demo)) => "built-in demo".to_owned(),
            (None, _) => "default".to_owned(),
        };
        let mut out = Vec::new();
        for declared in &SETTINGS {
            let Some(value) = (declared.shown)(config) else {
                continue;
            };
            let origin = match self.overrides.get(declared.setting) {
                Some(o) => o.origin(),
                None if declared.file_keys.iter().any(|k| in_file(k)) => file.clone(),
                None => "default".to_owned(),
            };
            out.push(Explained::new(declared.key, value, origin));
        }
        let names: Vec<&str> = config.policies.iter().map(sluice::Policy::name).collect();
        let names = if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        };
        out.push(Explained::new(
            "policies",
            format!("{} ({names})", config.policies.len()),
            if in_file("policies") || self.without_file() == Some(NoFile::Demo) {
                file
            } else {
                "default".to_owned()
            },
        ));
        out
    }
}

/// One line of `sluice config check --explain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explained {
    /// The setting, as its file key (`listen.http`).
    pub key: String,
    /// Its effective value, secrets redacted.
    pub value: String,
    /// Where it came from: `flag --http`, `env SLUICE_HTTP`, `file sluice.yaml`, `default`.
    pub origin: String,
}

impl Explained {
    /// A line.
    pub fn new(
        key: impl Into<String>,
        value: impl Into<String>,
        origin: impl Into<String>,
    ) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
            origin: origin.into(),
        }
    }
}

impl fmt::Display for Explained {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<17} {}  ({})", self.key, self.value, self.origin)
    }
}
