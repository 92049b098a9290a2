//! The local account a session's file operations run as.
//!
//! A root GridFTP server forks per session and `setuid`s to the account the grid-mapfile
//! names. An endpoint here serves many sessions from one process, so it switches the
//! *file-system* identity of the calling thread instead, for the duration of each file
//! operation: `setfsuid`/`setfsgid` and the supplementary groups are per thread in the kernel
//! (the raw `setgroups` system call is; glibc's wrapper would change every thread). While
//! switched, permission checks, and the owner of files and directories created, are the
//! account's; the file-system capabilities of root (DAC override, chown and the like) are
//! dropped by the kernel until the thread switches back. `store::Root` enters the identity
//! around every operation that resolves a path, so no path is opened as root on a mapped
//! session's behalf; operations on already open descriptors need no identity. A thread
//! created while switched would inherit the account (credentials are copied at `clone`):
//! nothing starts a thread inside a switched operation.
//!
//! Written by hand: no maintained crate switches per-thread file-system credentials.

use std::ffi::CString;
use std::io;

/// An account's file-system identity: uid, primary gid and supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsIdentity {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    groups: Vec<libc::gid_t>,
}

impl FsIdentity {
    /// The account `name` from the system's user database, with its groups; `None` when there
    /// is no such account.
    pub fn lookup(name: &str) -> io::Result<Option<FsIdentity>> {
        let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `passwd` is plain old data; zero is valid for every field.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let mut buf = vec![0 as libc::c_char; 16 << 10];
        // SAFETY: every pointer is to a live local of the size passed.
        let rc = unsafe {
            libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut found)
        };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        if found.is_null() {
            return Ok(None);
        }
        let (uid, gid) = (pw.pw_uid, pw.pw_gid);
        let mut groups: Vec<libc::gid_t> = vec![0; 64];
        loop {
            let mut n = groups.len() as libc::c_int;
            // SAFETY: `groups` holds `n` entries; getgrouplist writes at most that many and sets
            // `n` to the count it needs.
            let rc = unsafe { libc::getgrouplist(c.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
            if rc >= 0 {
                groups.truncate(n.max(0) as usize);
                break;
            }
            if groups.len() >= 1 << 16 {
                return Err(io::Error::other("too many groups"));
            }
            groups.resize((n.max(0) as usize).max(groups.len() * 2), 0);
        }
        Ok(Some(FsIdentity {
            name: name.to_string(),
            uid,
            gid,
            groups,
        }))
    }

    /// Switches the calling thread's file-system identity to this account until the guard is
    /// dropped. Fails (with nothing switched) when the process may not switch (not root).
    pub fn enter(&self) -> io::Result<FsGuard> {
        let saved = current_groups()?;
        set_thread_groups(&self.groups)?;
        // SAFETY: plain system calls on this thread's credentials; -1 only reads the value.
        let (old_gid, old_uid) = unsafe {
            let old_gid = libc::setfsgid(self.gid);
            let old_uid = libc::setfsuid(self.uid);
            (old_gid as u32, old_uid as u32)
        };
        let guard = FsGuard {
            uid: old_uid,
            gid: old_gid,
            groups: saved,
        };
        // setfsuid/setfsgid report failure only by leaving the value unchanged.
        // SAFETY: as above.
        let (now_gid, now_uid) = unsafe {
            (
                libc::setfsgid(u32::MAX) as u32,
                libc::setfsuid(u32::MAX) as u32,
            )
        };
        if now_uid != self.uid || now_gid != self.gid {
            drop(guard);
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "cannot act as account {:?} (uid {}): only an endpoint started as root can",
                    self.name, self.uid
                ),
            ));
        }
        Ok(guard)
    }
}

/// Restores the thread's file-system identity when dropped.
#[must_use = "the identity is switched back when the guard is dropped"]
pub struct FsGuard {
    uid: u32,
    gid: u32,
    groups: Vec<libc::gid_t>,
}

impl Drop for FsGuard {
    fn drop(&mut self) {
        // The uid first: it gives back the capabilities the other two need.
        // SAFETY: plain system calls on this thread's credentials.
        unsafe {
            libc::setfsuid(self.uid);
            libc::setfsgid(self.gid);
        }
        if let Err(e) = set_thread_groups(&self.groups) {
            tracing::error!(error = %e, "could not restore this thread's groups");
        }
    }
}

fn current_groups() -> io::Result<Vec<libc::gid_t>> {
    // SAFETY: with a zero size getgroups only returns the count.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut groups: Vec<libc::gid_t> = vec![0; n as usize];
    // SAFETY: `groups` holds `n` entries.
    let n = unsafe { libc::getgroups(n, groups.as_mut_ptr()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    groups.truncate(n as usize);
    Ok(groups)
}

/// The raw system call: per thread (glibc's `setgroups` changes every thread of the process).
fn set_thread_groups(groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: the pointer and length describe a live slice.
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn unknown_accounts_are_none() {
        assert_eq!(FsIdentity::lookup("no-such-account-here").unwrap(), None);
        let root = FsIdentity::lookup("root").unwrap().unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
    }

    /// As root: inside the guard the thread creates files as the account and may not write
    /// where the account may not; other threads and the thread after the guard are root again.
    #[test]
    fn a_thread_acts_as_the_account_only_inside_the_guard() {
        let Some(nobody) = FsIdentity::lookup("nobody").unwrap() else {
            testkit::skip!("no account nobody");
        };
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            assert!(nobody.enter().is_err(), "only root may switch");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::os::unix::fs::chown(&open, Some(nobody.uid), Some(nobody.gid)).unwrap();
        // A thread started before the switch (threads inherit their creator's credentials).
        let other = dir.path().join("by-other-thread");
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (done, finished) = std::sync::mpsc::channel::<io::Result<()>>();
        let writer = {
            let other = other.clone();
            std::thread::spawn(move || {
                wait.recv().unwrap();
                done.send(std::fs::write(&other, b"x")).unwrap();
            })
        };
        {
            let _g = nobody.enter().unwrap();
            std::fs::write(open.join("mine"), b"x").unwrap();
            let err = std::fs::write(dir.path().join("not-mine"), b"x").unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
            go.send(()).unwrap();
            finished
                .recv()
                .unwrap()
                .expect("the other thread is still root");
        }
        writer.join().unwrap();
        assert_eq!(std::fs::metadata(&other).unwrap().uid(), 0);
        assert_eq!(
            std::fs::metadata(open.join("mine")).unwrap().uid(),
            nobody.uid
        );
        std::fs::write(dir.path().join("root-again"), b"x").unwrap();
        assert_eq!(
            std::fs::metadata(dir.path().join("root-again"))
                .unwrap()
                .uid(),
            0
        );
    }
}
