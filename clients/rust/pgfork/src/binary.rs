//! Which `pgfork` binary a test run starts when no server is configured, in
//! this order:
//!
//! 1. `$PGFORK_BIN`, when set (a file, or an error naming it);
//! 2. the binary of the platform crate `pgfork-bin-<os>-<arch>` (Linux and
//!    macOS, x86_64 and aarch64), which cargo installs with this crate: its
//!    path comes from build.rs (`PGFORK_CRATE_BIN`). Cargo keeps the file's
//!    executable bit when it unpacks the crate; where a tool did not, the
//!    binary is copied to `<state dir>/bin/pgfork` (the state directory is
//!    this user's alone, [`private_dir`]) with the bit set, never made
//!    executable where another user could change it;
//! 3. `pgfork` on PATH.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use crate::autostart::private_dir;
use crate::error::{Error, Result};

/// The platform crate's binary and the crate's name, as build.rs found
/// them (None on a platform without one).
const CRATE_BIN: Option<(&str, &str)> = match (option_env!("PGFORK_CRATE_BIN"), option_env!("PGFORK_CRATE_BIN_NAME")) {
    (Some(path), Some(name)) => Some((path, name)),
    _ => None,
};

/// The binary to start (see the module's docs); `state_dir` is the run's
/// private state directory.
pub(crate) fn find(state_dir: &Path) -> Result<PathBuf> {
    find_in(
        std::env::var_os("PGFORK_BIN"),
        CRATE_BIN.map(|(path, _)| Path::new(path)),
        std::env::var_os("PATH"),
        state_dir,
    )
}

/// [`find`] with `$PGFORK_BIN`, the platform crate's binary and `$PATH` given.
fn find_in(
    pgfork_bin: Option<OsString>,
    crate_bin: Option<&Path>,
    path: Option<OsString>,
    state_dir: &Path,
) -> Result<PathBuf> {
    if let Some(b) = pgfork_bin.filter(|b| !b.is_empty()) {
        let p = PathBuf::from(&b);
        if !p.is_file() {
            return Err(Error::ServeStart(format!(
                "pgfork: PGFORK_BIN={} is not a file: point it at the pgfork binary, or unset it to use the \
                 binary of the pgfork-bin-* crate or pgfork on PATH",
                p.display()
            )));
        }
        return Ok(p);
    }
    if let Some(p) = crate_bin.filter(|p| p.is_file()) {
        if is_executable(p) {
            return Ok(p.to_path_buf());
        }
        return executable_copy(p, state_dir);
    }
    if let Some(path) = path {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("pgfork");
            if is_executable(&p) {
                return Ok(p);
            }
        }
    }
    Err(Error::ServeStart(no_binary_message()))
}

/// `src` copied to `<state_dir>/bin/pgfork` with mode 0755: written to a
/// new file beside it (created here, so no one else's), then renamed over
/// the last copy.
fn executable_copy(src: &Path, state_dir: &Path) -> Result<PathBuf> {
    let dir = private_dir(&state_dir.join("bin"))?;
    let dest = dir.join("pgfork");
    let tmp = dir.join(format!(".pgfork.tmp-{}", std::process::id()));
    let err = |e: std::io::Error| {
        Error::ServeStart(format!(
            "pgfork: {} is not executable and cannot be copied to {} with the executable bit: {e}; \
             set PGFORK_BIN to a pgfork binary, or make that file executable",
            src.display(),
            dest.display()
        ))
    };
    let _ = std::fs::remove_file(&tmp);
    let mut o = OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o755);
    let copied = o.open(&tmp).and_then(|mut out| {
        let mut input = std::fs::File::open(src)?;
        std::io::copy(&mut input, &mut out)?;
        out.sync_all()
    });
    if let Err(e) = copied.and_then(|_| std::fs::rename(&tmp, &dest)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    Ok(dest)
}

fn is_executable(p: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }
    #[cfg(not(unix))]
    {
        p.is_file()
    }
}

/// The error when there is no server and no binary to start one: how cargo
/// users get the binary.
pub(crate) fn no_binary_message() -> String {
    let os = match std::env::consts::OS {
        "macos" => "darwin",
        other => other,
    };
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let from_crate = match CRATE_BIN {
        Some((path, name)) => format!(
            "the crate {name} has no binary at {path} (a checkout's copy of the crate carries none: the released \
             crate does)"
        ),
        None => "no pgfork-bin-* crate carries a binary for this platform (they exist for Linux and macOS, \
                 x86_64 and aarch64)"
            .to_string(),
    };
    format!(
        "pgfork: no pgfork server is configured (PGFORK_URL) and no pgfork binary was found to start one: \
         PGFORK_BIN is unset, {from_crate}, and there is no pgfork on PATH. Get the release tarball \
         pgfork-<version>-{os}-{arch}.tar.gz (https://github.com/pgfork/pgfork/releases), and put its \
         pgfork on PATH or set PGFORK_BIN to it; or set PGFORK_URL (and PGFORK_TOKEN) to a running server"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_binary_message_names_the_tarball_and_both_ways() {
        let m = no_binary_message();
        assert!(m.contains("pgfork-<version>-"), "{m}");
        assert!(
            m.contains(".tar.gz") && m.contains("PGFORK_BIN") && m.contains("PATH"),
            "{m}"
        );
        // The tarball by Go's names.
        assert!(!m.contains("macos-") && !m.contains("-x86_64.tar"), "{m}");
    }

    #[test]
    fn the_platform_crate_is_known_here() {
        // This workspace builds on Linux and macOS, x86_64 or aarch64: build.rs
        // found the platform crate (whose checkout copy has no binary).
        let (path, name) = CRATE_BIN.expect("build.rs set PGFORK_CRATE_BIN");
        let os = if cfg!(target_os = "macos") { "macos" } else { "linux" };
        assert_eq!(name, format!("pgfork-bin-{os}-{}", std::env::consts::ARCH));
        assert!(path.ends_with(&format!("{name}/bin/pgfork")), "{path}");
    }

    #[test]
    #[cfg(unix)]
    fn pgfork_bin_then_the_crate_then_path() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("pgfork-find-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let state = private_dir(&dir.join("state")).unwrap();
        let exe = |p: &Path| {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p.to_path_buf()
        };
        let explicit = exe(&dir.join("explicit/pgfork"));
        let from_crate = exe(&dir.join("crate/bin/pgfork"));
        let on_path = exe(&dir.join("path2/pgfork"));
        let path = std::env::join_paths([dir.join("path1"), dir.join("path2")]).unwrap();
        let find =
            |bin: Option<&Path>, krate: Option<&Path>| find_in(bin.map(Into::into), krate, Some(path.clone()), &state);
        assert_eq!(find(Some(&explicit), Some(&from_crate)).unwrap(), explicit);
        assert_eq!(find(None, Some(&from_crate)).unwrap(), from_crate);
        // An empty PGFORK_BIN is unset.
        assert_eq!(
            find_in(Some("".into()), Some(&from_crate), None, &state).unwrap(),
            from_crate
        );
        // A crate without its binary (a checkout's), or no crate: PATH.
        assert_eq!(find(None, Some(&dir.join("checkout/bin/pgfork"))).unwrap(), on_path);
        assert_eq!(find(None, None).unwrap(), on_path);
        // A crate's binary without the executable bit: the private copy.
        std::fs::set_permissions(&from_crate, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(find(None, Some(&from_crate)).unwrap(), state.join("bin/pgfork"));
        let e = find(Some(&dir.join("missing")), Some(&from_crate))
            .unwrap_err()
            .to_string();
        assert!(e.contains("PGFORK_BIN=") && e.contains("is not a file"), "{e}");
        let e = find_in(None, None, None, &state).unwrap_err().to_string();
        assert!(e.contains("no pgfork binary was found"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[cfg(unix)]
    fn a_binary_without_the_executable_bit_is_run_from_a_private_copy() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("pgfork-binary-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("pgfork");
        std::fs::write(&src, "#!/bin/sh\necho copied\n").unwrap();
        std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o644)).unwrap();
        let state = private_dir(&dir.join("state")).unwrap();
        let copy = executable_copy(&src, &state).unwrap();
        assert_eq!(copy, state.join("bin").join("pgfork"));
        assert!(is_executable(&copy));
        let out = std::process::Command::new(&copy).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "copied\n");
        // Again (the next run): replaced.
        std::fs::write(&src, "#!/bin/sh\necho again\n").unwrap();
        let copy = executable_copy(&src, &state).unwrap();
        let out = std::process::Command::new(&copy).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "again\n");
        // A bin directory others can write is refused.
        std::fs::set_permissions(state.join("bin"), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = executable_copy(&src, &state).unwrap_err().to_string();
        assert!(e.contains("is not this user's alone"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
