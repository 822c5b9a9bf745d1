//! The Lua code: a Redis Function library, or one script per operation for EVALSHA; how it
//! is loaded onto a node and which command runs an operation.
//!
//! Both forms come from `scripts/sluice.lua`. The library's name carries a hash of the code
//! (`sluice_1a2b3c4d`), so two Sluice versions sharing one Redis during a deploy load
//! two libraries side by side instead of replacing each other's. A call's arguments and its
//! reply are encoded and decoded by the [codec](crate::codec).

use std::fmt::Write;
use std::time::Duration;

use sluice::Op;

use crate::error::{Failure, query};

/// The shared Lua source.
const SOURCE: &str = include_str!("../scripts/sluice.lua");

/// How the code is loaded and called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ScriptMode {
    /// A Redis Function library: `FUNCTION LOAD` once on the primary (replicas receive it by
    /// replication, and it survives `SCRIPT FLUSH`), `FCALL` for decisions, `FCALL_RO` for peeks
    /// on replicas. The default: see docs/benchmarks.md for the measurement behind the choice.
    #[default]
    Function,
    /// `SCRIPT LOAD` on every node, `EVALSHA` (peeks: `EVALSHA_RO`), reloaded after `NOSCRIPT`.
    EvalSha,
}

/// The code's entry points: one function (or script) per kind of [`Op`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    Check,
    Peek,
    Refund,
    /// Take a batch: as much as fits, between a minimum and a maximum.
    Acquire,
    /// Take a lease of a concurrency limit.
    Hold,
    /// Free a lease of a concurrency limit.
    Release,
    /// A check of a rate policy on the lean layout (`codec::is_rate`).
    Rate,
    /// A peek of a rate policy on the lean layout: read only, so a replica may run it.
    RatePeek,
    /// Checks and peeks of rate policies, decided in turn in one call.
    Batch,
}

impl Entry {
    const ALL: [Entry; 9] = [
        Entry::Check,
        Entry::Peek,
        Entry::Refund,
        Entry::Acquire,
        Entry::Hold,
        Entry::Release,
        Entry::Rate,
        Entry::RatePeek,
        Entry::Batch,
    ];

    /// The entry point that runs `op`; `None` for an operation the script does not know.
    pub(crate) fn of(op: Op) -> Option<Entry> {
        match op {
            Op::Check { .. } => Some(Entry::Check),
            Op::Peek { .. } => Some(Entry::Peek),
            Op::Refund { .. } => Some(Entry::Refund),
            Op::Acquire { .. } => Some(Entry::Acquire),
            Op::Hold { .. } => Some(Entry::Hold),
            Op::Release { .. } => Some(Entry::Release),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Entry::Check => "check",
            Entry::Peek => "peek",
            Entry::Refund => "refund",
            Entry::Acquire => "acquire",
            Entry::Hold => "hold",
            Entry::Release => "release",
            Entry::Rate => "rate",
            Entry::RatePeek => "rate_ro",
            Entry::Batch => "batch",
        }
    }

    fn read_only(self) -> bool {
        matches!(self, Entry::Peek | Entry::RatePeek)
    }
}

/// The loaded forms of the code, and how they are loaded and called.
#[derive(Debug, Clone)]
pub(crate) struct Code {
    mode: ScriptMode,
    /// `sluice_<hash>`.
    pub(crate) library: String,
    /// The `FUNCTION LOAD` body.
    library_source: String,
    /// Per entry point: the function name.
    functions: [String; 9],
    /// Per entry point: the EVAL script and its SHA1.
    scripts: [(String, String); 9],
}

impl Code {
    pub(crate) fn new(mode: ScriptMode) -> Self {
        let library = format!("sluice_{:08x}", fnv1a32(SOURCE.as_bytes()));
        let body = SOURCE.replace("__LIB__", &library);
        let functions = Entry::ALL.map(|e| format!("{library}_{}", e.name()));
        let mut library_source = format!("#!lua name={library}\n{body}\n");
        for (entry, function) in Entry::ALL.iter().zip(&functions) {
            let flags = if entry.read_only() {
                ", flags = {'no-writes', 'allow-stale'}"
            } else {
                ""
            };
            let _ = writeln!(
                library_source,
                "redis.register_function{{function_name = '{function}', callback = \
                 function(keys, args) return run('{name}', keys, args) end{flags}}}",
                name = entry.name()
            );
        }
        let scripts = Entry::ALL.map(|e| {
            let shebang = if e.read_only() {
                "#!lua flags=no-writes,allow-stale\n"
            } else {
                "#!lua\n"
            };
            let text = format!("{shebang}{body}\nreturn run('{}', KEYS, ARGV)\n", e.name());
            let sha = redis::Script::new(&text).get_hash().to_owned();
            (text, sha)
        });
        Self {
            mode,
            library,
            library_source,
            functions,
            scripts,
        }
    }

    /// How the code is loaded and called.
    pub(crate) fn mode(&self) -> ScriptMode {
        self.mode
    }

    /// The start of the command that runs `entry`, before its keys and arguments:
    /// `FCALL <function>` or `EVALSHA <sha>`, their `_RO` forms for a replica.
    pub(crate) fn invocation(&self, entry: Entry, on_replica: bool) -> redis::Cmd {
        let i = entry as usize;
        match self.mode {
            ScriptMode::Function => {
                let mut c = redis::cmd(if on_replica { "FCALL_RO" } else { "FCALL" });
                c.arg(&self.functions[i]);
                c
            }
            ScriptMode::EvalSha => {
                let mut c = redis::cmd(if on_replica { "EVALSHA_RO" } else { "EVALSHA" });
                c.arg(&self.scripts[i].1);
                c
            }
        }
    }

    /// The commands that load the code: `FUNCTION LOAD REPLACE <library>`, or a
    /// `SCRIPT LOAD` per script.
    fn load_commands(&self) -> Vec<redis::Cmd> {
        match self.mode {
            ScriptMode::Function => {
                let mut load = redis::cmd("FUNCTION");
                load.arg("LOAD").arg("REPLACE").arg(&self.library_source);
                vec![load]
            }
            ScriptMode::EvalSha => self
                .scripts
                .iter()
                .map(|(text, _)| {
                    let mut load = redis::cmd("SCRIPT");
                    load.arg("LOAD").arg(text);
                    load
                })
                .collect(),
        }
    }

    /// Loads the code through `conn`: one node's connection (the function library on a
    /// primary replicates; scripts go to every node), or a Cluster's, whose client sends
    /// `FUNCTION LOAD` to every primary and `SCRIPT LOAD` to every node. Loading compiles the
    /// code, so it may take longer than a decision: at least 2 s whatever `timeout` says.
    pub(crate) async fn load<C: redis::aio::ConnectionLike>(
        &self,
        conn: &mut C,
        timeout: Duration,
    ) -> Result<(), Failure> {
        let timeout = timeout.max(Duration::from_secs(2));
        for cmd in self.load_commands() {
            query(conn, &cmd, timeout).await?;
        }
        Ok(())
    }
}

fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}
