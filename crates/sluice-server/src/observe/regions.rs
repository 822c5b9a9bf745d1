//! The regions store seen from this region (`store.regions`, docs/regions.md): each other
//! region's replica (reachable, its replication lag, the age of the cached view of its usage,
//! whether a fallback is in force), for `GET /v1/stats` and the dashboard. The same figures are
//! Prometheus gauges, written at each scrape by [`super::scrape::regions`].

use serde_json::{Value, json};
use sluice_redis::RegionsStore;

/// `/v1/stats`' `regions`: one entry per other region, in name order (`lag_s`, `view_age_s`
/// absent until read); empty without a regions store.
pub(crate) fn stats(store: Option<&RegionsStore>) -> Value {
    let Some(store) = store else {
        return json!([]);
    };
    let mut regions = store.regions();
    regions.sort_by(|a, b| a.name.cmp(&b.name));
    let entries: Vec<Value> = regions
        .into_iter()
        .map(|r| {
            let mut v = json!({
                "name": r.name,
                "reachable": r.reachable,
                "fallback": r.fallback_active,
            });
            if let Some(lag) = r.lag {
                v["lag_s"] = json!(lag.as_secs_f64());
            }
            if let Some(age) = r.view_age {
                v["view_age_s"] = json!(age.as_secs_f64());
            }
            v
        })
        .collect();
    Value::Array(entries)
}
