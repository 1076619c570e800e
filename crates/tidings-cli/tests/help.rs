//! The command line describes itself: `--version` is the library's version, and every
//! command's `--help` ends with an example a user can copy.

use std::process::Command;

fn tidings(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tidings"))
        .args(args)
        .output()
        .expect("tidings runs");
    assert!(out.status.success(), "tidings {args:?}: {out:?}");
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn the_version_is_the_librarys() {
    assert_eq!(
        tidings(&["--version"]).trim(),
        format!("tidings {}", tidings::VERSION)
    );
}

#[test]
fn every_commands_help_has_an_example() {
    let commands: &[&[&str]] = &[
        &["demo"],
        &["bench"],
        &["log"],
        &["log", "inspect"],
        &["log", "verify"],
        &["log", "dump"],
        &["stream"],
        &["stream", "ls"],
        &["stream", "info"],
        &["consumer"],
        &["consumer", "ls"],
        &["consumer", "info"],
        &["consumer", "seek"],
        &["dlq"],
        &["dlq", "ls"],
        &["dlq", "show"],
        &["dlq", "redrive"],
        &["dlq", "purge"],
    ];
    for command in commands {
        let mut args = command.to_vec();
        args.push("--help");
        let help = tidings(&args);
        let example = help
            .split("Example:\n")
            .nth(1)
            .unwrap_or_else(|| panic!("tidings {command:?} --help has no example:\n{help}"));
        let line = example.lines().next().unwrap_or_default().trim();
        assert!(
            line.starts_with(&format!("tidings {}", command[0])),
            "tidings {command:?}: the example runs that command: {line}"
        );
    }
}
