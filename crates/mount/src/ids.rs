//! Owners and groups: the grid names them, the kernel numbers them. The mounting user's own
//! grid name is their uid (and their entries' unknown groups their gid); other names are the
//! local account or group of that name, or `nobody` (65534) when there is none. Looked up
//! with the reentrant libc calls (no crate wraps them without pulling in a larger one) and
//! remembered.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::sync::Mutex;

pub const NOBODY: u32 = 65534;

pub struct Ids {
    /// The mounting user's grid name and local ids.
    pub me: String,
    pub uid: u32,
    pub gid: u32,
    users: Mutex<HashMap<String, u32>>,
    groups: Mutex<HashMap<String, u32>>,
}

impl Ids {
    pub fn new(me: String) -> Self {
        // SAFETY: getuid and getgid cannot fail and touch no memory of ours.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Self {
            me,
            uid,
            gid,
            users: Mutex::new(HashMap::new()),
            groups: Mutex::new(HashMap::new()),
        }
    }

    pub fn uid_of(&self, owner: &str) -> u32 {
        if owner == self.me {
            return self.uid;
        }
        let mut m = self.users.lock().expect("ids lock");
        *m.entry(owner.to_string())
            .or_insert_with(|| user_id(owner).unwrap_or(NOBODY))
    }

    pub fn gid_of(&self, group: &str, owner: &str) -> u32 {
        let found = {
            let mut m = self.groups.lock().expect("ids lock");
            *m.entry(group.to_string())
                .or_insert_with(|| group_id(group).unwrap_or(NOBODY))
        };
        if found == NOBODY && owner == self.me {
            self.gid
        } else {
            found
        }
    }

    /// The grid name of local user `uid` (the mounting user's is their grid name).
    pub fn user_name(&self, uid: u32) -> Option<String> {
        if uid == self.uid {
            return Some(self.me.clone());
        }
        name_of_uid(uid)
    }

    pub fn group_name(&self, gid: u32) -> Option<String> {
        name_of_gid(gid)
    }
}

fn user_id(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16384];
    // SAFETY: a zeroed passwd is a valid out-parameter; buf outlives the call and its length is
    // passed; the result pointer is only read when getpwnam_r says it points at `pw`.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        let r = libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut out);
        (r == 0 && !out.is_null()).then_some(pw.pw_uid)
    }
}

fn group_id(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16384];
    // SAFETY: as in `user_id`.
    unsafe {
        let mut gr: libc::group = std::mem::zeroed();
        let mut out: *mut libc::group = std::ptr::null_mut();
        let r = libc::getgrnam_r(c.as_ptr(), &mut gr, buf.as_mut_ptr(), buf.len(), &mut out);
        (r == 0 && !out.is_null()).then_some(gr.gr_gid)
    }
}

fn name_of_uid(uid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 16384];
    // SAFETY: as in `user_id`; the name is copied out before `buf` is dropped.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        let r = libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out);
        (r == 0 && !out.is_null())
            .then(|| CStr::from_ptr(pw.pw_name).to_string_lossy().into_owned())
    }
}

fn name_of_gid(gid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 16384];
    // SAFETY: as in `name_of_uid`.
    unsafe {
        let mut gr: libc::group = std::mem::zeroed();
        let mut out: *mut libc::group = std::ptr::null_mut();
        let r = libc::getgrgid_r(gid, &mut gr, buf.as_mut_ptr(), buf.len(), &mut out);
        (r == 0 && !out.is_null())
            .then(|| CStr::from_ptr(gr.gr_name).to_string_lossy().into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn my_grid_name_is_me_and_unknown_names_are_nobody() {
        let ids = Ids::new("alice-grid".into());
        assert_eq!(ids.uid_of("alice-grid"), ids.uid);
        assert_eq!(ids.uid_of("no-such-user-here"), NOBODY);
        assert_eq!(ids.uid_of("root"), 0);
        // My entries' groups that are not local groups are my group.
        assert_eq!(ids.gid_of("no-such-group", "alice-grid"), ids.gid);
        assert_eq!(ids.gid_of("no-such-group", "bob"), NOBODY);
        assert_eq!(ids.user_name(ids.uid).as_deref(), Some("alice-grid"));
        assert_eq!(name_of_uid(0).as_deref(), Some("root"));
    }
}
