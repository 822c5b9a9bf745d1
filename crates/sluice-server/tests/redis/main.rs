//! The server over real Redis topologies and their failures: one test binary for the area.

#[path = "../support/mod.rs"]
mod support;

mod regions;
mod store_errors;
mod topologies;
