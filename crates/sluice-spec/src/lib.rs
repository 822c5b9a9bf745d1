//! The text forms every Sluice surface reads alike: a policy entry ([`policy_entry`]), a
//! duration as the configuration writes it ([`units`]), JSON and YAML read so that a key
//! given twice is refused ([`unique`]), and the one error naming the field at fault
//! ([`FieldError`]). The server's configuration, its HTTP body, the RLQS rules, the xDS
//! settings and the simulator all read with these, so they mean and refuse the same things.

pub mod policy_entry;
pub mod unique;
pub mod units;

pub use policy_entry::FieldError;

use std::path::{Path, PathBuf};

/// A file the configuration names, as it means it: a relative path is relative to the
/// directory of the configuration file (`dir`), not to the working directory; a configuration
/// given as text (`dir` is `None`) names it relative to the working directory.
pub fn relative_to(dir: Option<&Path>, path: PathBuf) -> PathBuf {
    match dir {
        Some(dir) if path.is_relative() => dir.join(path),
        _ => path,
    }
}
