//! Script calls counted by Redis: `FCALL`s in INFO commandstats, for "Redis calls per
//! decision" (the reservation benches include this file with `#[path]`).

use sluice_testkit::RedisServer;

/// How many `FCALL`s the server has run since its statistics were last reset.
pub(crate) fn fcalls(server: &RedisServer) -> u64 {
    let text = server.info("commandstats").unwrap();
    text.lines()
        .filter(|l| l.starts_with("cmdstat_fcall:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}
