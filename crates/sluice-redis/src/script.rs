//! The Lua code, loaded once: a Redis Function library, or one script per operation for
//! EVALSHA.
//!
//! Both forms come from `scripts/sluice.lua`. The library's name carries a hash of the code
//! (`sluice_1a2b3c4d`), so two Sluice versions sharing one Redis during a rolling upgrade load
//! two libraries side by side instead of replacing each other's.

use std::fmt::Write;

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

/// One of the operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Check,
    Peek,
    Refund,
    /// Take a batch: as much as fits, between a minimum and a maximum.
    Acquire,
}

impl Op {
    pub(crate) const ALL: [Op; 4] = [Op::Check, Op::Peek, Op::Refund, Op::Acquire];

    fn name(self) -> &'static str {
        match self {
            Op::Check => "check",
            Op::Peek => "peek",
            Op::Refund => "refund",
            Op::Acquire => "acquire",
        }
    }

    pub(crate) fn read_only(self) -> bool {
        self == Op::Peek
    }
}

/// The loaded forms of the code.
#[derive(Debug, Clone)]
pub(crate) struct Code {
    /// `sluice_<hash>`.
    pub(crate) library: String,
    /// The `FUNCTION LOAD` body.
    pub(crate) library_source: String,
    /// Per operation: the EVAL script and its SHA1.
    scripts: [(String, String); 4],
}

impl Code {
    pub(crate) fn new() -> Self {
        let library = format!("sluice_{:08x}", fnv1a32(SOURCE.as_bytes()));
        let body = SOURCE.replace("__LIB__", &library);
        let mut library_source = format!("#!lua name={library}\n{body}\n");
        for op in Op::ALL {
            let flags = if op.read_only() {
                ", flags = {'no-writes', 'allow-stale'}"
            } else {
                ""
            };
            let _ = writeln!(
                library_source,
                "redis.register_function{{function_name = '{library}_{name}', callback = \
                 function(keys, args) return run('{name}', keys, args) end{flags}}}",
                name = op.name()
            );
        }
        let scripts = Op::ALL.map(|op| {
            let shebang = if op.read_only() {
                "#!lua flags=no-writes,allow-stale\n"
            } else {
                "#!lua\n"
            };
            let text = format!("{shebang}{body}\nreturn run('{}', KEYS, ARGV)\n", op.name());
            let sha = redis::Script::new(&text).get_hash().to_owned();
            (text, sha)
        });
        Self {
            library,
            library_source,
            scripts,
        }
    }

    /// The function name of `op`.
    pub(crate) fn function(&self, op: Op) -> String {
        format!("{}_{}", self.library, op.name())
    }

    /// The EVAL script of `op` and its SHA1.
    pub(crate) fn script(&self, op: Op) -> (&str, &str) {
        let (text, sha) = &self.scripts[op as usize];
        (text, sha)
    }
}

fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}
