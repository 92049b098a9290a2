//! Which cache and spool directories belong to a running mount. Each mount holds an exclusive
//! `flock` on `DIR/lock` for its life; the kernel drops it when the process dies, `kill -9`
//! included. So a second mount refuses a cache directory (`--cache DIR`) whose lock is held
//! (it would otherwise clear the first one's spools of files not yet closed), and a mount
//! starting removes the private directories (`haul-mount-*` in the temporary directory) of
//! this user's mounts that died without cleaning up: those whose lock it can take. Their
//! spools hold the data of files that were never closed, which no one can publish any more.
//!
//! Written on `flock(2)` directly: the lock must be tied to the open file and released by the
//! kernel on any death, and the two uses here are a few lines.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// The name of the lock file in a locked directory.
const LOCK: &str = "lock";

/// The prefix of a mount's private directory in the temporary directory.
pub const PRIVATE_PREFIX: &str = "haul-mount-";

/// The prefix of the private directories of mounts on this host: [`PRIVATE_PREFIX`] and the
/// host's name. Only these are reaped: on a temporary directory shared by several hosts,
/// where `flock` may be local to each, another host's live mount would look dead.
pub fn host_prefix() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host: String = host
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        .collect();
    format!("{PRIVATE_PREFIX}{host}-")
}

/// A held directory lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

/// Takes the lock of an open lock file without waiting; `Ok(false)` when another open file
/// (a running mount) holds it.
fn try_flock(f: &File) -> io::Result<bool> {
    // SAFETY: flock(2) on a descriptor this function borrows; no memory is passed.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// How a lock file is opened: the user's alone, never following a link planted there.
fn lock_options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    o
}

/// Opens `dir/lock` (created if `create`).
fn open_lock(dir: &Path, create: bool) -> io::Result<File> {
    lock_options().create(create).open(dir.join(LOCK))
}

impl DirLock {
    /// Takes the lock of a directory shared across mounts (a `--cache DIR`); `Ok(None)` when
    /// a running mount holds it.
    pub fn take_shared(dir: &Path) -> io::Result<Option<DirLock>> {
        let f = open_lock(dir, true)?;
        Ok(try_flock(&f)?.then_some(DirLock { _file: f }))
    }

    /// Locks a directory this mount has just made for itself. The lock file appears under its
    /// name already locked (made under another name, locked, then renamed), so a mount
    /// reaping dead directories at the same moment never finds it free.
    pub fn take_new(dir: &Path) -> io::Result<DirLock> {
        let fresh = dir.join(".lock-new");
        let f = lock_options().create_new(true).open(&fresh)?;
        if !try_flock(&f)? {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "a lock file made just now is locked by another process",
            ));
        }
        std::fs::rename(&fresh, dir.join(LOCK))?;
        Ok(DirLock { _file: f })
    }
}

/// Removes this user's private mount directories in `tmp` that no running mount holds, except
/// `mine`; the paths removed. Only real directories (not links), owned by the effective user,
/// named `prefix*` ([`host_prefix`]), with a lock file that can be taken: a directory without
/// one is a mount still starting (or one from before locks), and stays.
pub fn reap_dead(tmp: &Path, mine: &Path, prefix: &str) -> Vec<std::path::PathBuf> {
    // SAFETY: geteuid has no memory effects.
    let me = unsafe { libc::geteuid() };
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return Vec::new();
    };
    let mut gone = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if path == mine || !e.file_name().to_string_lossy().starts_with(prefix) {
            continue;
        }
        // `symlink_metadata`: a link named like a mount directory is left alone.
        let Ok(m) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !m.file_type().is_dir() || m.uid() != me {
            continue;
        }
        let Ok(f) = open_lock(&path, false) else {
            continue;
        };
        if matches!(try_flock(&f), Ok(true)) && std::fs::remove_dir_all(&path).is_ok() {
            gone.push(path);
        }
    }
    gone
}

#[cfg(test)]
mod tests {
    use super::*;

    fn private(tmp: &Path, name: &str) -> std::path::PathBuf {
        let d = tmp.join(format!("{PRIVATE_PREFIX}{name}"));
        std::fs::create_dir(&d).unwrap();
        std::fs::create_dir(d.join("spool")).unwrap();
        std::fs::write(d.join("spool").join("1"), b"unclosed").unwrap();
        d
    }

    /// A shared directory's lock is refused while held and free once its holder is dropped
    /// (as when the mount holding it dies).
    #[test]
    fn a_held_cache_directory_is_refused_until_its_holder_goes() {
        let tmp = tempfile::tempdir().unwrap();
        let first = DirLock::take_shared(tmp.path()).unwrap().expect("free");
        assert!(DirLock::take_shared(tmp.path()).unwrap().is_none());
        drop(first);
        assert!(DirLock::take_shared(tmp.path()).unwrap().is_some());
    }

    /// Reaping removes the dead mounts' directories and only those: not a live one, not one
    /// still starting (no lock file), not the caller's own, not a planted link to a dead one's
    /// directory, not other names.
    #[test]
    fn reaping_removes_only_directories_no_running_mount_holds() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let dead = private(t, "dead");
        drop(DirLock::take_new(&dead).unwrap());
        let live = private(t, "live");
        let _held = DirLock::take_new(&live).unwrap();
        let starting = private(t, "starting");
        let mine = private(t, "mine");
        drop(DirLock::take_new(&mine).unwrap());
        let elsewhere = tempfile::tempdir().unwrap();
        let target = private(elsewhere.path(), "target");
        drop(DirLock::take_new(&target).unwrap());
        let link = t.join(format!("{PRIVATE_PREFIX}link"));
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let other = t.join("other-dead");
        std::fs::create_dir(&other).unwrap();
        drop(DirLock::take_new(&other).unwrap());

        let gone = reap_dead(t, &mine, PRIVATE_PREFIX);
        assert_eq!(gone, vec![dead.clone()]);
        assert!(!dead.exists());
        for kept in [&live, &starting, &mine, &target, &other] {
            assert!(
                kept.join("spool").join("1").exists() || kept == &other,
                "{kept:?}"
            );
        }
        assert!(other.exists());
        assert!(std::fs::symlink_metadata(&link).is_ok());
    }

    /// A lock file replaced by a link is not followed.
    #[test]
    fn a_planted_lock_link_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let d = tmp.path().join("cache");
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::symlink(&victim, d.join(LOCK)).unwrap();
        let e = DirLock::take_shared(&d).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    }
}
