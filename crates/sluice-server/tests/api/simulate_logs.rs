//! The simulator reads the logs operators have: each format is read with the right
//! keys and times, detected or named; a line that cannot be read is skipped and counted by
//! reason, never read wrongly; one defect the issue found per test, each failing before.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use serde_json::{Value, json};
use sluice_simulate::{Bounds, LogReport, Report, SimError, Simulation};

/// 1 request a key per 1 h, so a key's first request is admitted and the others denied.
fn run(traffic: Value) -> Result<Report, SimError> {
    let request = json!({
        "policies": [{"name": "p", "limits": [{"max": 1, "per": "1h"}]}],
        "traffic": traffic,
        "top": 100,
    });
    Simulation::from_request(&request, &[], &Bounds::default())?.run()
}

/// The keys with their (admitted, denied), by name.
fn keys(r: &Report) -> Vec<(String, u64, u64)> {
    let mut k: Vec<(String, u64, u64)> = r.policies[0]
        .top_keys
        .iter()
        .map(|k| (k.key.clone(), k.admitted, k.denied))
        .collect();
    k.sort();
    k
}

fn how(r: &Report) -> &LogReport {
    r.log.as_ref().expect("a log report")
}

fn reasons(r: &Report) -> Vec<(String, u64)> {
    how(r)
        .skip_reasons
        .iter()
        .map(|s| (s.reason.clone(), s.lines))
        .collect()
}

fn k(key: &str, admitted: u64, denied: u64) -> (String, u64, u64) {
    (key.to_owned(), admitted, denied)
}

const ENVOY_EDGE: &str = r#"[2026-01-01T00:00:00.000Z] "GET /a HTTP/1.1" 200 - 0 10 2 1 "203.0.113.9, 10.1.1.1" "curl/8" "id-1" "api.example.com" "10.2.0.5:8080"
[2026-01-01T00:00:00.400Z] "GET /b HTTP/1.1" 200 - 0 10 2 1 "-" "curl/8" "id-2" "api.example.com" "10.2.0.5:8080"
[2026-01-01T00:00:00.900Z] "GET /c HTTP/2" 429 RL 0 0 1 - "203.0.113.9" "curl/8" "id-3" "api.example.com" "-"
"#;

#[test]
fn an_envoy_line_without_x_forwarded_for_is_counted_not_fatal() {
    // Before: `traffic.log: line 2: x_forwarded_for is empty (`-`)`, and no answer.
    let r = run(json!({"format": "envoy", "log": ENVOY_EDGE})).unwrap();
    assert_eq!(keys(&r), vec![k("203.0.113.9", 1, 1)]);
    let l = how(&r);
    assert_eq!((l.lines, l.read, l.skipped), (3, 2, 1));
    assert_eq!(reasons(&r), vec![("client: no address".to_owned(), 1)]);
    assert_eq!(l.first_skipped[0].line, 2);
    assert!(
        l.first_skipped[0].reason.contains("x_forwarded_for"),
        "{l:?}"
    );
    // Keyed by another field, the line counts.
    let r = run(json!({"format": "envoy", "log": ENVOY_EDGE, "key": "request_id"})).unwrap();
    assert_eq!(how(&r).skipped, 0);
    assert_eq!(r.events, 3);
}

const NGINX: &str = r#"10.0.0.1 - - [01/Jan/2026:00:00:00 +0000] "GET /a HTTP/1.1" 200 5 "-" "curl/8"
10.0.0.2 - alice [01/Jan/2026:00:00:01 +0000] "" 400 0 "-" "-"
10.0.0.1 - - [01/Jan/2026:00:00:02 +0000] "POST /b HTTP/1.1" 201 0 "-" "curl/8"
10.0.0.3 - - [01/Jan/2026:00:00:03 +0000] "GET /c HTTP/1.1" 200 0 "-" "cu
"#;

#[test]
fn nginx_dash_user_empty_request_and_a_truncated_last_line_do_not_abort() {
    let r = run(json!({"format": "nginx", "log": NGINX})).unwrap();
    assert_eq!(keys(&r), vec![k("10.0.0.1", 1, 1), k("10.0.0.2", 1, 0)]);
    assert_eq!(r.duration_ms, 2_001);
    assert_eq!(
        reasons(&r),
        vec![("a quote or bracket not closed".to_owned(), 1)]
    );
    assert_eq!(how(&r).first_skipped[0].line, 4);
    // Keyed by remote_user, the `-` lines are counted, alice's read.
    let r = run(json!({"format": "nginx", "log": NGINX, "key_field": "remote_user"})).unwrap();
    assert_eq!(keys(&r), vec![k("alice", 1, 0)]);
    assert_eq!(
        reasons(&r),
        vec![
            ("remote_user is `-`".to_owned(), 2),
            ("a quote or bracket not closed".to_owned(), 1)
        ]
    );
    // Keyed by path, the `""` request is counted.
    let r = run(json!({"format": "nginx", "log": NGINX, "key": "path"})).unwrap();
    assert_eq!(keys(&r), vec![k("/a", 1, 0), k("/b", 1, 0)]);
    assert!(
        reasons(&r).contains(&("path is missing".to_owned(), 1)),
        "{:?}",
        reasons(&r)
    );
}

const ISTIO: &str = r#"[2026-01-01T00:00:00.000Z] "GET /status/418 HTTP/1.1" 418 - via_upstream - "-" 0 135 4 4 "-" "curl/8.5.0" "5c9f-1" "httpbin:8000" "10.244.0.12:80" outbound|8000||httpbin.default.svc.cluster.local 10.244.0.11:41854 10.96.3.4:8000 10.244.0.11:47236 - default
[2026-01-01T00:00:00.500Z] "GET /status/200 HTTP/1.1" 200 - via_upstream - "-" 0 135 3 2 "-" "curl/8.5.0" "5c9f-2" "httpbin:8000" "10.244.0.12:80" outbound|8000||httpbin.default.svc.cluster.local 10.244.0.11:41854 10.96.3.4:8000 10.244.0.11:47238 - default
[2026-01-01T00:00:00.700Z] "GET /status/200 HTTP/1.1" 200 - via_upstream - "-" 0 135 3 2 "198.51.100.7" "curl/8.5.0" "5c9f-3" "httpbin:8000" "10.244.0.12:80" outbound|8000||httpbin.default.svc.cluster.local 10.244.0.11:41854 10.96.3.4:8000 10.244.0.13:47238 - default
"#;

#[test]
fn istio_is_read_as_istio_and_never_keyed_by_bytes_sent() {
    // Before: read as Envoy's format, the key was bytes_sent (`135`).
    for r in named_and_detected("istio", ISTIO) {
        // The forwarded client first, else the connection's address without its port.
        assert_eq!(
            keys(&r),
            vec![k("10.244.0.11", 1, 1), k("198.51.100.7", 1, 0)]
        );
    }
    // Named as Envoy's format, its lines are counted as of another layout.
    let e = run(json!({"format": "envoy", "log": ISTIO})).unwrap_err();
    assert_eq!(e.path, "traffic.log");
    assert!(e.message.contains("3 × not the 13 fields of envoy"), "{e}");
    assert!(
        e.message
            .ends_with("(the lines read as istio: name that format)"),
        "{e}"
    );
}

#[test]
fn a_field_that_does_not_look_like_its_name_is_a_counted_skip() {
    // An Istio line read as Envoy's layout would have 13+ fields only if cut; a line whose
    // x_forwarded_for holds a number, or whose remote_addr is not an address, is skipped.
    let log = "10.0.0.1 - - [01/Jan/2026:00:00:00 +0000] \"GET / HTTP/1.1\" 200 5 \"-\" \"c\"\n\
               bytes - - [01/Jan/2026:00:00:01 +0000] \"GET / HTTP/1.1\" 200 5 \"-\" \"c\"\n\
               10.0.0.1 - - [01/Jan/2026:00:00:02 +0000] \"GET / HTTP/1.1\" OK 5 \"-\" \"c\"\n\
               10.0.0.1 - - [yesterday] \"GET / HTTP/1.1\" 200 5 \"-\" \"c\"\n";
    let r = run(json!({"format": "nginx", "log": log})).unwrap();
    assert_eq!(r.events, 1);
    assert_eq!(
        reasons(&r),
        vec![
            ("remote_addr: is not an IP address".to_owned(), 1),
            ("status: is not a number".to_owned(), 1),
            ("time_local: not a time".to_owned(), 1),
        ]
    );
    let lines: Vec<u64> = how(&r).first_skipped.iter().map(|s| s.line).collect();
    assert_eq!(lines, vec![2, 3, 4]);
}

#[test]
fn csv_epoch_milliseconds_and_microseconds_are_read_as_such() {
    // Before: 1767225600250 was read as seconds (the year 57970) with no error.
    for (log, unit) in [
        ("1767225600000,a\n1767225600250,a\n1767225601000,b\n", None),
        (
            "1767225600000000,a\n1767225600250000,a\n1767225601000000,b\n",
            None,
        ),
        ("1767225600,a\n1767225600.25,a\n1767225601,b\n", None),
        (
            "1767225600000,a\n1767225600250,a\n1767225601000,b\n",
            Some("ms"),
        ),
    ] {
        let mut traffic = json!({"format": "csv", "log": log});
        if let Some(u) = unit {
            traffic["time_unit"] = json!(u);
        }
        let r = run(traffic).unwrap();
        assert_eq!(r.start_ms, 1_767_225_600_000, "{log}");
        assert_eq!(r.duration_ms, 1_001, "{log}");
        assert_eq!(r.policies[0].first_denial_ms, Some(250), "{log}");
    }
    // A time of another magnitude than the first is counted, not read in another unit.
    let r =
        run(json!({"format": "csv", "log": "1767225600000,a\n1767225601,a\n1767225600500,b\n"}))
            .unwrap();
    assert_eq!(r.events, 2);
    assert_eq!(reasons(&r), vec![("timestamp: not a time".to_owned(), 1)]);
    assert!(
        how(&r).first_skipped[0]
            .reason
            .contains("first time was in ms")
    );
    let e = run(json!({"format": "csv", "log": "1,a\n", "time_unit": "hours"})).unwrap_err();
    assert_eq!(e.path, "traffic.time_unit");
}

#[test]
fn a_csv_first_line_with_an_offset_is_data_not_a_header() {
    // Before: `+0100` did not read as RFC 3339, so the first line was taken for a header.
    let log =
        "2026-01-01T01:00:00+0100,a\n2026-01-01T00:00:00.500Z,a\n2026-01-01T02:00:01+02:00,b\n";
    let r = run(json!({"format": "csv", "log": log})).unwrap();
    assert_eq!(r.events, 3);
    assert_eq!(r.start_ms, 1_767_225_600_000);
    assert_eq!(keys(&r), vec![k("a", 1, 1), k("b", 1, 0)]);
    // A header names its columns; the key and time can be any of them, the key several.
    let log = "when,user,route,cost\n2026-01-01T00:00:00Z,u1,/a,1\n2026-01-01T00:00:01Z,u1,/b,\n2026-01-01T00:00:02Z,u1,/a,2\n";
    let r = run(json!({"log": log, "time_field": "when", "key": "user,route"})).unwrap();
    assert_eq!(log_format(&r), "csv");
    assert_eq!(keys(&r), vec![k("u1|/a", 1, 1), k("u1|/b", 1, 0)]);
    let e = run(json!({"format": "csv", "log": log, "time_field": "when", "key": "cookie"}))
        .unwrap_err();
    assert_eq!(e.path, "traffic.key");
    assert!(
        e.message
            .contains("its header names when, user, route, cost"),
        "{e}"
    );
}

fn log_format(r: &Report) -> &'static str {
    how(r).format
}

/// `log` simulated with `format` named and with no format: both read it as `format`.
fn named_and_detected(format: &str, log: &str) -> [Report; 2] {
    [json!(format), Value::Null].map(|given| {
        let r = run(json!({"format": given, "log": log})).unwrap();
        assert_eq!(how(&r).format, format, "given {given}");
        r
    })
}

#[test]
fn apache_common_and_combined_are_read() {
    // Before: `apache` was no format, and common's 7 fields too few for Nginx's.
    let common = "192.0.2.1 - frank [10/Oct/2000:13:55:36 -0700] \"GET /apache_pb.gif HTTP/1.0\" 200 2326\n\
                  host.example.com - - [10/Oct/2000:13:55:37 -0700] \"GET / HTTP/1.0\" 304 -\n\
                  192.0.2.1 - frank [10/Oct/2000:13:55:38 -0700] \"GET / HTTP/1.0\" 200 10\n";
    for r in named_and_detected("apache_common", common) {
        assert_eq!(r.start_ms, 971_211_336_000);
        assert_eq!(
            keys(&r),
            vec![k("192.0.2.1", 1, 1), k("host.example.com", 1, 0)]
        );
    }
    let combined = "192.0.2.1 - frank [10/Oct/2000:13:55:36 -0700] \"GET /a HTTP/1.0\" 200 2326 \"http://example.com/\" \"Mozilla/4.08\"\n\
                    192.0.2.2 - - [10/Oct/2000:13:55:37 -0700] \"GET /a HTTP/1.0\" 200 10 \"-\" \"Mozilla/4.08\"\n";
    let r =
        run(json!({"format": "apache_combined", "log": combined, "key": "user_agent"})).unwrap();
    assert_eq!(keys(&r), vec![k("Mozilla/4.08", 1, 1)]);
}

#[test]
fn nginx_main_is_keyed_by_the_forwarded_client_not_the_balancer() {
    // Before: keyed by remote_addr, the load balancer: 1 key for 3 clients here.
    let log = r#"10.0.0.1 - - [01/Jan/2026:00:00:00 +0000] "GET /a HTTP/1.1" 200 5 "-" "curl/8" "203.0.113.9"
10.0.0.1 - - [01/Jan/2026:00:00:01 +0000] "GET /a HTTP/1.1" 200 5 "-" "curl/8" "198.51.100.4, 10.0.0.9"
10.0.0.1 - - [01/Jan/2026:00:00:02 +0000] "GET /a HTTP/1.1" 200 5 "-" "curl/8" "203.0.113.9"
10.0.0.2 - - [01/Jan/2026:00:00:03 +0000] "GET /a HTTP/1.1" 200 5 "-" "curl/8" "-"
"#;
    for r in named_and_detected("nginx_main", log) {
        assert_eq!(
            keys(&r),
            vec![
                k("10.0.0.2", 1, 0),
                k("198.51.100.4", 1, 0),
                k("203.0.113.9", 1, 1)
            ]
        );
    }
    let r =
        run(json!({"format": "nginx_main", "log": log, "key": "http_x_forwarded_for"})).unwrap();
    assert_eq!(how(&r).skipped, 1);
    // Several fields: method, path and client, joined by `|`.
    let r = run(json!({"log": log, "key": "method,path,client"})).unwrap();
    assert_eq!(keys(&r)[2], k("GET|/a|203.0.113.9", 1, 1));
}

#[test]
fn envoy_json_access_logs_are_read() {
    // Before: `unknown field downstream_remote_address`.
    let log = r#"{"start_time":"2026-01-01T00:00:00.000Z","method":"GET","path":"/a","protocol":"HTTP/1.1","response_code":200,"bytes_sent":10,"x_forwarded_for":null,"downstream_remote_address":"198.51.100.4:51234","authority":"api"}
{"start_time":"2026-01-01T00:00:00.250Z","method":"GET","path":"/b","protocol":"HTTP/1.1","response_code":200,"bytes_sent":10,"x_forwarded_for":"203.0.113.9, 10.0.0.1","downstream_remote_address":"10.0.0.1:40000","authority":"api"}
{"start_time":"2026-01-01T00:00:00.500Z","method":"GET","path":"/a","protocol":"HTTP/1.1","response_code":429,"bytes_sent":0,"x_forwarded_for":null,"downstream_remote_address":"198.51.100.4:51240","authority":"api"}
{"start_time":"2026-01-01T00:00:00.600Z","method":"GET","path":"/a","response_code":200,"downstream_remote_address":"bytes"}
"#;
    for r in named_and_detected("envoy_json", log) {
        assert_eq!(
            keys(&r),
            vec![k("198.51.100.4", 1, 1), k("203.0.113.9", 1, 0)]
        );
        assert_eq!(r.duration_ms, 501);
        assert_eq!(
            reasons(&r),
            vec![(
                "downstream_remote_address: is not an address with a port".to_owned(),
                1
            )]
        );
    }
    let r = run(json!({"log": log, "key": "method,path,response_code"})).unwrap();
    assert_eq!(keys(&r)[0], k("GET|/a|200", 1, 1));
}

#[test]
fn json_lines_take_a_key_field_and_a_time_field() {
    // Before: `key_field` was refused for JSON lines, and any field but timestamp, key, cost.
    let log = r#"{"ts": 1767225600000, "user": "alice", "route": "/a"}
{"ts": 1767225600100, "user": "bob", "route": "/a"}
{"ts": 1767225600200, "user": "alice", "route": "/b"}
{"ts": "soon", "user": "alice"}
{"ts": 1767225600300, "route": "/b"}
"#;
    let r = run(json!({"format": "jsonl", "log": log, "key_field": "user", "time_field": "ts"}))
        .unwrap();
    assert_eq!(keys(&r), vec![k("alice", 1, 1), k("bob", 1, 0)]);
    assert_eq!(r.duration_ms, 201);
    assert_eq!(
        reasons(&r),
        vec![
            ("ts: not a time".to_owned(), 1),
            ("user is missing".to_owned(), 1)
        ]
    );
    // Detected, with the same options.
    let r = run(json!({"log": log, "key": "user", "time_field": "ts"})).unwrap();
    assert_eq!(log_format(&r), "jsonl");
    // A time field no line has: every line counted, none read.
    let e = run(json!({"format": "jsonl", "log": log, "key": "user", "time_field": "time"}))
        .unwrap_err();
    assert!(
        e.message
            .contains("none of the 5 lines could be read as jsonl"),
        "{e}"
    );
    assert!(e.message.contains("5 × time: not a time"), "{e}");
}

#[test]
fn the_format_is_detected_or_refused_naming_the_formats() {
    let e = run(json!({"log": "hello world\nthis is not a log\n"})).unwrap_err();
    assert_eq!(e.path, "traffic.format");
    assert!(e.message.contains("its first line: `hello world`"), "{e}");
    let r = run(json!({"log": ENVOY_EDGE})).unwrap();
    assert_eq!(log_format(&r), "envoy");
    assert!(how(&r).detected);
    let r = run(json!({"log": NGINX})).unwrap();
    assert_eq!(log_format(&r), "nginx");
    // A time field for a fixed layout is refused.
    let e = run(json!({"format": "nginx", "log": NGINX, "time_field": "x"})).unwrap_err();
    assert_eq!(e.path, "traffic.time_field");
}
