//! Every YAML and JSON example of docs/*.md and README.md, and every `curl` of theirs, is
//! checked as a user would use it:
//!
//! - a ```yaml block is a Sluice configuration: `sluice config check` (the real binary) must
//!   accept it, in a directory holding the files it names (certificates, tokens, passwords)
//!   and with the environment variables it names set;
//! - a ```json block is a request sent to a live `sluice serve`, or an answer compared, key by
//!   key and type by type, with the live server's answer to the request it names;
//! - a `curl` in a ```sh block is run against the live server, and the status (and keys) of
//!   the `# 200 {…}` comment after it, if any, must be what it answers.
//!
//! The live server serves every policy the configuration examples define (and the demo
//! policy of `sluice serve` without `--config`), on ports of its own.
//!
//! A block that is something else says so in an HTML comment on the line before its fence:
//!
//! | marker | block |
//! |---|---|
//! | `<!-- example: rls rule file -->` | a rule file of Envoy's reference rate limit service, read by the `rls` parser |
//! | `<!-- example: envoy bootstrap … -->` | an Envoy configuration (parsed here as YAML; `crates/sluice-server/tests/envoy/envoy_config.rs` reads it with Envoy's descriptors) |
//! | `<!-- example: fragment -->` | deliberately not whole: only its YAML or JSON syntax is checked |
//! | `<!-- example: request METHOD PATH -->` | a JSON body, sent; the answer must not be an error |
//! | `<!-- example: response to METHOD PATH [BODY] -->` | a JSON answer; the live answer must have the same keys and types |
//!
//! An unmarked ```json block, or a block that does not parse, fails the test.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use support::{Process, sluice, text};

/// A fenced block of a markdown file.
#[derive(Debug)]
struct Block {
    /// `docs/api.md:58`, the line of the opening fence.
    at: String,
    /// The info string: `yaml`, `json`, `sh`, …
    lang: String,
    /// The marker's text (`request POST /v1/check`), if the line before the fence has one.
    marker: Option<String>,
    text: String,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The markdown files: README.md and docs/*.md, in name order.
fn markdown_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    files.insert(0, root().join("README.md"));
    files
}

fn blocks(file: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(file).unwrap();
    let name = file
        .strip_prefix(root())
        .unwrap_or(file)
        .display()
        .to_string();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i;
        let marker = lines[..start]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| l.trim().strip_prefix("<!-- example:"))
            .and_then(|l| l.strip_suffix("-->"))
            .map(|m| m.trim().to_owned());
        i += 1;
        let mut body = Vec::new();
        while i < lines.len() && lines[i].trim() != "```" {
            body.push(lines[i]);
            i += 1;
        }
        assert!(
            i < lines.len(),
            "{name}:{}: the fence is never closed",
            start + 1
        );
        out.push(Block {
            at: format!("{name}:{}", start + 1),
            lang: info.trim().to_owned(),
            marker,
            text: body.join("\n") + "\n",
        });
        i += 1;
    }
    out
}

// ----- configurations -------------------------------------------------------------------

/// What a configuration example needs beside it: each file it names (PEM files from a
/// throw-away CA, a token, a password), each directory, and each variable.
fn provide(
    value: &serde_yaml_ng::Value,
    dir: &Path,
    certs: &sluice_testkit::TlsCerts,
    env: &mut Vec<(String, String)>,
) {
    match value {
        serde_yaml_ng::Value::Mapping(map) => {
            for (k, v) in map {
                let (Some(key), Some(text)) = (k.as_str(), v.as_str()) else {
                    provide(v, dir, certs, env);
                    continue;
                };
                let path = dir.join(text);
                let (cert, key_file) = certs.server_files();
                let content = match key {
                    "cert_file" => Some(std::fs::read(cert).unwrap()),
                    "key_file" => Some(std::fs::read(key_file).unwrap()),
                    "ca_file" | "client_ca_file" => Some(std::fs::read(certs.ca_file()).unwrap()),
                    "tokens_file" => Some(b"docs-example-token-0123456789abcdef\n".to_vec()),
                    "password_file" => Some(b"docs-example-password\n".to_vec()),
                    _ => None,
                };
                if let Some(content) = content {
                    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                    std::fs::write(&path, content).unwrap();
                } else if key == "config_dir" {
                    std::fs::create_dir_all(&path).unwrap();
                } else if key == "tokens_env" {
                    env.push((
                        text.to_owned(),
                        "docs-example-token-0123456789abcdef".to_owned(),
                    ));
                } else if key == "password_env" {
                    env.push((text.to_owned(), "docs-example-password".to_owned()));
                }
            }
        }
        serde_yaml_ng::Value::Sequence(items) => {
            for v in items {
                provide(v, dir, certs, env);
            }
        }
        _ => {}
    }
}

/// `sluice config check` on the block, in a directory with what it names; its policies.
fn check_config(
    block: &Block,
    certs: &sluice_testkit::TlsCerts,
) -> Result<serde_yaml_ng::Mapping, String> {
    let value: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&block.text).map_err(|e| format!("{}: not YAML: {e}", block.at))?;
    let dir = tempfile::tempdir().unwrap();
    let mut env = Vec::new();
    provide(&value, dir.path(), certs, &mut env);
    let file = dir.path().join("sluice.yaml");
    std::fs::write(&file, &block.text).unwrap();
    let out = sluice()
        .args(["config", "check"])
        .arg(&file)
        .envs(env)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(format!(
            "{}: `sluice config check` refuses this example (mark it <!-- example: fragment --> \
             if it is not a whole configuration):\n{}",
            block.at,
            text(&out.stderr)
        ));
    }
    Ok(match value.get("policies") {
        Some(serde_yaml_ng::Value::Mapping(m)) => m.clone(),
        _ => serde_yaml_ng::Mapping::new(),
    })
}

// ----- the live server ------------------------------------------------------------------

/// `sluice serve` on free ports, killed (by its own id) when dropped.
struct Serve {
    _child: Process,
    base: String,
    _dir: tempfile::TempDir,
}

fn serve(policies: serde_yaml_ng::Mapping) -> Serve {
    let dir = tempfile::tempdir().unwrap();
    let http = sluice_testkit::free_port().unwrap();
    let grpc = sluice_testkit::free_port().unwrap();
    let mut config = serde_yaml_ng::Mapping::new();
    let listen: serde_yaml_ng::Value = serde_yaml_ng::from_str(&format!(
        "{{http: '127.0.0.1:{http}', grpc: '127.0.0.1:{grpc}'}}"
    ))
    .unwrap();
    config.insert("listen".into(), listen);
    config.insert("policies".into(), serde_yaml_ng::Value::Mapping(policies));
    let file = dir.path().join("sluice.yaml");
    std::fs::write(&file, serde_yaml_ng::to_string(&config).unwrap()).unwrap();
    let mut child = Process::serve(&file);
    child.wait_listening(http);
    Serve {
        _child: child,
        base: format!("http://127.0.0.1:{http}"),
        _dir: dir,
    }
}

/// A request of an example: method, path (with its query) and body.
#[derive(Debug)]
struct Request {
    method: String,
    path: String,
    body: Option<String>,
}

/// `METHOD PATH [BODY]`.
fn request_of(text: &str) -> Request {
    let mut parts = text.splitn(3, ' ');
    let method = parts.next().unwrap().to_owned();
    let path = parts.next().unwrap_or_default().to_owned();
    let body = parts.next().map(str::to_owned);
    Request { method, path, body }
}

async fn send(client: &reqwest::Client, base: &str, r: &Request) -> (u16, String) {
    let method = reqwest::Method::from_bytes(r.method.as_bytes()).unwrap();
    let mut req = client.request(method, format!("{base}{}", r.path));
    if let Some(body) = &r.body {
        req = req.body(body.clone());
    }
    let answer = req.send().await.unwrap();
    let status = answer.status().as_u16();
    (status, answer.text().await.unwrap())
}

/// Whether `actual` has the keys and the types of `example`, recursively; with `exact`, no
/// other keys either. A `null` in the example stands for any value (a field that may be
/// null); arrays of objects with a `name` are compared by name, others element by element
/// as far as both go.
fn same_shape(example: &Value, actual: &Value, exact: bool, at: &str) -> Result<(), String> {
    match (example, actual) {
        (Value::Null, _) => Ok(()),
        (Value::Object(e), Value::Object(a)) => {
            for (k, v) in e {
                let Some(got) = a.get(k) else {
                    return Err(format!("{at}.{k}: in the example, not in the answer"));
                };
                same_shape(v, got, exact, &format!("{at}.{k}"))?;
            }
            if exact && let Some(k) = a.keys().find(|k| !e.contains_key(*k)) {
                return Err(format!("{at}.{k}: in the answer, not in the example"));
            }
            Ok(())
        }
        (Value::Array(e), Value::Array(a)) => {
            for (i, item) in e.iter().enumerate() {
                let name = item.get("name").and_then(Value::as_str);
                let got = match name {
                    Some(n) => a
                        .iter()
                        .find(|x| x.get("name").and_then(Value::as_str) == Some(n)),
                    None => a.get(i),
                };
                match (got, name) {
                    (Some(got), _) => same_shape(item, got, exact, &format!("{at}[{i}]"))?,
                    (None, Some(n)) => return Err(format!("{at}: no `{n}` in the answer")),
                    (None, None) => {}
                }
            }
            Ok(())
        }
        (Value::Bool(_), Value::Bool(_))
        | (Value::Number(_), Value::Number(_))
        | (Value::String(_), Value::String(_)) => Ok(()),
        _ => Err(format!(
            "{at}: the example has {example}, the answer {actual}"
        )),
    }
}

// ----- curl -----------------------------------------------------------------------------

/// The commands of a shell block, split into words as a shell would (quotes, `\` at the end
/// of a line), each with the comment lines that follow it.
fn commands(text: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let mut out: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '\\') if chars.peek() == Some(&'\n') => {
                chars.next();
            }
            (None, '#') if !in_word => {
                // A comment: the rest of the line, kept with the command it follows.
                let comment: String =
                    std::iter::from_fn(|| chars.next_if(|&c| c != '\n')).collect();
                let comment = comment.trim().to_owned();
                if !words.is_empty() {
                    out.push((std::mem::take(&mut words), vec![comment]));
                } else if let Some(last) = out.last_mut() {
                    last.1.push(comment);
                }
            }
            (None, ' ' | '\t' | '\n') => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
                if c == '\n' && !words.is_empty() {
                    out.push((std::mem::take(&mut words), Vec::new()));
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    if !words.is_empty() {
        out.push((words, Vec::new()));
    }
    out
}

/// A `curl` command as a request to the live server.
fn curl_request(words: &[String]) -> Request {
    let mut method = None;
    let mut body = None;
    let mut url = None;
    let mut i = 1;
    while i < words.len() {
        match words[i].as_str() {
            "-X" | "--request" => {
                method = Some(words[i + 1].clone());
                i += 1;
            }
            "-d" | "--data" | "--data-raw" => {
                body = Some(words[i + 1].clone());
                i += 1;
            }
            "-H" | "--header" => i += 1,
            w if w.starts_with('-') => {}
            w => url = Some(w.to_owned()),
        }
        i += 1;
    }
    let url = url.expect("a curl without a URL");
    let after_scheme = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
    let path = after_scheme
        .find('/')
        .map_or("/".to_owned(), |i| after_scheme[i..].to_owned());
    Request {
        method: method.unwrap_or_else(|| if body.is_some() { "POST" } else { "GET" }.to_owned()),
        path,
        body,
    }
}

/// `200 {"allowed": true, …, "lease": {…}}` → (200, the JSON with its elisions removed).
fn expected_answer(comment: &str) -> Option<(u16, Option<Value>)> {
    let (status, rest) = comment.split_once(' ').unwrap_or((comment, ""));
    let status: u16 = status.parse().ok()?;
    let json = rest.replace("…, ", "").replace(", …", "");
    let value = (!json.trim().is_empty())
        .then(|| serde_json::from_str(json.trim()).unwrap_or_else(|e| panic!("`{comment}`: {e}")));
    Some((status, value))
}

// ----- the test -------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_yaml_and_json_example_and_every_curl_of_the_docs_works() {
    let certs = sluice_testkit::TlsCerts::generate().unwrap();
    let all: Vec<Block> = markdown_files().iter().flat_map(|f| blocks(f)).collect();
    let mut failures = Vec::new();
    let mut policies: serde_yaml_ng::Mapping =
        match serde_yaml_ng::from_str::<serde_yaml_ng::Value>(sluice_server::config::DEMO)
            .unwrap()
            .get("policies")
        {
            Some(serde_yaml_ng::Value::Mapping(m)) => m.clone(),
            _ => unreachable!("the demo configuration has policies"),
        };
    let mut defined_at: BTreeMap<String, String> = BTreeMap::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();

    // Configurations, rule files, and what is only YAML.
    for b in all.iter().filter(|b| b.lang == "yaml") {
        let marker = b.marker.as_deref().unwrap_or("config");
        let result = if marker == "rls rule file" {
            *counts.entry("rls rule files").or_default() += 1;
            sluice_envoy_rules::RlsConfig::from_files(&[("example.yaml", b.text.as_str())])
                .map(|_| ())
                .map_err(|e| format!("{}: the rls parser refuses this rule file: {e}", b.at))
        } else if marker.starts_with("envoy bootstrap") || marker == "fragment" {
            *counts.entry("YAML syntax only").or_default() += 1;
            serde_yaml_ng::from_str::<serde_yaml_ng::Value>(&b.text)
                .map(|_| ())
                .map_err(|e| format!("{}: not YAML: {e}", b.at))
        } else if marker == "config" {
            *counts.entry("configurations").or_default() += 1;
            check_config(b, &certs).and_then(|found| {
                for (name, policy) in found {
                    let key = name.as_str().unwrap_or_default().to_owned();
                    match policies.get(&name) {
                        Some(p) if *p != policy => {
                            return Err(format!(
                                "{}: policy `{key}` is defined differently at {}; examples \
                                 that share a name must mean the same policy",
                                b.at,
                                defined_at.get(&key).map_or("the demo", String::as_str)
                            ));
                        }
                        Some(_) => {}
                        None => {
                            defined_at.insert(key, b.at.clone());
                            policies.insert(name, policy);
                        }
                    }
                }
                Ok(())
            })
        } else {
            Err(format!(
                "{}: unknown marker `{marker}` on a yaml block",
                b.at
            ))
        };
        if let Err(e) = result {
            failures.push(e);
        }
    }

    // Requests and answers, against one live server of every documented policy.
    let server = serve(policies);
    let client = reqwest::Client::new();
    for b in &all {
        let result: Result<(), String> = match b.lang.as_str() {
            "json" => {
                let parsed: Result<Value, String> =
                    serde_json::from_str(&b.text).map_err(|e| format!("{}: not JSON: {e}", b.at));
                match (b.marker.as_deref(), parsed) {
                    (_, Err(e)) => Err(e),
                    (Some("fragment"), Ok(_)) => {
                        *counts.entry("JSON syntax only").or_default() += 1;
                        Ok(())
                    }
                    (Some(m), Ok(_)) if m.starts_with("request ") => {
                        *counts.entry("JSON requests").or_default() += 1;
                        let mut r = request_of(&m["request ".len()..]);
                        r.body = Some(b.text.clone());
                        let (status, answer) = send(&client, &server.base, &r).await;
                        if status >= 400 {
                            Err(format!("{}: {r:?} answered {status}: {answer}", b.at))
                        } else {
                            Ok(())
                        }
                    }
                    (Some(m), Ok(example)) if m.starts_with("response to ") => {
                        *counts.entry("JSON answers").or_default() += 1;
                        let r = request_of(&m["response to ".len()..]);
                        let (_, answer) = send(&client, &server.base, &r).await;
                        match serde_json::from_str::<Value>(&answer) {
                            Ok(actual) => same_shape(&example, &actual, true, "").map_err(|e| {
                                format!("{}: the answer to {r:?} differs at {e}:\n{answer}", b.at)
                            }),
                            Err(e) => {
                                Err(format!("{}: {r:?} answered no JSON ({e}): {answer}", b.at))
                            }
                        }
                    }
                    _ => Err(format!(
                        "{}: a JSON example without a marker: say what it is \
                         (<!-- example: request POST /v1/… -->, <!-- example: response to \
                         METHOD PATH [BODY] -->, or <!-- example: fragment -->)",
                        b.at
                    )),
                }
            }
            "sh" => {
                let mut result = Ok(());
                for (words, comments) in commands(&b.text) {
                    if words[0] != "curl" {
                        continue;
                    }
                    *counts.entry("curl commands").or_default() += 1;
                    let r = curl_request(&words);
                    let (status, answer) = send(&client, &server.base, &r).await;
                    let expected = comments.iter().find_map(|c| expected_answer(c));
                    let outcome = match expected {
                        Some((want, _)) if want != status => Err(format!(
                            "{}: {r:?} answered {status}, the example says {want}: {answer}",
                            b.at
                        )),
                        Some((_, Some(example))) => serde_json::from_str::<Value>(&answer)
                            .map_err(|e| e.to_string())
                            .and_then(|actual| same_shape(&example, &actual, false, ""))
                            .map_err(|e| {
                                format!("{}: the answer to {r:?} differs at {e}: {answer}", b.at)
                            }),
                        None if status >= 400 => {
                            Err(format!("{}: {r:?} answered {status}: {answer}", b.at))
                        }
                        _ => Ok(()),
                    };
                    if outcome.is_err() {
                        result = outcome;
                        break;
                    }
                }
                result
            }
            _ => Ok(()),
        };
        if let Err(e) = result {
            failures.push(e);
        }
    }
    drop(server);
    eprintln!("checked: {counts:?}");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // The test looks at what it should: a parser that found nothing would pass vacuously.
    for (what, at_least) in [
        ("configurations", 10),
        ("JSON requests", 2),
        ("JSON answers", 5),
        ("curl commands", 4),
        ("rls rule files", 1),
    ] {
        assert!(
            counts.get(what).copied().unwrap_or(0) >= at_least,
            "only {counts:?}"
        );
    }
}

/// The helpers this test relies on read what they should.
#[test]
fn shell_words_curl_requests_and_expected_answers() {
    let cmds = commands(
        "curl -s localhost:8080/v1/acquire -d '{\"policy\": \"r\", \"key\": \"t:7\"}'\n# 200 {\"allowed\": true, …, \"lease\": {\"id\": \"x\"}}\ncurl -s x:1/v1/simulate -d '{\n  \"a\": 1}'\ncargo run \\\n  --release\n",
    );
    assert_eq!(cmds.len(), 3, "{cmds:?}");
    let r = curl_request(&cmds[0].0);
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/v1/acquire")
    );
    assert_eq!(
        r.body.as_deref(),
        Some("{\"policy\": \"r\", \"key\": \"t:7\"}")
    );
    let (status, json) = expected_answer(&cmds[0].1[0]).unwrap();
    assert_eq!(status, 200);
    assert_eq!(json.unwrap()["lease"]["id"], "x");
    assert_eq!(
        curl_request(&cmds[1].0).body.as_deref(),
        Some("{\n  \"a\": 1}")
    );
    assert_eq!(cmds[2].0, ["cargo", "run", "--release"]);
    let r = curl_request(&commands("curl -si -X DELETE http://h:1/v1/keys/a/b\n")[0].0);
    assert_eq!(
        (r.method.as_str(), r.path.as_str(), r.body),
        ("DELETE", "/v1/keys/a/b", None)
    );

    let example: Value = serde_json::json!({"a": 1, "b": [{"name": "x", "c": true}], "n": null});
    let same = serde_json::json!({"a": 2, "b": [{"name": "y", "c": false}, {"name": "x", "c": true}], "n": "s"});
    assert_eq!(same_shape(&example, &same, true, ""), Ok(()));
    let extra = serde_json::json!({"a": 2, "b": [], "n": 1, "z": 0});
    assert!(
        same_shape(&example, &extra, true, "")
            .unwrap_err()
            .contains("b: no `x`")
    );
    assert!(
        same_shape(&serde_json::json!({"a": 1}), &extra, true, "")
            .unwrap_err()
            .contains(".b")
    );
    assert_eq!(
        same_shape(&serde_json::json!({"a": 1}), &extra, false, ""),
        Ok(())
    );
    assert!(same_shape(&serde_json::json!({"a": "1"}), &extra, false, "").is_err());
}
