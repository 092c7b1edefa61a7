//! The Debian packages `scripts/package` builds (into `$GPUTEL_DEB_DIR`;
//! scripts/test builds them first): each holds its program, its unit, its
//! default configuration as a conffile, the sysusers and tmpfiles snippets,
//! and maintainer scripts that create the user and clean up on purge.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use gputel_tests::{provided_path, workspace_root};

/// `$GPUTEL_DEB_DIR`, or `None` (with the reason printed) outside CI.
fn deb_dir() -> Option<PathBuf> {
    provided_path(
        "GPUTEL_DEB_DIR",
        "scripts/test builds the packages with scripts/package and sets it; by hand: \
         scripts/package, then GPUTEL_DEB_DIR=target/debian cargo test",
    )
}

/// The one `<package>_*.deb` in `dir`.
fn deb_of(dir: &Path, package: &str) -> PathBuf {
    let prefix = format!("{package}_");
    let debs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
        })
        .collect();
    assert_eq!(
        debs.len(),
        1,
        "one {package} package in {}: {debs:?}",
        dir.display()
    );
    debs.into_iter().next().expect("one package")
}

fn dpkg_deb(args: &[&str], deb: &Path) -> String {
    let out = Command::new("dpkg-deb")
        .args(args)
        .arg(deb)
        .output()
        .unwrap_or_else(|e| panic!("cannot run dpkg-deb (Debian package dpkg): {e}"));
    assert!(
        out.status.success(),
        "dpkg-deb {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("dpkg-deb prints UTF-8")
}

/// `dpkg-deb --contents`: path → (permissions, owner/group).
fn contents(deb: &Path) -> BTreeMap<String, (String, String)> {
    dpkg_deb(&["--contents"], deb)
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let path = fields
                .last()
                .expect("a path")
                .trim_start_matches('.')
                .to_owned();
            (path, (fields[0].to_owned(), fields[1].to_owned()))
        })
        .collect()
}

#[allow(
    clippy::unwrap_used,
    reason = "called only by tests: a panic is the failure report"
)]
fn check_package(package: &str, configs: &[&str], purged: &str) {
    let Some(dir) = deb_dir() else { return };
    let deb = deb_of(&dir, package);
    let listed = contents(&deb);
    let systemd = workspace_root().join("systemd");
    let mut expected = vec![
        (format!("/usr/bin/{package}"), "-rwxr-xr-x", None),
        (
            format!("/usr/lib/systemd/system/{package}.service"),
            "-rw-r--r--",
            Some(systemd.join(format!("{package}.service"))),
        ),
        (
            format!("/usr/lib/sysusers.d/{package}.conf"),
            "-rw-r--r--",
            Some(systemd.join(format!("{package}.sysusers"))),
        ),
        (
            format!("/usr/lib/tmpfiles.d/{package}.conf"),
            "-rw-r--r--",
            Some(systemd.join(format!("{package}.tmpfile"))),
        ),
    ];
    for config in configs {
        expected.push((
            format!("/etc/gputel/{config}"),
            "-rw-r--r--",
            Some(systemd.join(config)),
        ));
    }
    let unpacked = tempfile::tempdir().unwrap();
    let out = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(unpacked.path())
        .status()
        .unwrap();
    assert!(out.success());
    for (path, mode, source) in &expected {
        let (listed_mode, owner) = listed
            .get(path)
            .unwrap_or_else(|| panic!("{package} lacks {path}; it holds {listed:#?}"));
        assert_eq!(
            (listed_mode.as_str(), owner.as_str()),
            (*mode, "0/0"),
            "{path}"
        );
        if let Some(source) = source {
            assert_eq!(
                std::fs::read(unpacked.path().join(&path[1..])).unwrap(),
                std::fs::read(source).unwrap(),
                "{path} differs from {}",
                source.display()
            );
        }
    }
    // The packaged program runs.
    let program = unpacked.path().join(format!("usr/bin/{package}"));
    let version = Command::new(&program).arg("--version").output().unwrap();
    assert!(version.status.success(), "{}", program.display());
    assert!(
        String::from_utf8_lossy(&version.stdout).starts_with(package),
        "{}",
        String::from_utf8_lossy(&version.stdout)
    );

    // Maintainer scripts: the configuration is a conffile, installation
    // creates the user, and purge removes what only this package uses.
    let control = tempfile::tempdir().unwrap();
    let status = Command::new("dpkg-deb")
        .arg("-e")
        .arg(&deb)
        .arg(control.path())
        .status()
        .unwrap();
    assert!(status.success());
    let read = |name: &str| std::fs::read_to_string(control.path().join(name)).unwrap();
    let conffiles: Vec<String> = configs.iter().map(|c| format!("/etc/gputel/{c}")).collect();
    assert_eq!(read("conffiles").trim(), conffiles.join("\n"));
    assert!(
        read("postinst").contains(&format!(
            "systemd-sysusers ${{DPKG_ROOT:+--root=\"$DPKG_ROOT\"}} {package}.conf"
        )),
        "{}",
        read("postinst")
    );
    let postrm = read("postrm");
    assert!(postrm.contains(purged), "{postrm}");
    assert!(
        postrm.contains(&format!("deb-systemd-helper purge {package}.service")),
        "{postrm}"
    );
    assert!(!postrm.contains("#DEBHELPER#"), "{postrm}");
    let control_file = read("control");
    assert!(
        control_file.contains(&format!("Package: {package}\n")),
        "{control_file}"
    );
    assert!(
        control_file.contains("systemd"),
        "depends on systemd: {control_file}"
    );
}

#[test]
fn the_agent_package_holds_program_unit_config_and_snippets() {
    check_package(
        "gputel-agent",
        &["agent.toml"],
        "rm -rf /var/lib/gputel/spool",
    );
}

#[test]
fn the_collector_package_holds_program_unit_config_and_snippets() {
    check_package(
        "gputel-collector",
        &["collector.toml", "alerts.toml"],
        "rm -rf /var/lib/gputel/wal",
    );
}
