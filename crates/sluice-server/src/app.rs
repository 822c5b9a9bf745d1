//! `run(listeners, config, shutdown)`: everything `sluice serve` does, callable from tests with
//! port-0 listeners.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice::{Clock, MemoryStore, StoreError};
use sluice_redis::{RedisConfig, RedisStore, ShardedStore};
use tokio::net::TcpListener;

use crate::config::{Config, ConfigSource, NoFile, RedisLayout, StoreConfig};
use crate::conn;
use crate::http;
use crate::rlqs::RlqsService;
use crate::rls::RlsConfig;
use crate::rls::grpc::RlsService;
use crate::state::{ServerClock, Shared, StoreHandle};

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// A configured address could not be bound.
    #[error("listen.{what}: cannot listen on {addr}: {source}")]
    Listen {
        /// Which listener (`http`, `grpc`, `admin`).
        what: &'static str,
        /// The configured address.
        addr: std::net::SocketAddr,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The Envoy rate limit files (`rls.config_dir`) could not be read.
    #[error(transparent)]
    Rls(#[from] crate::rls::RlsConfigError),
    /// The store could not be connected.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The certificates (`listen.tls`) could not be read.
    #[error("{0}")]
    Tls(String),
    /// A listener failed while serving.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The gRPC server failed.
    #[error(transparent)]
    Grpc(#[from] tonic::transport::Error),
    /// The gRPC reflection service could not be built from its descriptors.
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The trace exporter (`tracing`) could not be built.
    #[error("{0}")]
    Traces(String),
    /// A server task ended without an answer (it panicked or was cancelled).
    #[error("a server task ended abnormally: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// How often the configuration file is checked for changes.
pub const RELOAD_POLL: Duration = Duration::from_millis(500);

/// The sockets the server answers on (bound by the caller, so tests can use port 0).
#[derive(Debug)]
pub struct Listeners {
    /// The HTTP API.
    pub http: TcpListener,
    /// Envoy's rate limit gRPC API and gRPC health; `None` serves no gRPC.
    pub grpc: Option<TcpListener>,
    /// The admin listener (`listen.admin`): when given, the admin routes are served here only.
    pub admin: Option<TcpListener>,
}

impl Listeners {
    /// Binds the configured addresses; an error names the listener and its address.
    pub async fn bind(config: &Config) -> Result<Self, ServeError> {
        let bind = |what: &'static str, addr: std::net::SocketAddr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Listen { what, addr, source })
        };
        Ok(Self {
            http: bind("http", config.http).await?,
            grpc: Some(bind("grpc", config.grpc).await?),
            admin: match config.admin_http {
                Some(addr) => Some(bind("admin", addr).await?),
                None => None,
            },
        })
    }
}

/// Serves `app` on `listener` (over TLS when `tls` is given, under the `listen` bounds of
/// `config`) until `stopped` completes.
fn serve_http(
    listener: TcpListener,
    name: conn::Listener,
    config: &Config,
    tls: Option<&Arc<rustls::ServerConfig>>,
    app: axum::Router,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let incoming = conn::Incoming::new(listener, name, config.connections, tls.cloned());
    conn::serve_http(incoming, name, config.connections, app, stopped)
}

/// The warning of a server with neither an `admin` section nor an admin listener: every admin
/// route, from the route table, answers anyone.
pub fn open_admin_warning() -> String {
    let routes: Vec<String> = http::ADMIN_ROUTES
        .iter()
        .map(|(method, path)| format!("{method} {path}"))
        .collect();
    format!(
        "no admin section: the admin routes {} answer anyone who reaches the HTTP port \
         (docs/security.md)",
        routes.join(", ")
    )
}

/// Reads the Envoy rate limit service files, if configured.
pub fn load_rls(config: &Config) -> Result<Option<Arc<RlsConfig>>, crate::rls::RlsConfigError> {
    let Some(settings) = &config.rls else {
        return Ok(None);
    };
    let options = crate::rls::LoadOptions {
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

/// Connects the configured store.
pub async fn connect_store(config: &Config) -> Result<StoreHandle, StoreError> {
    match &config.store {
        StoreConfig::Memory => Ok(StoreHandle::Memory(Arc::new(MemoryStore::new()))),
        StoreConfig::Redis {
            layout,
            read_from,
            timeout,
            clock,
            key_prefix,
            tls,
            credentials,
            sentinel_credentials,
            wait_for_replicas,
            coalesce,
            state_layout,
        } => {
            let settings = |rc: RedisConfig| {
                let rc = rc
                    .read_from(*read_from)
                    .coalesce(*coalesce)
                    .layout(*state_layout)
                    .timeout(*timeout)
                    .clock(*clock)
                    .key_prefix(key_prefix.clone());
                let rc = match tls {
                    Some(files) => rc.tls(files.clone()),
                    None => rc,
                };
                let rc = match credentials {
                    Some(c) => rc.credentials(c.clone()),
                    None => rc,
                };
                match wait_for_replicas {
                    Some(w) => rc.wait_for_replicas(*w),
                    None => rc,
                }
            };
            match layout {
                RedisLayout::Shards(shards) => {
                    let mut stores = Vec::with_capacity(shards.len());
                    for shard in shards {
                        let rc = RedisConfig::new(shard.primary.clone())
                            .replicas(shard.replicas.clone());
                        stores.push(RedisStore::connect(settings(rc)).await?);
                    }
                    Ok(StoreHandle::Redis(ShardedStore::new(stores)?))
                }
                RedisLayout::Sentinel(s) => {
                    let rc = settings(RedisConfig::sentinel(s.master.clone(), s.nodes.clone()));
                    let rc = match sentinel_credentials {
                        Some(c) => rc.sentinel_credentials(c.clone()),
                        None => rc,
                    };
                    let store = RedisStore::connect(rc).await?;
                    Ok(StoreHandle::Redis(ShardedStore::new(vec![store])?))
                }
                RedisLayout::Cluster(nodes) => {
                    let rc = RedisConfig::cluster(nodes.clone());
                    Ok(StoreHandle::Cluster(
                        RedisStore::connect(settings(rc)).await?,
                    ))
                }
                RedisLayout::Regions(regions) => {
                    let rc = regions.redis_config(settings, sentinel_credentials.as_ref());
                    Ok(StoreHandle::Regions(
                        sluice_redis::RegionsStore::connect(rc).await?,
                    ))
                }
            }
        }
    }
}

/// Runs the servers until `shutdown` completes, then stops accepting and lets in-flight
/// requests finish. `source`'s file (`Option<PathBuf>` converts), when given, is watched: a
/// change (or SIGHUP) reloads its policies, with `source`'s flags and variables applied again;
/// an invalid new file is logged and the last good configuration stays. Without a file, a
/// rules directory given as a flag or variable is watched the same way.
pub async fn run(
    listeners: Listeners,
    config: Config,
    source: impl Into<ConfigSource>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    run_with_clock(listeners, config, source, shutdown, ServerClock::system()).await
}

/// [`run`] deciding with `clock` instead of the system clock: tests pass a manual clock to
/// put windows where they want them.
pub async fn run_with_clock(
    listeners: Listeners,
    config: Config,
    source: impl Into<ConfigSource>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    clock: ServerClock,
) -> Result<(), ServeError> {
    let source = source.into();
    // Install the recorder before the first request so that no early metric is lost.
    let _ = crate::observe::metrics::handle();
    let rls = load_rls(&config)?;
    let store = connect_store(&config).await?;
    tracing::info!(store = %store.describe(), "store connected");
    let traces = start_traces(&config)?;
    let shared = Arc::new(Shared::traced(
        &config,
        store,
        rls,
        clock.clone(),
        traces.clone(),
    ));
    // One shutdown signal for both servers.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let mut background = tokio::task::JoinSet::new();
    background.spawn(housekeeping(shared.clone(), clock.clone()));
    if config.admin.is_none() && listeners.admin.is_none() {
        tracing::warn!("{}", open_admin_warning());
    }
    if source.file.is_some() || source.without_file() == Some(NoFile::RulesOnly) {
        background.spawn(watch_config(source, shared.clone()));
    }
    if let Some(xds) = config.rls.as_ref().and_then(|r| r.xds()) {
        background.spawn(crate::rls_xds::run(xds.clone(), shared.clone()));
    }
    // The certificates are read again at start: a file changed since the check is caught here.
    let (http_tls, grpc_tls) = match &config.tls {
        Some(tls) => (
            Some(tls.server_config(&[b"http/1.1"]).map_err(ServeError::Tls)?),
            Some(tls.server_config(&[b"h2"]).map_err(ServeError::Tls)?),
        ),
        None => (None, None),
    };
    let grpc = match listeners.grpc {
        Some(listener) => Some(
            serve_grpc(
                listener,
                &shared,
                &config,
                grpc_tls,
                stopped(stop_rx.clone()),
                stop_rx.clone(),
            )
            .await?,
        ),
        None => None,
    };
    let admin = match listeners.admin {
        Some(listener) => {
            tracing::info!(admin = %listener.local_addr()?, tls = http_tls.is_some(), "sluice serving the admin routes");
            let app = http::router_for(shared.clone(), http::Surface::All);
            Some(serve_http(
                listener,
                conn::Listener::Admin,
                &config,
                http_tls.as_ref(),
                app,
                stopped(stop_rx.clone()),
            ))
        }
        None => None,
    };
    let surface = if admin.is_some() {
        http::Surface::Public
    } else {
        http::Surface::All
    };
    tracing::info!(http = %listeners.http.local_addr()?, tls = http_tls.is_some(), "sluice serving");
    let app = http::router_for(shared.clone(), surface);
    let served = serve_http(
        listeners.http,
        conn::Listener::Http,
        &config,
        http_tls.as_ref(),
        app,
        stopped(stop_rx),
    )
    .await;
    if let Some(grpc) = grpc {
        grpc.await??;
    }
    let admin_served = match admin {
        Some(admin) => admin.await,
        None => Ok(Ok(())),
    };
    background.shutdown().await;
    if let Some(reserving) = shared.reserving() {
        // Leased units nobody used go back to the store, so other processes can use them.
        let policies: Vec<_> = shared.snapshot().limiter.policies().cloned().collect();
        reserving.release(&policies, clock.now_ms()).await;
    }
    // The spans of the last decisions reach the collector before the process ends.
    traces.shutdown().await;
    served??;
    admin_served??;
    tracing::info!("sluice stopped");
    Ok(())
}

/// The exporter of decision traces (`tracing`), or none.
fn start_traces(config: &Config) -> Result<crate::observe::traces::Traces, ServeError> {
    match &config.tracing {
        Some(settings) => {
            tracing::info!(endpoint = %settings.endpoint, sample_ratio = settings.sample_ratio, "exporting traces of decisions");
            crate::observe::traces::Traces::start(settings)
                .map_err(|e| ServeError::Traces(e.to_string()))
        }
        None => Ok(crate::observe::traces::Traces::off()),
    }
}

/// Once a second: the history of `/v1/stats` sampled, idle keys dropped even when no traffic
/// reaches their shard (the memory store's and the insurance store's, `on_store_error: local`),
/// reservations swept, and what `on_store_error: local` admitted charged back to the store.
async fn housekeeping(shared: Arc<Shared>, clock: ServerClock) {
    let memory = match shared.store() {
        StoreHandle::Memory(memory) => Some(memory.clone()),
        _ => None,
    };
    let insurance = shared.insurance().clone();
    let reserving = shared.reserving().cloned();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        shared.sample_history();
        let now = clock.now_ms();
        if let Some(memory) = &memory {
            memory.sweep(now);
        }
        insurance.sweep(now);
        if let Some(reserving) = &reserving {
            reserving.sweep(now);
        }
        // What `on_store_error: local` admitted while the store was down goes to the
        // store once it answers (keys no request decided since).
        if let Err(e) = shared.snapshot().limiter.charge_back().await {
            tracing::debug!(error = %e, "charge-back of local admissions: the store cannot take it yet");
        }
    }
}

/// Serves the gRPC services (health, Envoy's RLS and RLQS, reflection) on `listener` until
/// `stop`.
async fn serve_grpc(
    listener: tokio::net::TcpListener,
    shared: &Arc<Shared>,
    config: &Config,
    tls: Option<Arc<rustls::ServerConfig>>,
    stop: impl Future<Output = ()> + Send + 'static,
    stop_rx: tokio::sync::watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>, ServeError> {
    tracing::info!(grpc = %listener.local_addr()?, tls = tls.is_some(), "sluice serving Envoy's rate limit API");
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer<RlsService>>()
        .await;
    // The name the reference service registers its health under, so that probes
    // written for it keep working.
    health
        .set_service_status("ratelimit", tonic_health::ServingStatus::Serving)
        .await;
    health
        .set_serving::<envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer<RlqsService>>()
        .await;
    let server = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(RlsService::new(shared.clone()).into_server())
        .add_service(RlqsService::new(shared.clone(), stop_rx).into_server())
        .add_service(crate::reflection::v1()?)
        .add_service(crate::reflection::v1alpha()?);
    // The connections come through the same accept loop as HTTP's: TLS, the
    // connection bound and the read deadlines of an HTTP/2 connection (conn.rs).
    let incoming =
        conn::Incoming::new(listener, conn::Listener::Grpc, config.connections, tls).into_stream();
    Ok(tokio::spawn(
        server.serve_with_incoming_shutdown(incoming, stop),
    ))
}

/// What the configuration is made of on disk: the file's bytes, and the name and bytes of every
/// file under its `rls.config_dir`, so that editing an Envoy rate limit file reloads too (as
/// the reference service does). Contents, not modification times: two edits within one tick of
/// a coarse file system clock must not look the same. The files are small.
fn fingerprint(path: Option<&std::path::Path>, rls_dir: Option<&std::path::Path>) -> Vec<u8> {
    let mut out = path.and_then(|p| std::fs::read(p).ok()).unwrap_or_default();
    let mut stack: Vec<PathBuf> = rls_dir
        .map(std::path::Path::to_path_buf)
        .into_iter()
        .collect();
    let mut files = Vec::new();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            // What the loader reads: not kubelet's `..data` and `..<timestamp>` (their files
            // are read through the mount's top-level links), nor a linked directory.
            if crate::rls::is_kubelet_entry(&entry.file_name()) {
                continue;
            }
            let Ok(file_type) = entry.file_type() else {
                continue;
            };
            if file_type.is_dir() {
                stack.push(entry.path());
            } else if file_type.is_symlink() && entry.path().is_dir() {
                continue;
            } else {
                let mut f = entry.path().display().to_string().into_bytes();
                f.push(0);
                f.extend(std::fs::read(entry.path()).unwrap_or_default());
                files.push(f);
            }
        }
    }
    files.sort();
    for f in files {
        out.extend_from_slice(&f);
    }
    out
}

/// Why a reload that would leave nothing to limit is refused: the running configuration has
/// policies (or Envoy rules) and the new one has none. An editor's truncating write, or a file
/// caught half-written, reads as a configuration of nothing; applying it would answer every
/// check `404 unknown_policy`. Running without any is done by a restart.
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

/// The Envoy rules a reload of the configuration file applies: read from the rules directory,
/// or, when they come from xDS, the ones in force (the control plane replaces them, not the
/// file). Switching between a directory and xDS takes a restart.
fn reload_rls(shared: &Shared, next: &Config) -> anyhow::Result<Option<Arc<RlsConfig>>> {
    let next_xds = next.rls.as_ref().is_some_and(|r| r.xds().is_some());
    match (from_xds(shared), next_xds) {
        (true, true) => Ok(shared.snapshot().rls.clone()),
        (false, false) => Ok(load_rls(next)?),
        _ => anyhow::bail!(
            "rls: the source of the Envoy rules (config_dir or xds) changed; it is chosen at \
             start, restart the server to switch"
        ),
    }
}

/// Reloads the configuration on SIGHUP and when the file, or a file of its Envoy rate limit
/// directory, changes; the flags and variables of `source` are applied again each time.
async fn watch_config(source: ConfigSource, shared: Arc<Shared>) {
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
        match source.load().map_err(anyhow::Error::from).and_then(|c| {
            let rls = reload_rls(&shared, &c)?;
            refuse_emptying(&shared.snapshot(), &c, rls.as_deref())
                .map_or(Ok((c, rls)), |reason| Err(anyhow::anyhow!(reason)))
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
                crate::observe::metrics::reload(true);
                tracing::info!(file = %file, policies = config.policies.len(), "configuration reloaded");
            }
            Err(e) => {
                tracing::error!(file = %file, error = %e, "configuration reload refused; keeping the last good one");
                shared.reload_failed(crate::state::ReloadSource::File, e.to_string());
                crate::observe::metrics::reload(false);
            }
        }
    }
}
