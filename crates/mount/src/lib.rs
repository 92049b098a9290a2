//! `haul mount`: a grid directory as a local file system (FUSE), for programs that only know
//! POSIX files. Names and attributes come from the metadata server (`fs`), file data from the
//! storage nodes in extents fetched ahead of a sequential reader (`readahead`, `remote`) into
//! a bounded block cache (`cache`: in memory, `memstore`, or on disk); files written are spooled locally and become grid files
//! when closed. Every call acts as the mounting user's certificate: the metadata server checks
//! each operation, and only the mounting user (and root) can enter the mount.

pub mod cache;
pub mod dirlock;
pub mod errno;
mod fs;
pub mod ids;
pub mod inodes;
pub mod memstore;
pub mod readahead;
pub mod remote;

use grid::MetaClient;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use transfer::TransferError;
use transfer::client::CopyOptions;

/// How to mount.
pub struct MountOptions {
    /// The grid directory that becomes the mount's root.
    pub root: String,
    pub mountpoint: PathBuf,
    /// Reads prefer this site's replicas; new files go to its nodes.
    pub site: Option<String>,
    /// A block cache on disk, kept across mounts; `None`: extents are held in memory (and
    /// write spools go to a private directory removed at unmount).
    pub cache_dir: Option<PathBuf>,
    pub cache_size: u64,
    /// Read-ahead of a sequential reader at most.
    pub read_ahead: u64,
    /// How long attributes and names are believed without asking again.
    pub attr_ttl: Duration,
    /// Deadline of each call to the metadata server.
    pub meta_timeout: Duration,
    /// Data sessions at once, all files together.
    pub fetch_sessions: usize,
    /// Data sessions (reads and the uploads of closed files).
    pub copy: CopyOptions,
    /// FUSE request threads.
    pub threads: usize,
    /// Every file through the kernel's page cache (no direct I/O).
    pub page_cache: bool,
    /// Let the kernel write spools itself where it can (FUSE passthrough); `false`: every
    /// write comes through this process.
    pub passthrough: bool,
}

/// Mounts `opts.root` at `opts.mountpoint` and serves it until it is unmounted (`umount`,
/// `fusermount3 -u`) or `stop` resolves (Ctrl-C, SIGTERM), then unmounts. Runs the FUSE
/// threads itself; `meta` is connected as the user.
pub async fn serve(
    meta: MetaClient,
    opts: MountOptions,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), TransferError> {
    let who = meta.who_am_i().await?;
    let top = meta.stat(&opts.root).await?;
    if !top.is_dir {
        return Err(TransferError::usage(format!(
            "{}: not a directory; mount a grid directory",
            opts.root
        )));
    }
    let mp = &opts.mountpoint;
    match std::fs::metadata(mp) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(TransferError::usage(format!(
                "{}: the mount point must be a directory",
                mp.display()
            )));
        }
        Err(e) => {
            return Err(TransferError::not_found(format!(
                "{}: cannot use it as the mount point: {e}",
                mp.display()
            )));
        }
    }
    // The cache: the one named, or a private one that goes with the mount. Either is locked
    // for the mount's life (`dirlock`): a second mount refuses a cache directory in use, and
    // the private directories of this user's mounts that died (kill -9) are removed.
    let private;
    // `None` where the file system has no `flock` (then nothing is locked or reaped).
    let _dir_lock: Option<dirlock::DirLock>;
    let no_locks = |dir: &Path, e: &std::io::Error| {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot lock the mount's directory (no flock here?): running without the lock; another mount could share it, and dead mounts' spools are not removed");
    };
    let cache_root: PathBuf = match &opts.cache_dir {
        Some(d) => {
            std::fs::create_dir_all(d)
                .map_err(|e| TransferError::local(format!("cache {}: {e}", d.display())))?;
            _dir_lock = match dirlock::DirLock::take_shared(d) {
                Ok(Some(l)) => Some(l),
                Ok(None) => {
                    return Err(TransferError::new(
                        wire::error::ErrorKind::Busy,
                        format!(
                            "cache {}: another haul mount is using it; give each mount its own --cache",
                            d.display()
                        ),
                    ));
                }
                Err(e) => {
                    no_locks(d, &e);
                    None
                }
            };
            d.clone()
        }
        None => {
            let prefix = dirlock::host_prefix();
            private = tempfile::Builder::new()
                .prefix(&prefix)
                .tempdir()
                .map_err(|e| TransferError::local(format!("cannot make a cache directory: {e}")))?;
            _dir_lock = match dirlock::DirLock::take_new(private.path()) {
                Ok(l) => Some(l),
                Err(e) => {
                    no_locks(private.path(), &e);
                    None
                }
            };
            if _dir_lock.is_some()
                && let Some(tmp) = private.path().parent()
            {
                for gone in dirlock::reap_dead(tmp, private.path(), &prefix) {
                    tracing::info!(dir = %gone.display(), "removed the spool directory of a mount that ended without unmounting");
                }
            }
            private.path().to_path_buf()
        }
    };
    let cache = match &opts.cache_dir {
        Some(_) => cache::Cache::open(&cache_root, opts.cache_size)
            .map_err(|e| TransferError::local(format!("cache {}: {e}", cache_root.display())))?,
        // Extents in memory; the private directory holds only write spools.
        None => cache::Cache::in_memory(&cache_root, opts.cache_size),
    };
    let spool_dir = cache_root.join("spool");
    // Spools of an earlier mount that ended abruptly are not resumed.
    let _ = std::fs::remove_dir_all(&spool_dir);
    std::fs::create_dir_all(&spool_dir)
        .map_err(|e| TransferError::local(format!("{}: {e}", spool_dir.display())))?;
    let fetcher = Arc::new(remote::Fetcher {
        meta: meta.clone(),
        rt: tokio::runtime::Handle::current(),
        copy: opts.copy.clone(),
        site: opts.site.clone(),
        cache: Arc::new(cache),
        tuning: readahead::Tuning::with_window(opts.read_ahead),
        slots: Arc::new(tokio::sync::Semaphore::new(opts.fetch_sessions.max(1))),
        opening: tokio::sync::Mutex::new(()),
    });
    let mut grid_copy = opts.copy.clone();
    grid_copy.range = None;
    grid_copy.recursive = false;
    // The control pool is for the fetches' downloads; an upload on a reused connection would
    // get no hello to plan its streams from.
    grid_copy.control_pool = None;
    let settings = fs::Settings {
        root: opts.root.clone(),
        attr_ttl: opts.attr_ttl,
        meta_timeout: opts.meta_timeout,
        spool_dir: spool_dir.clone(),
        page_cache: opts.page_cache,
        passthrough: opts.passthrough,
        grid: grid::copy::GridOptions {
            copy: grid_copy,
            site: opts.site.clone(),
            overwrite: true,
            max_sessions: 1,
            dest_is_name: true,
            // Each upload gives its spool's record (`send_spool`).
            source_crcs: None,
        },
    };
    let filesystem = fs::MountFs::new(fetcher, settings, who.user.clone());
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(format!("haul://{}{}", meta.addr, opts.root)),
        fuser::MountOption::Subtype("haul".into()),
        fuser::MountOption::NoSuid,
        fuser::MountOption::NoDev,
    ];
    config.n_threads = Some(opts.threads.max(1));
    let mp2 = mp.clone();
    // Mounting and serving block: they run on their own thread, the runtime serves the calls
    // the FUSE threads make.
    let session =
        tokio::task::spawn_blocking(move || fuser::spawn_mount(filesystem, &mp2, &config))
            .await
            .map_err(|e| TransferError::local(format!("mount: {e}")))?
            .map_err(|e| {
                TransferError::permission_denied(format!(
                    "cannot mount on {}: {e} (is /dev/fuse there, and fuse3 installed?)",
                    mp.display()
                ))
            })?;
    tracing::info!(root = %opts.root, mountpoint = %mp.display(), user = %who.user, "mounted");
    println!(
        "mounted haul://{}{} on {}",
        meta.addr,
        opts.root,
        mp.display()
    );
    let ended = wait_unmounted(mp.clone());
    tokio::select! {
        _ = stop => {
            tracing::info!(mountpoint = %mp.display(), "unmounting");
        }
        _ = ended => {
            tracing::info!(mountpoint = %mp.display(), "unmounted");
        }
    }
    // Dropping the session unmounts (if still mounted) and ends the FUSE threads.
    tokio::task::spawn_blocking(move || drop(session))
        .await
        .map_err(|e| TransferError::local(format!("unmount: {e}")))?;
    Ok(())
}

/// Resolves when `mp` is no longer a mount point (someone ran `umount` on it).
async fn wait_unmounted(mp: PathBuf) {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if !is_mounted(&mp) {
            return;
        }
    }
}

/// Whether `/proc/self/mountinfo` lists `mp` as a mount point (paths compared as bytes: a
/// name need not be UTF-8).
pub fn is_mounted(mp: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(canon) = std::fs::canonicalize(mp) else {
        return false;
    };
    let Ok(info) = std::fs::read("/proc/self/mountinfo") else {
        return false;
    };
    let want = canon.as_os_str().as_bytes();
    info.split(|b| *b == b'\n')
        .filter_map(|l| l.split(|b| *b == b' ').nth(4))
        .any(|p| unescape_mount_path(p) == want)
}

/// mountinfo writes space, tab, newline and backslash in paths as octal escapes (`\040`).
fn unescape_mount_path(p: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(p.len());
    let mut i = 0;
    while i < p.len() {
        if p[i] == b'\\'
            && let Some(d) = p.get(i + 1..i + 4)
            && d.iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
            i += 4;
            continue;
        }
        out.push(p[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn mount_paths_are_unescaped() {
        assert_eq!(super::unescape_mount_path(b"/a\\040b"), b"/a b");
        assert_eq!(super::unescape_mount_path(b"/plain"), b"/plain");
        assert_eq!(
            super::unescape_mount_path("/é\\134".as_bytes()),
            "/é\\".as_bytes()
        );
    }
}
