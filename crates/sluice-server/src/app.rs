//! `run(listeners, config, shutdown)`: everything `sluice serve` does, callable from tests with
//! port-0 listeners.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sluice::{Clock, MemoryStore, StoreError};
use sluice_redis::{RedisStore, ShardedStore, Topology};
use tokio::net::TcpListener;

use crate::config::{Config, ConfigSource, NoFile, StoreConfig};
use crate::conn;
use crate::http;
use crate::rlqs::RlqsService;
use crate::rls::grpc::RlsService;
use crate::state::{ServerClock, Shared, StoreHandle};

pub use crate::observe::traces::TraceError;
use crate::reload::watch_config;
pub use crate::reload::{RELOAD_POLL, load_rls};

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
    Rls(#[from] sluice_envoy_rules::RlsConfigError),
    /// The store could not be connected.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The certificates (`listen.tls`) could not be read.
    #[error(transparent)]
    Tls(sluice_spec::FieldError),
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
    #[error(transparent)]
    Traces(#[from] TraceError),
    /// A server task ended without an answer (it panicked or was cancelled).
    #[error("a server task ended abnormally: {0}")]
    Task(#[from] tokio::task::JoinError),
}

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
    (config, shared): (&Config, &Shared),
    tls: Option<&Arc<rustls::ServerConfig>>,
    app: axum::Router,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let series: Arc<dyn conn::ListenerEvents> =
        Arc::new(shared.observe().metrics.listener(name.as_str()));
    let limits = config.connections;
    let incoming = conn::Incoming::new(listener, name, limits, tls.cloned(), series.clone());
    conn::serve_http(incoming, series, limits, app, stopped)
}

/// The warning of a server without an `admin` section whose admin routes others can reach:
/// on the HTTP port (no admin listener, `None`), or on an admin listener bound to an address
/// other than loopback. Every admin route, from the route table, answers anyone there.
pub fn open_admin_warning(admin_listener: Option<std::net::SocketAddr>) -> String {
    let routes: Vec<String> = http::admin_routes()
        .map(|(method, path)| format!("{method} {path}"))
        .collect();
    let reached = match admin_listener {
        None => "the HTTP port".to_owned(),
        Some(addr) => format!("the admin listener {addr}"),
    };
    format!(
        "no admin section: the admin routes {} answer anyone who reaches {reached} \
         (docs/security.md)",
        routes.join(", ")
    )
}

/// Connects the configured store: a Cluster as one store, any other Redis topology as
/// client-side shards (Sentinel: one shard), each shard behind its circuit breaker.
pub async fn connect_store(config: &Config) -> Result<StoreHandle, StoreError> {
    let redis = match &config.store {
        StoreConfig::Memory => return Ok(StoreHandle::Memory(Arc::new(MemoryStore::new()))),
        StoreConfig::Redis(redis) => redis,
        StoreConfig::Regions(regions) => {
            return Ok(StoreHandle::Regions(
                sluice_redis::RegionsStore::connect(regions.clone()).await?,
            ));
        }
    };
    if let Topology::Cluster { .. } = redis.topology {
        return Ok(StoreHandle::Cluster(
            RedisStore::connect(redis.clone()).await?,
        ));
    }
    let mut stores = Vec::new();
    for shard in redis.per_shard() {
        stores.push(RedisStore::connect(shard).await?);
    }
    Ok(StoreHandle::Redis(ShardedStore::new(stores)?))
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
    let (shared, traces) = start_state(&config, &clock).await?;
    let stop_rx = stop_signal(shutdown);
    let admin_addr = listeners
        .admin
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()?;
    let background = spawn_background(&config, source, &shared, &clock, admin_addr);
    // The certificates are read again at start: a file changed since the check is caught here.
    let (http_tls, grpc_tls) = match &config.tls {
        Some(tls) => (
            Some(tls.rustls_config(&[b"http/1.1"]).map_err(ServeError::Tls)?),
            Some(tls.rustls_config(&[b"h2"]).map_err(ServeError::Tls)?),
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
        Some(listener) => Some(serve_admin(
            listener,
            &shared,
            &config,
            http_tls.as_ref(),
            stopped(stop_rx.clone()),
        )?),
        None => None,
    };
    let routes = if admin.is_some() {
        http::Routes::Public
    } else {
        http::Routes::All
    };
    tracing::info!(http = %listeners.http.local_addr()?, tls = http_tls.is_some(), "sluice serving");
    let app = http::router_for(shared.clone(), routes);
    let served = serve_http(
        listeners.http,
        conn::Listener::Http,
        (&config, &shared),
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
    stop_background(background, &shared, &clock, traces).await;
    served??;
    admin_served??;
    tracing::info!("sluice stopped");
    Ok(())
}

/// The state the servers share, over the connected store, with the Envoy rules read and the
/// trace exporter started.
async fn start_state(
    config: &Config,
    clock: &ServerClock,
) -> Result<(Arc<Shared>, crate::observe::traces::Traces), ServeError> {
    let rls = load_rls(config)?;
    let store = connect_store(config).await?;
    tracing::info!(store = %config.store, "store connected");
    let traces = start_traces(config)?;
    let shared = Arc::new(Shared::traced(
        config,
        store,
        rls,
        clock.clone(),
        traces.clone(),
    ));
    Ok((shared, traces))
}

/// One shutdown signal for every server: `true` once `shutdown` completes.
fn stop_signal(
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> tokio::sync::watch::Receiver<bool> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    stop_rx
}

/// Completes when the shutdown signal of `rx` is given.
async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// The tasks beside the servers: housekeeping, the reload watcher (with a file, or rules
/// given without one) and the xDS client (`rls.xds`); and the warning of admin routes open to
/// other machines.
fn spawn_background(
    config: &Config,
    source: ConfigSource,
    shared: &Arc<Shared>,
    clock: &ServerClock,
    admin_listener: Option<std::net::SocketAddr>,
) -> tokio::task::JoinSet<()> {
    let mut background = tokio::task::JoinSet::new();
    background.spawn(housekeeping(shared.clone(), clock.clone()));
    // Without tokens, only an admin listener on loopback keeps the admin routes to this
    // machine.
    if config.admin.is_none() && !admin_listener.is_some_and(|a| a.ip().is_loopback()) {
        tracing::warn!("{}", open_admin_warning(admin_listener));
    }
    if source.file.is_some() || source.without_file() == Some(NoFile::RulesOnly) {
        background.spawn(watch_config(source, shared.clone()));
    }
    if let Some(xds) = config.rls.as_ref().and_then(|r| r.xds()) {
        background.spawn(crate::rls_xds::run(xds.clone(), shared.clone()));
    }
    background
}

/// Serves every route on the admin listener (`listen.admin`).
fn serve_admin(
    listener: TcpListener,
    shared: &Arc<Shared>,
    config: &Config,
    tls: Option<&Arc<rustls::ServerConfig>>,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<std::io::Result<()>>, ServeError> {
    tracing::info!(admin = %listener.local_addr()?, tls = tls.is_some(), "sluice serving the admin routes");
    let app = http::router_for(shared.clone(), http::Routes::All);
    Ok(serve_http(
        listener,
        conn::Listener::Admin,
        (config, shared),
        tls,
        app,
        stopped,
    ))
}

/// Once the servers stopped: the background tasks end, leased units nobody used go back to
/// the store (so other processes can use them), and the spans of the last decisions reach the
/// collector before the process ends.
async fn stop_background(
    mut background: tokio::task::JoinSet<()>,
    shared: &Shared,
    clock: &ServerClock,
    traces: crate::observe::traces::Traces,
) {
    background.shutdown().await;
    if let Some(reserving) = shared.reserving() {
        let policies: Vec<_> = shared.snapshot().limiter.policies().cloned().collect();
        reserving.release(&policies, clock.now_ms()).await;
    }
    traces.shutdown().await;
}

/// The exporter of decision traces (`tracing`), or none.
fn start_traces(config: &Config) -> Result<crate::observe::traces::Traces, ServeError> {
    let Some(settings) = &config.tracing else {
        return Ok(crate::observe::traces::Traces::default());
    };
    tracing::info!(endpoint = %settings.endpoint, sample_ratio = settings.sample_ratio, "exporting traces of decisions");
    Ok(crate::observe::traces::Traces::start(settings)?)
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
    let grpc = conn::Listener::Grpc;
    let series = Arc::new(shared.observe().metrics.listener(grpc.as_str()));
    let incoming =
        conn::Incoming::new(listener, grpc, config.connections, tls, series).into_stream();
    Ok(tokio::spawn(
        server.serve_with_incoming_shutdown(incoming, stop),
    ))
}
