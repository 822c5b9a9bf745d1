//! What an operator deploys beside the binary, checked against the real `sluice`:
//!
//! - shell completions: `sluice completions bash|zsh|fish` print scripts the shells accept
//!   and that offer the subcommands. zsh and fish are needed under `SLUICE_REQUIRE_TOOLS=1`
//!   (set by `scripts/test`, which installs them); without it a missing shell is one printed
//!   `SKIPPED` line.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::BTreeSet;
use std::process::{Command, Output, Stdio};

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

// ----- completions ----------------------------------------------------------------------

const SUBCOMMANDS: &[&str] = &[
    "serve",
    "check",
    "bench",
    "simulate",
    "config",
    "completions",
];

/// A shell to run, or `None` (with a printed `SKIPPED` line) when it is not installed and
/// `SLUICE_REQUIRE_TOOLS` is not `1`.
fn shell(name: &str) -> Option<&str> {
    let found = Command::new(name)
        .args(["-c", "exit 0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some(name);
    }
    assert!(
        std::env::var("SLUICE_REQUIRE_TOOLS").as_deref() != Ok("1"),
        "{name} is not installed and SLUICE_REQUIRE_TOOLS=1 (scripts/test installs it)"
    );
    eprintln!("SKIPPED: {name} is not installed; its completion script is not run");
    None
}

fn completions(shell_name: &str) -> (tempfile::NamedTempFile, String) {
    let out = sluice(&["completions", shell_name]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let script = text(&out.stdout);
    for sub in SUBCOMMANDS {
        assert!(
            script.contains(sub),
            "the {shell_name} script never names `{sub}`"
        );
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &script).unwrap();
    (file, script)
}

fn run_shell(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn words(s: &str) -> BTreeSet<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

/// bash: the script parses (`bash -n`), and its function completes `sluice ` to the
/// subcommands and `sluice config ` to `check`, as bash's programmable completion calls it.
#[test]
fn bash_completion_offers_the_subcommands() {
    let (file, _) = completions("bash");
    let path = file.path().to_str().unwrap();
    run_shell("bash", &["-n", path]);
    let complete = |line: &str| {
        let script = format!(
            r#"source "$1"
COMP_LINE="{line}"; COMP_POINT=${{#COMP_LINE}}
read -r -a COMP_WORDS <<< "$COMP_LINE"; COMP_WORDS+=("")
COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
spec=$(complete -p sluice); fn=${{spec##*-F }}; fn=${{fn%% *}}
"$fn" sluice "" "${{COMP_WORDS[COMP_CWORD-1]}}"
printf '%s\n' "${{COMPREPLY[@]}}""#
        );
        words(&run_shell("bash", &["-c", &script, "bash", path]))
    };
    let top = complete("sluice ");
    for sub in SUBCOMMANDS {
        assert!(top.contains(*sub), "`sluice ` completes to {top:?}");
    }
    assert!(complete("sluice config ").contains("check"));
}

#[test]
fn zsh_completion_parses() {
    let (file, script) = completions("zsh");
    assert!(script.starts_with("#compdef sluice"), "{script}");
    if let Some(zsh) = shell("zsh") {
        run_shell(zsh, &["-n", file.path().to_str().unwrap()]);
    }
}

/// fish: the script loads, and `complete -C` (fish's own completion of a command line)
/// offers the subcommands.
#[test]
fn fish_completion_offers_the_subcommands() {
    let (file, _) = completions("fish");
    let Some(fish) = shell("fish") else {
        return;
    };
    let path = file.path().to_str().unwrap();
    let offered = run_shell(
        fish,
        &[
            "--no-config",
            "-c",
            &format!("source '{path}'; complete -C 'sluice '"),
        ],
    );
    let first_words: BTreeSet<String> = offered
        .lines()
        .filter_map(|l| l.split('\t').next())
        .map(str::to_owned)
        .collect();
    for sub in SUBCOMMANDS {
        assert!(
            first_words.contains(*sub),
            "`sluice ` completes to {offered}"
        );
    }
}

#[test]
fn completions_refuse_an_unknown_shell() {
    let out = sluice(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("tcsh"), "{}", text(&out.stderr));
}
