//! Envoy's rate limit filter (RLS), real Envoys against real `sluice serve`: the example of
//! examples/envoy, the bootstrap of docs/deploying.md, the reference's rule kinds, each
//! `rls.on_store_error` under both `failure_mode_deny`, the response headers, exactness over
//! two servers on one Redis, and a restart under load.

use crate::support::{self, Answer, Client, Envoy, Sluice};

fn statuses(client: &mut Client, path: &str, n: usize) -> Vec<u16> {
    (0..n).map(|_| client.get(path, &[]).status).collect()
}

#[test]
fn the_example_admits_its_limit_then_answers_429_with_headers_and_stats_that_agree() {
    let Some(bin) = support::envoy_bin() else {
        return;
    };
    let dir = support::repo().join("examples/envoy");
    let sluice = Sluice::start_in(&dir, &support::read("examples/envoy/sluice.yaml"));
    let (envoy, port) = support::example_rls_envoy(&bin, sluice.grpc, false);
    let mut c = Client::new(port);
    // 3 an hour on /login (each also counts toward the address's 10 a minute); the fourth is
    // refused by the nested rule and, refused, counts toward neither.
    assert_eq!(statuses(&mut c, "/login", 4), [200, 200, 200, 429]);
    // The address has 7 of its 10 left.
    assert_eq!(statuses(&mut c, "/", 7), [200; 7]);
    let over: Answer = c.get("/", &[]);
    assert_eq!(over.status, 429);
    assert_eq!(
        over.headers.get("x-envoy-ratelimited").map(String::as_str),
        Some("true")
    );
    // Envoy's own DRAFT_VERSION_03 headers, computed from Sluice's statuses.
    assert_eq!(
        over.headers.get("x-ratelimit-limit").map(String::as_str),
        Some("10, 10;w=60")
    );
    assert_eq!(
        over.headers
            .get("x-ratelimit-remaining")
            .map(String::as_str),
        Some("0")
    );
    // Sluice's IETF headers (rls.response_headers: ietf, the default) reach the client.
    assert_eq!(
        over.headers.get("ratelimit-policy").map(String::as_str),
        Some("\"edge.remote_address\";q=10;w=60")
    );
    assert!(
        over.headers
            .get("ratelimit")
            .is_some_and(|v| v.starts_with("\"edge.remote_address\";r=0;t=")),
        "{:?}",
        over.headers
    );
    // Envoy's counters and Sluice's agree: 10 admitted, 2 refused.
    let stats = envoy.stats();
    assert_eq!(
        stats.get("cluster.app.ratelimit.ok"),
        Some(&10),
        "{stats:?}"
    );
    assert_eq!(stats.get("cluster.app.ratelimit.over_limit"), Some(&2));
    let m = sluice.metrics();
    let decisions = |outcome: &str| {
        m.iter()
            .filter(|(k, _)| {
                k.starts_with("sluice_decisions_total{")
                    && k.contains("op=\"should_rate_limit\"")
                    && k.contains(&format!("outcome=\"{outcome}\""))
            })
            .map(|(_, v)| *v)
            .sum::<f64>()
    };
    assert_eq!(decisions("allowed"), 10.0, "{m:?}");
    assert_eq!(decisions("denied"), 2.0);
}

#[test]
fn the_deploying_guide_bootstrap_runs_in_a_real_envoy() {
    let Some(bin) = support::envoy_bin() else {
        return;
    };
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(
        rules.path().join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: { unit: day, requests_per_unit: 3 }\n",
    )
    .unwrap();
    let sluice = Sluice::start_in(rules.path(), "policies: {}\nrls: { config_dir: . }\n");
    let (listener, app) = (support::port(), support::upstream());
    let bootstrap = support::docs_bootstrap(
        "deploying.md",
        "sluice-headless.sluice.svc.cluster.local",
        listener,
        app,
        sluice.grpc,
    );
    let _envoy = Envoy::start(&bin, &bootstrap);
    assert_eq!(
        statuses(&mut Client::new(listener), "/", 5),
        [200, 200, 200, 429, 429]
    );
}

#[test]
fn the_reference_rule_kinds_and_actions_through_envoy() {
    let Some(bin) = support::envoy_bin() else {
        return;
    };
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(
        rules.path().join("edge.yaml"),
        "domain: edge
descriptors:
  - key: generic_key
    value: free
    rate_limit: { unlimited: true }
  - key: generic_key
    value: shadow
    shadow_mode: true
    rate_limit: { unit: day, requests_per_unit: 1 }
  - key: user
    rate_limit: { unit: day, requests_per_unit: 2 }
  - key: plan
    value: gold
    descriptors:
      - key: user
        rate_limit: { unit: day, requests_per_unit: 4, name: gold_user }
  - key: plan
    value: bronze
    descriptors:
      - key: user
        rate_limit: { unit: day, requests_per_unit: 1, replaces: [{ name: gold_user }] }
",
    )
    .unwrap();
    let sluice = Sluice::start_in(rules.path(), "policies: {}\nrls: { config_dir: . }\n");
    let (listener, app) = (support::port(), support::upstream());
    // A route whose `rate_limits` are `entries`, each a list of action lines.
    let route = |prefix: &str, entries: &[&[&str]]| {
        let mut out = format!(
            "                        - match: {{ prefix: \"{prefix}\" }}
                          route:
                            cluster: app
                            rate_limits:
"
        );
        for actions in entries {
            out.push_str("                              - actions:\n");
            for a in *actions {
                out.push_str(&format!("                                  - {a}\n"));
            }
        }
        out
    };
    let user = "request_headers: { header_name: x-user, descriptor_key: user }";
    let gold = "header_value_match: { descriptor_key: plan, descriptor_value: gold, headers: [{ name: x-plan, string_match: { exact: gold } }] }";
    let routes = [
        route("/free", &[&["generic_key: { descriptor_value: free }"]]),
        route("/shadow", &[&["generic_key: { descriptor_value: shadow }"]]),
        route("/user", &[&[user]]),
        route("/gold", &[&[gold, user]]),
        // Two descriptors in one request: the bronze rule replaces the gold one.
        route(
            "/both",
            &[
                &[
                    "generic_key: { descriptor_key: plan, descriptor_value: gold }",
                    user,
                ],
                &[
                    "generic_key: { descriptor_key: plan, descriptor_value: bronze }",
                    user,
                ],
            ],
        ),
    ]
    .concat();
    let bootstrap = support::read("examples/envoy/envoy-rls.yaml");
    let start = bootstrap.find("                      routes:\n").unwrap();
    let end = bootstrap.find("                http_filters:").unwrap();
    let bootstrap = format!(
        "{}                      routes:\n{routes}{}",
        &bootstrap[..start],
        &bootstrap[end..]
    );
    let bootstrap = support::with_ports(
        &bootstrap,
        &[(10000, listener), (10010, app), (8081, sluice.grpc)],
    );
    // The example's second listener is replaced by the test's upstream.
    let bootstrap = bootstrap.replace(
        &format!(
            "socket_address: {{ address: 127.0.0.1, port_value: {app} }}\n      filter_chains"
        ),
        &format!(
            "socket_address: {{ address: 127.0.0.1, port_value: {} }}\n      filter_chains",
            support::port()
        ),
    );
    let _envoy = Envoy::start(&bin, &bootstrap);
    let mut c = Client::new(listener);
    // unlimited: never counted; shadow_mode: over its limit of 1, still 200.
    assert_eq!(statuses(&mut c, "/free", 5), [200; 5]);
    assert_eq!(statuses(&mut c, "/shadow", 3), [200; 3]);
    // request_headers: 2 a day per user, each user its own.
    let mut call = |path: &str, who: &str, plan: Option<&str>| {
        let mut h = vec![("x-user", who)];
        h.extend(plan.map(|p| ("x-plan", p)));
        c.get(path, &h).status
    };
    let ann: Vec<u16> = (0..3).map(|_| call("/user", "ann", None)).collect();
    assert_eq!(ann, [200, 200, 429]);
    assert_eq!(call("/user", "bob", None), 200);
    // replaces: a request carrying both plans is limited by bronze's 1 a day alone, and the
    // gold rule it replaces does not count it.
    assert_eq!(
        [call("/both", "cy", None), call("/both", "cy", None)],
        [200, 429]
    );
    // header_value_match then request_headers: the nested rule, 4 a day, for the gold plan;
    // without the header the descriptor is not sent and nothing limits the route.
    let gold: Vec<u16> = (0..5).map(|_| call("/gold", "cy", Some("gold"))).collect();
    assert_eq!(gold, [200, 200, 200, 200, 429]);
    assert_eq!(call("/gold", "cy", None), 200);
}

#[test]
fn failure_mode_deny_and_on_store_error_against_a_store_that_is_down() {
    let Some(bin) = support::envoy_bin() else {
        return;
    };
    if !sluice_testkit::require_redis() {
        return;
    }
    let mut redis = sluice_testkit::RedisServer::start().unwrap();
    let dir = support::repo().join("examples/envoy");
    let config = |mode: &str| {
        support::read("examples/envoy/sluice.yaml").replace(
            "rls:\n  config_dir: ./ratelimit-config\n",
            &format!(
                "rls:\n  config_dir: ./ratelimit-config\n  on_store_error: {mode}\nstore: {{ backend: redis, shards: [{{ primary: '{}' }}], timeout: 200ms }}\n",
                redis.url()
            ),
        )
    };
    let servers: Vec<(&str, Sluice)> = ["closed", "open", "local"]
        .into_iter()
        .map(|mode| (mode, Sluice::start_in(&dir, &config(mode))))
        .collect();
    let envoys: Vec<(&str, bool, Envoy, u16)> = servers
        .iter()
        .flat_map(|(mode, s)| {
            [false, true].map(|deny| {
                let (e, port) = support::example_rls_envoy(&bin, s.grpc, deny);
                (*mode, deny, e, port)
            })
        })
        .collect();
    for (_, _, _, port) in &envoys {
        assert_eq!(
            Client::new(*port).get("/", &[]).status,
            200,
            "the store answers"
        );
    }
    redis.kill().unwrap();
    for (mode, deny, _, port) in &envoys {
        let status = Client::new(*port).get("/", &[]).status;
        // closed: UNAVAILABLE, and Envoy's failure_mode_deny decides (500 when it denies);
        // open, local (the server's own count): OK whatever Envoy would do on an error.
        let expected = if *mode == "closed" && *deny { 500 } else { 200 };
        assert_eq!(
            status, expected,
            "on_store_error: {mode}, failure_mode_deny: {deny}"
        );
    }
    for (mode, s) in &servers {
        let m = s.metrics();
        let outcome = if *mode == "closed" {
            "error"
        } else {
            "degraded"
        };
        let n: f64 = m
            .iter()
            .filter(|(k, _)| {
                k.starts_with("sluice_decisions_total{")
                    && k.contains(&format!("outcome=\"{outcome}\""))
            })
            .map(|(_, v)| *v)
            .sum();
        assert_eq!(n, 2.0, "{mode}: {outcome} decisions: {m:?}");
        // The dashboard's counts agree with the metrics, under the rule.
        let stats: serde_json::Value =
            serde_json::from_str(&support::get(s.http, "/v1/stats").1).unwrap();
        let rule = stats["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["rule"] == "remote_address")
            .unwrap_or_else(|| panic!("{stats}"));
        let counted = if *mode == "closed" {
            "errors"
        } else {
            "degraded"
        };
        assert_eq!(rule["counts"][counted], 2, "{mode}: {rule}");
    }
}

/// One Envoy over two Sluice servers on one Redis: `n` requests from `threads` at once.
fn concurrent(port: u16, threads: usize, each: usize) -> Vec<u16> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| s.spawn(move || statuses(&mut Client::new(port), "/", each)))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

#[test]
fn one_envoy_over_two_servers_on_one_redis_admits_exactly_the_limit_through_a_restart() {
    let Some(bin) = support::envoy_bin() else {
        return;
    };
    if !sluice_testkit::require_redis() {
        return;
    }
    let redis = sluice_testkit::RedisServer::start().unwrap();
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(
        rules.path().join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: { unit: day, requests_per_unit: 100 }\n",
    )
    .unwrap();
    let config = format!(
        "policies: {{}}\nrls: {{ config_dir: . }}\nstore: {{ backend: redis, shards: [{{ primary: '{}' }}], timeout: 1s }}\n",
        redis.url()
    );
    let mut servers = [
        Sluice::start_in(rules.path(), &config),
        Sluice::start_in(rules.path(), &config),
    ];
    let listener = support::port();
    // Both servers behind one cluster; Envoy spreads its calls over them. failure_mode_deny:
    // a call that fails is a 500, never an admission Sluice did not count.
    let endpoints = format!(
        "              - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {} }} }} }}\n              - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {} }} }} }}\n",
        servers[0].grpc, servers[1].grpc
    );
    let bootstrap = support::with_ports(
        &support::read("examples/envoy/envoy-rls.yaml"),
        &[(10000, listener), (10010, support::port())],
    )
    .replace("failure_mode_deny: false", "failure_mode_deny: true")
    .replace(
        "              - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 8081 } } }\n",
        &endpoints,
    );
    let envoy = Envoy::start(&bin, &bootstrap);
    // 60 at once: all admitted, each counted once across the two servers.
    let first = concurrent(listener, 6, 10);
    assert_eq!(first.iter().filter(|s| **s == 200).count(), 60, "{first:?}");
    // 80 more while one server restarts: the 40 left, never more, and the rest refused (429,
    // or 500 for a call that reached the server going away).
    let during = std::thread::scope(|s| {
        let load = s.spawn(|| concurrent(listener, 4, 20));
        servers[1].restart();
        load.join().unwrap()
    });
    let admitted = during.iter().filter(|s| **s == 200).count();
    assert!(
        admitted <= 40,
        "{admitted} admitted past the limit: {during:?}"
    );
    assert!(
        during.iter().all(|s| [200, 429, 500].contains(s)),
        "{during:?}"
    );
    // Envoy reconnects to the restarted server: every answer is Sluice's again. What was not
    // admitted of the 100 is admitted now, less what a call cut by the restart may have
    // counted before its answer was lost (a 500), and then nothing more.
    let cut = during.iter().filter(|s| **s == 500).count();
    let topped = statuses(&mut Client::new(listener), "/", 40);
    let total = admitted + topped.iter().filter(|s| **s == 200).count();
    assert!(
        total <= 40 && total + cut >= 40,
        "{total} admitted, {cut} cut: {topped:?}"
    );
    assert_eq!(concurrent(listener, 4, 5), [429; 20], "after the restart");
    let stats = envoy.stats();
    assert_eq!(
        stats.get("cluster.app.ratelimit.ok"),
        Some(&(60 + total as u64)),
        "{stats:?}"
    );
}

/// What Envoy 1.40 sends for `hits_addend`: nothing for a route's `rate_limits` (each request
/// counts 1), the descriptor's own for the filter's `rate_limits`, which Sluice counts.
#[test]
fn hits_addend_counts_as_envoy_sends_it() {
    let Some(bin) = support::envoy_bin() else {
        return;
    };
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(
        rules.path().join("edge.yaml"),
        support::read("examples/envoy/ratelimit-config/edge.yaml")
            + "  - key: generic_key\n    value: costly\n    rate_limit: { unit: day, requests_per_unit: 10 }\n",
    )
    .unwrap();
    let sluice = Sluice::start_in(rules.path(), "policies: {}\nrls: { config_dir: . }\n");
    let example = support::read("examples/envoy/envoy-rls.yaml");
    let envoy = |bootstrap: String| {
        let listener = support::port();
        let bootstrap = support::with_ports(
            &bootstrap,
            &[
                (10000, listener),
                (10010, support::port()),
                (8081, sluice.grpc),
            ],
        );
        (Envoy::start(&bin, &bootstrap), listener)
    };
    // The route's first rate limit (10 a minute per address) says 3 hits a request.
    let (_route, route_port) = envoy(example.replacen(
        "                                  - remote_address: {}\n",
        "                                  - remote_address: {}\n                                hits_addend: { number: 3 }\n",
        1,
    ));
    assert_eq!(
        statuses(&mut Client::new(route_port), "/", 11)[9..],
        [200, 429]
    );
    // The filter's own rate limits, the hits from a header: 4 + 4 of 10, then 4 more is over.
    let (_filter, filter_port) = envoy(example.replacen(
        "                      enable_x_ratelimit_headers: DRAFT_VERSION_03\n",
        "                      enable_x_ratelimit_headers: DRAFT_VERSION_03
                      rate_limits:
                        - actions:
                            - generic_key: { descriptor_value: costly }
                          hits_addend: { format: \"%REQ(x-cost)%\" }
",
        1,
    ));
    let mut c = Client::new(filter_port);
    let costly: Vec<u16> = (0..3)
        .map(|_| c.get("/", &[("x-cost", "4")]).status)
        .collect();
    assert_eq!(costly, [200, 200, 429]);
    assert_eq!(c.get("/", &[("x-cost", "2")]).status, 200, "2 more fit");
}

#[test]
fn response_headers_draft03_and_off_reach_the_client_as_configured() {
    let Some(bin) = support::envoy_bin() else {
        return;
    };
    let dir = support::repo().join("examples/envoy");
    for mode in ["draft03", "off"] {
        let config = support::read("examples/envoy/sluice.yaml").replace(
            "rls:\n  config_dir: ./ratelimit-config\n",
            &format!("rls:\n  config_dir: ./ratelimit-config\n  response_headers: {mode}\n"),
        );
        let sluice = Sluice::start_in(&dir, &config);
        let (_envoy, port) = support::example_rls_envoy(&bin, sluice.grpc, false);
        let a = Client::new(port).get("/", &[]);
        assert_eq!(a.status, 200);
        let has = |h: &str| a.headers.contains_key(h);
        // Envoy's own DRAFT_VERSION_03 headers whatever Sluice sends.
        assert!(has("x-ratelimit-limit"), "{mode}: {:?}", a.headers);
        assert!(
            !has("ratelimit-policy") && !has("ratelimit"),
            "{mode}: {:?}",
            a.headers
        );
        if mode == "draft03" {
            assert_eq!(
                a.headers.get("ratelimit-limit").map(String::as_str),
                Some("10")
            );
            assert_eq!(
                a.headers.get("ratelimit-remaining").map(String::as_str),
                Some("9")
            );
            assert!(has("ratelimit-reset"), "{:?}", a.headers);
        } else {
            assert!(
                !has("ratelimit-limit") && !has("ratelimit-remaining"),
                "{:?}",
                a.headers
            );
        }
    }
}
