//! [`Error`]: why a load could not run, or a client of the server could not be built.

/// Why `sluice bench` could not run, or a client of the server ([`crate::ClientArgs`]) could not
/// be built. A failed request is not an error: the report counts it by kind.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An option is wrong; the message names it and says why.
    #[error("{0}")]
    Option(String),
    /// A file an option names cannot be read.
    #[error("{what}: cannot read it")]
    Read {
        /// The option and its file.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// The HTTP client cannot be built.
    #[error("{what}")]
    Http {
        /// What was being built.
        what: String,
        /// Why.
        source: reqwest::Error,
    },
    /// The gRPC channel cannot be built or connected.
    #[error("{what}")]
    Grpc {
        /// What was being done.
        what: String,
        /// Why.
        source: tonic::transport::Error,
    },
    /// The in-process limiter's policy is not valid (`--max`, `--per`, `--algorithm`).
    #[error(transparent)]
    Policy(#[from] sluice::LimitError),
    /// The in-process limiter's Redis store cannot be reached.
    #[error(transparent)]
    Store(#[from] sluice::StoreError),
    /// `--redis` cannot be asked for its command counts.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The latency histogram refused a value.
    #[error("latency histogram: {0}")]
    Histogram(String),
    /// A worker of the load panicked or was cancelled.
    #[error("a load worker failed: {0}")]
    Worker(#[from] tokio::task::JoinError),
}

impl Error {
    pub(crate) fn read(what: String, source: std::io::Error) -> Self {
        Error::Read { what, source }
    }

    pub(crate) fn histogram(e: impl std::fmt::Display) -> Self {
        Error::Histogram(e.to_string())
    }
}
