//! Where files come from and go to: the user's own file system (`Root::Ambient`) or an
//! exported tree that no path may leave (`Root::Confined`, built on cap-std: `..`, absolute
//! paths and symlinks pointing outside are refused by the kernel-level resolution, not by
//! string checks alone).
//!
//! On the sending side it enumerates a file or a tree into [`SourceEntry`]s. On the receiving
//! side it owns the life of a destination file: a temporary `.NAME.haul-part` beside the final
//! name with its restart ledger `.NAME.haul-ledger`, checkpoints (sync, then ledger written
//! atomically), and the commit (sync, mode and mtime, rename, sync the directory). Nothing is
//! ever written under the final name until the data has verified.

use crate::error::{EscapesRoot, dest_io_info, escapes_root, io_info};
use crate::identity::{FsGuard, FsIdentity};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};
use wire::control::EntryInfo;
use wire::data::{EntryKind, Timestamp, validate_relative_path};
use wire::error::{ErrorInfo, ErrorKind};
use wire::ranges::RangeSet;

/// A file system root.
pub enum Root {
    /// The caller's own paths, relative to the working directory or absolute.
    Ambient,
    /// An exported directory; every path is resolved beneath it.
    Confined {
        dir: std::sync::Arc<cap_std::fs::Dir>,
        display: PathBuf,
        /// The account every path operation runs as (a session mapped to a local account by
        /// an endpoint started as root); `None`: the process's own.
        identity: Option<std::sync::Arc<FsIdentity>>,
    },
}

/// File metadata, whichever root it came from.
#[derive(Clone, Copy, Debug)]
pub struct Meta {
    pub is_dir: bool,
    pub is_file: bool,
    pub len: u64,
    pub mode: u32,
    pub mtime: Timestamp,
    pub dev: u64,
    pub ino: u64,
}

/// Sets the flags of an [`OpenMode`] on `$o`, a std or a cap-std `OpenOptions` (with its
/// `OpenOptionsExt` in scope). A macro because the two types share their methods but no trait.
macro_rules! open_flags {
    ($o:ident, $mode:expr) => {
        match $mode {
            OpenMode::Read => $o.read(true),
            OpenMode::CreateNew => $o
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(NOFOLLOW),
            OpenMode::Existing => $o.read(true).write(true).custom_flags(NOFOLLOW),
        }
    };
}

impl Meta {
    fn from_std(m: std::fs::Metadata) -> Self {
        Self::from_cap(&cap_std::fs::Metadata::from_just_metadata(m))
    }

    fn from_cap(m: &cap_std::fs::Metadata) -> Self {
        use cap_std::fs::MetadataExt;
        Self {
            is_dir: m.is_dir(),
            is_file: m.is_file(),
            len: m.len(),
            mode: m.mode() & 0o7777,
            mtime: Timestamp {
                secs: m.mtime(),
                nanos: m.mtime_nsec() as u32,
            },
            dev: m.dev(),
            ino: m.ino(),
        }
    }

    pub fn info(&self) -> EntryInfo {
        EntryInfo {
            is_dir: self.is_dir,
            size: self.len,
            mode: self.mode,
            mtime: self.mtime,
        }
    }
}

/// How to open a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    Read,
    /// A new file, read-write, private to its owner (0600), created exclusively: it fails if
    /// anything already has the name, a symlink (even a dangling one) included
    /// (`O_CREAT|O_EXCL|O_NOFOLLOW`). Temporary files are made this way, so that a user who
    /// can write the destination directory cannot plant a link that redirects them.
    CreateNew,
    /// An existing file, read-write, not through a symlink in its last component
    /// (`O_NOFOLLOW`: a symlink fails with ELOOP).
    Existing,
}

/// `O_NOFOLLOW` for the std and cap-std `OpenOptions`.
const NOFOLLOW: i32 = libc::O_NOFOLLOW;

impl Root {
    /// Exports `path`; it must be an existing directory.
    pub fn confined(path: &Path) -> io::Result<Self> {
        let dir = cap_std::fs::Dir::open_ambient_dir(path, cap_std::ambient_authority())?;
        Ok(Root::Confined {
            dir: std::sync::Arc::new(dir),
            display: path.to_path_buf(),
            identity: None,
        })
    }

    /// The same tree, every path operation done as `identity` (see [`crate::identity`]).
    pub fn as_identity(&self, identity: std::sync::Arc<FsIdentity>) -> Root {
        match self {
            Root::Ambient => Root::Ambient,
            Root::Confined { dir, display, .. } => Root::Confined {
                dir: dir.clone(),
                display: display.clone(),
                identity: Some(identity),
            },
        }
    }

    /// The account path operations run as, when not the process's own.
    fn identity(&self) -> Option<&FsIdentity> {
        match self {
            Root::Confined {
                identity: Some(id), ..
            } => Some(id),
            _ => None,
        }
    }

    /// Switches this thread to the root's account for one operation.
    fn act(&self) -> io::Result<Option<FsGuard>> {
        self.identity().map(FsIdentity::enter).transpose()
    }

    pub fn is_confined(&self) -> bool {
        matches!(self, Root::Confined { .. })
    }

    fn check(&self, rel: &Path) -> io::Result<()> {
        if let Root::Confined { .. } = self {
            for c in rel.components() {
                match c {
                    Component::Normal(_) | Component::CurDir => {}
                    _ => {
                        return Err(io::Error::new(io::ErrorKind::PermissionDenied, EscapesRoot));
                    }
                }
            }
        }
        Ok(())
    }

    /// The path as the root's own code sees it ("." for the root of a confined tree).
    fn p<'a>(&self, rel: &'a Path) -> &'a Path {
        if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        }
    }

    pub fn metadata(&self, rel: &Path) -> io::Result<Meta> {
        self.check(rel)?;
        let _as = self.act()?;
        match self {
            Root::Ambient => std::fs::metadata(rel).map(Meta::from_std),
            Root::Confined { dir, .. } => dir.metadata(self.p(rel)).map(|m| Meta::from_cap(&m)),
        }
    }

    /// Metadata of the entry itself (a symlink is not followed).
    pub fn metadata_nofollow(&self, rel: &Path) -> io::Result<Meta> {
        self.check(rel)?;
        let _as = self.act()?;
        match self {
            Root::Ambient => std::fs::symlink_metadata(rel).map(Meta::from_std),
            Root::Confined { dir, .. } => dir
                .symlink_metadata(self.p(rel))
                .map(|m| Meta::from_cap(&m)),
        }
    }

    pub fn open(&self, rel: &Path, mode: OpenMode) -> io::Result<File> {
        self.check(rel)?;
        let _as = self.act()?;
        match self {
            Root::Ambient => {
                use std::os::unix::fs::OpenOptionsExt;
                let mut o = std::fs::OpenOptions::new();
                open_flags!(o, mode);
                o.open(rel)
            }
            Root::Confined { dir, .. } => {
                use cap_std::fs::OpenOptionsExt;
                let mut o = cap_std::fs::OpenOptions::new();
                open_flags!(o, mode);
                dir.open_with(self.p(rel), &o).map(|f| f.into_std())
            }
        }
    }

    /// Names in a directory, sorted (as the file system has them: not always UTF-8).
    pub fn list(&self, rel: &Path) -> io::Result<Vec<std::ffi::OsString>> {
        self.check(rel)?;
        let _as = self.act()?;
        let mut names: Vec<std::ffi::OsString> = match self {
            Root::Ambient => std::fs::read_dir(rel)?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<io::Result<_>>()?,
            Root::Confined { dir, .. } => dir
                .read_dir(self.p(rel))?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<io::Result<_>>()?,
        };
        names.sort();
        Ok(names)
    }

    pub fn create_dir_all(&self, rel: &Path) -> io::Result<()> {
        self.check(rel)?;
        let _as = self.act()?;
        if rel.as_os_str().is_empty() {
            return Ok(());
        }
        match self {
            Root::Ambient => std::fs::create_dir_all(rel),
            Root::Confined { dir, .. } => dir.create_dir_all(rel),
        }
    }

    pub fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.check(from)?;
        self.check(to)?;
        let _as = self.act()?;
        match self {
            Root::Ambient => std::fs::rename(from, to),
            Root::Confined { dir, .. } => dir.rename(from, dir, to),
        }
    }

    /// Renames `from` to `to` unless `to` exists (`AlreadyExists` then): a hard link under
    /// the new name, then the old name goes, so nothing is ever replaced.
    pub fn rename_noreplace(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.check(from)?;
        self.check(to)?;
        let _as = self.act()?;
        match self {
            Root::Ambient => {
                std::fs::hard_link(from, to)?;
                std::fs::remove_file(from)
            }
            Root::Confined { dir, .. } => {
                dir.hard_link(from, dir, to)?;
                dir.remove_file(from)
            }
        }
    }

    pub fn remove_file(&self, rel: &Path) -> io::Result<()> {
        self.check(rel)?;
        let _as = self.act()?;
        match self {
            Root::Ambient => std::fs::remove_file(rel),
            Root::Confined { dir, .. } => dir.remove_file(rel),
        }
    }

    /// Reads a small regular file of ours (a restart ledger): not through a symlink in its
    /// last component, and at most `max` bytes (anything else is an error).
    pub fn read_private(&self, rel: &Path, max: u64) -> io::Result<Vec<u8>> {
        use std::io::Read;
        let f = {
            self.check(rel)?;
            let _as = self.act()?;
            match self {
                Root::Ambient => {
                    use std::os::unix::fs::OpenOptionsExt;
                    std::fs::OpenOptions::new()
                        .read(true)
                        .custom_flags(NOFOLLOW)
                        .open(rel)?
                }
                Root::Confined { dir, .. } => {
                    use cap_std::fs::OpenOptionsExt;
                    let mut o = cap_std::fs::OpenOptions::new();
                    o.read(true).custom_flags(NOFOLLOW);
                    dir.open_with(self.p(rel), &o)?.into_std()
                }
            }
        };
        let m = f.metadata()?;
        if !m.is_file() || m.len() > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a small regular file",
            ));
        }
        let mut out = Vec::with_capacity(m.len() as usize);
        f.take(max).read_to_end(&mut out)?;
        Ok(out)
    }

    /// Sets a directory's mode through a descriptor opened without following a symlink, so
    /// that a directory swapped for a link between its creation and this call is not chmod-ed
    /// through the link.
    pub fn set_dir_mode(&self, rel: &Path, mode: u32) -> io::Result<()> {
        self.check(rel)?;
        let _as = self.act()?;
        use std::os::unix::fs::PermissionsExt;
        let f = match self {
            Root::Ambient => {
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(NOFOLLOW | libc::O_DIRECTORY)
                    .open(self.p(rel))?
            }
            Root::Confined { dir, .. } => {
                use cap_std::fs::OpenOptionsExt;
                let mut o = cap_std::fs::OpenOptions::new();
                o.read(true).custom_flags(NOFOLLOW | libc::O_DIRECTORY);
                dir.open_with(self.p(rel), &o)?.into_std()
            }
        };
        f.set_permissions(std::fs::Permissions::from_mode(mode))
    }

    /// Makes a directory's entries durable.
    pub fn sync_dir(&self, rel: &Path) -> io::Result<()> {
        self.check(rel)?;
        let _as = self.act()?;
        match self {
            Root::Ambient => File::open(if rel.as_os_str().is_empty() {
                Path::new(".")
            } else {
                rel
            })?
            .sync_all(),
            // `Dir` handles are O_PATH, which cannot be synced: open the directory for reading.
            Root::Confined { dir, .. } => {
                let mut o = cap_std::fs::OpenOptions::new();
                o.read(true);
                dir.open_with(self.p(rel), &o)?.into_std().sync_all()
            }
        }
    }

    /// Writes a small file atomically: a new temporary file (created exclusively, after
    /// removing whatever had its name: a leftover, or a planted link), sync, rename. The
    /// temporary file is removed if any step fails (a full disk leaves nothing behind).
    pub fn write_atomic(&self, rel: &Path, bytes: &[u8]) -> io::Result<()> {
        let tmp = sibling(rel, ".tmp");
        let _ = self.remove_file(&tmp);
        let written = self.open(&tmp, OpenMode::CreateNew).and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_data()
        });
        let r = written.and_then(|()| self.rename(&tmp, rel));
        if r.is_err() {
            let _ = self.remove_file(&tmp);
        }
        r
    }

    /// How the root is shown in messages.
    pub fn display(&self, rel: &Path) -> String {
        match self {
            Root::Ambient => rel.display().to_string(),
            Root::Confined { .. } => format!("/{}", rel.display()),
        }
    }
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Longest file name the temporary names are derived from as they are; longer ones (up to
/// the 255 bytes a name may have) would overflow with `.NAME.haul-ledger.tmp` (17 more bytes).
const MAX_PLAIN_NAME: usize = 255 - ".".len() - ".haul-ledger.tmp".len();

/// `dir/.name.haul-part` and `dir/.name.haul-ledger` for `dir/name`. For a name too long to
/// take the decoration, `dir/.haul-HASH.haul-part` (and `-ledger`), HASH being the first 128
/// bits of the name's SHA-256 in hex: still one per destination, and within the name limit.
pub fn partial_paths(final_path: &Path) -> (PathBuf, PathBuf) {
    use std::os::unix::ffi::OsStrExt;
    use wire::checksum::{Algorithm, digest_bytes};
    let name = final_path.file_name().unwrap_or_default();
    let dir = final_path.parent().unwrap_or(Path::new(""));
    let stem = if name.len() <= MAX_PLAIN_NAME {
        let mut s = std::ffi::OsString::from(".");
        s.push(name);
        s
    } else {
        let hex = digest_bytes(&[Algorithm::Sha256], name.as_bytes())
            .into_iter()
            .find(|d| d.algorithm == Algorithm::Sha256)
            .map(|d| d.hex())
            .unwrap_or_default();
        std::ffi::OsString::from(format!(".haul-{}", &hex[..32]))
    };
    let with = |suffix: &str| {
        let mut s = stem.clone();
        s.push(suffix);
        dir.join(s)
    };
    (with(".haul-part"), with(".haul-ledger"))
}

/// Parses a path from a peer or a URL into a path below a confined root: leading `/` stripped,
/// `.` components dropped, `..` refused.
pub fn remote_rel_path(path: &str) -> Result<PathBuf, ErrorInfo> {
    let mut out = PathBuf::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                return Err(ErrorInfo::new(
                    ErrorKind::PathEscapesRoot,
                    format!("{path}: '..' is not allowed in endpoint paths"),
                ));
            }
            p if p.contains('\0') => {
                return Err(ErrorInfo::new(
                    ErrorKind::Invalid,
                    format!("{path:?}: NUL in path"),
                ));
            }
            p => out.push(p),
        }
    }
    Ok(out)
}

/// One file or directory to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceEntry {
    /// Destination-relative path: the source's base name, then the path below it.
    pub rel: String,
    pub kind: EntryKind,
    pub size: u64,
    pub mode: u32,
    pub mtime: Timestamp,
    /// Where to open it in the root.
    pub locator: PathBuf,
    /// Checksums the file must have (a replica named by a catalog); empty: none known.
    pub expect: Vec<wire::checksum::Digest>,
    /// Block CRCs its writer recorded as it wrote it (`haul mount`'s spools): blocks they
    /// cover are sent without being read to checksum them.
    pub known_crcs: Option<std::sync::Arc<wire::known_crcs::KnownCrcs>>,
}

/// What enumerating a tree finds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// An entry to send.
    Entry(SourceEntry),
    /// An entry that cannot be sent (unreadable, a special file, a name that is not UTF-8):
    /// reported as a failed file with `error`, so that nothing of a tree is left out silently.
    Unsendable { rel: String, error: ErrorInfo },
}

/// Enumerates `path` (a file, or with `recursive` a tree) depth-first in name order, calling
/// `emit` for every entry. Symlinks are followed (inside a confined root they must stay inside
/// it); a directory seen before (a symlink loop) is not entered again. Entries that cannot be
/// sent are emitted as [`Found::Unsendable`]; `emit` returning false stops the walk.
pub fn enumerate(
    root: &Root,
    path: &Path,
    recursive: bool,
    emit: &mut dyn FnMut(Found) -> bool,
) -> Result<(), ErrorInfo> {
    let shown = root.display(path);
    let meta = root.metadata(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => ErrorInfo::new(
            ErrorKind::NotFound,
            format!("{shown}: no such file or directory"),
        ),
        _ => io_info(&shown, &e),
    })?;
    let base = match root {
        Root::Ambient => std::fs::canonicalize(path)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())),
        Root::Confined { .. } => path.file_name().map(|n| n.to_string_lossy().into_owned()),
    };
    let Some(base) = base else {
        return Err(ErrorInfo::new(
            ErrorKind::Invalid,
            format!("{shown}: cannot copy the root itself; name a directory or file below it"),
        ));
    };
    if meta.is_dir && !recursive {
        return Err(ErrorInfo::new(
            ErrorKind::Invalid,
            format!("{shown} is a directory (use -r to copy a tree)"),
        ));
    }
    if !meta.is_dir && !meta.is_file {
        return Err(ErrorInfo::new(
            ErrorKind::Invalid,
            format!("{shown} is not a regular file or directory"),
        ));
    }
    // A single file that cannot be read fails here, with its real cause, before a session is
    // set up around it (the session would end before the other side's streams joined).
    if meta.is_file {
        root.open(path, OpenMode::Read)
            .map_err(|e| io_info(&shown, &e))?;
    }
    let mut seen = std::collections::HashSet::new();
    walk(root, path, base, meta, emit, &mut seen)?;
    Ok(())
}

fn walk(
    root: &Root,
    path: &Path,
    rel: String,
    meta: Meta,
    emit: &mut dyn FnMut(Found) -> bool,
    seen: &mut std::collections::HashSet<(u64, u64)>,
) -> Result<bool, ErrorInfo> {
    let entry = SourceEntry {
        rel: rel.clone(),
        kind: if meta.is_dir {
            EntryKind::Dir
        } else {
            EntryKind::File
        },
        size: if meta.is_dir { 0 } else { meta.len },
        mode: meta.mode,
        mtime: meta.mtime,
        locator: path.to_path_buf(),
        expect: Vec::new(),
        known_crcs: None,
    };
    if let Err(why) = validate_relative_path(&entry.rel) {
        let error = ErrorInfo::new(
            ErrorKind::Io,
            format!("{}: cannot be sent: {why}", root.display(path)),
        )
        .retryable(false);
        return Ok(emit(Found::Unsendable { rel, error }));
    }
    if !emit(Found::Entry(entry)) {
        return Ok(false);
    }
    if !meta.is_dir {
        return Ok(true);
    }
    if !seen.insert((meta.dev, meta.ino)) {
        tracing::warn!(path = %root.display(path), "not entering a directory seen before (symlink loop)");
        return Ok(true);
    }
    let names = root
        .list(path)
        .map_err(|e| io_info(&root.display(path), &e))?;
    for name in names {
        let child = path.join(&name);
        let shown = root.display(&child);
        let sendable = match name.to_str() {
            None => Err(ErrorInfo::new(
                ErrorKind::Io,
                format!("{shown}: the name is not valid UTF-8 and cannot be sent"),
            )),
            Some(utf8) => match root.metadata(&child) {
                Err(e) if escapes_root(&e) => {
                    return Err(io_info(&shown, &e));
                }
                Err(e) => Err(io_info(&shown, &e)),
                Ok(m) if !m.is_dir && !m.is_file => Err(ErrorInfo::new(
                    ErrorKind::Io,
                    format!("{shown}: not a regular file or directory; not copied"),
                )),
                Ok(m) => Ok((utf8, m)),
            },
        };
        let more = match sendable {
            Ok((utf8, m)) => walk(root, &child, format!("{rel}/{utf8}"), m, emit, seen)?,
            Err(error) => emit(Found::Unsendable {
                rel: format!("{rel}/{}", name.to_string_lossy()),
                error: error.retryable(false),
            }),
        };
        if !more {
            return Ok(false);
        }
    }
    Ok(true)
}

/// How the destination of a session was resolved (cp semantics).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    /// The destination path in the root.
    pub base: PathBuf,
    /// `base` is an existing directory: entries go below it under their own names. Otherwise
    /// `base` is the new name of the top entry.
    pub into_dir: bool,
}

impl Destination {
    /// Resolves `dest` in `root`: an existing directory receives entries; otherwise `dest` names
    /// the copy (its parent directories are created). A trailing `/` insists on a directory.
    pub fn resolve(root: &Root, dest: &Path, wants_dir: bool) -> Result<Self, ErrorInfo> {
        let shown = root.display(dest);
        match root.metadata(dest) {
            Ok(m) if m.is_dir => Ok(Self {
                base: dest.to_path_buf(),
                into_dir: true,
            }),
            Ok(_) if wants_dir => Err(ErrorInfo::new(
                ErrorKind::NotWritable,
                format!("{shown} is not a directory"),
            )),
            Ok(_) => Ok(Self {
                base: dest.to_path_buf(),
                into_dir: false,
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if wants_dir {
                    return Err(ErrorInfo::new(
                        ErrorKind::NotWritable,
                        format!("destination directory {shown} does not exist"),
                    ));
                }
                if dest.as_os_str().is_empty() {
                    return Ok(Self {
                        base: dest.to_path_buf(),
                        into_dir: true,
                    });
                }
                Ok(Self {
                    base: dest.to_path_buf(),
                    into_dir: false,
                })
            }
            Err(e) => Err(io_info(&shown, &e)),
        }
    }

    /// [`Destination::resolve`], or as an earlier attempt of the same transfer decided:
    /// `into_dir` `Some(true)`, `dest` must be a directory that receives entries; `Some(false)`,
    /// `dest` names the copy (a directory that attempt created is written into as the copy).
    pub fn pinned(
        root: &Root,
        dest: &Path,
        wants_dir: bool,
        into_dir: Option<bool>,
    ) -> Result<Self, ErrorInfo> {
        match into_dir {
            None => Self::resolve(root, dest, wants_dir),
            Some(true) => match root.metadata(dest) {
                Ok(m) if m.is_dir => Ok(Self {
                    base: dest.to_path_buf(),
                    into_dir: true,
                }),
                _ => Err(ErrorInfo::new(
                    ErrorKind::NotWritable,
                    format!(
                        "destination directory {} is gone since the first attempt",
                        root.display(dest)
                    ),
                )
                .retryable(false)),
            },
            Some(false) if dest.as_os_str().is_empty() => Err(ErrorInfo::new(
                ErrorKind::Invalid,
                "the root cannot name a copy",
            )),
            Some(false) => Ok(Self {
                base: dest.to_path_buf(),
                into_dir: false,
            }),
        }
    }

    /// The destination path of an entry named `rel` (`name[/...]`) by the source.
    pub fn map(&self, rel: &str) -> PathBuf {
        if self.into_dir {
            return self.base.join(rel);
        }
        let mut parts = rel.splitn(2, '/');
        parts.next();
        match parts.next() {
            Some(rest) => self.base.join(rest),
            None => self.base.clone(),
        }
    }
}

/// The restart ledger of a partial file: which ranges are durably on disk, for which source
/// version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    pub version: u32,
    pub size: u64,
    pub mtime_secs: i64,
    pub mtime_nanos: u32,
    pub ranges: Vec<(u64, u64)>,
}

impl Ledger {
    pub fn new(size: u64, mtime: Timestamp, ranges: &RangeSet) -> Self {
        Self {
            version: 1,
            size,
            mtime_secs: mtime.secs,
            mtime_nanos: mtime.nanos,
            ranges: ranges.pairs().to_vec(),
        }
    }

    /// The ranges this ledger vouches for, if it belongs to a source of this size and mtime.
    pub fn valid_for(&self, size: u64, mtime: Timestamp) -> Option<RangeSet> {
        if self.version != 1
            || self.size != size
            || self.mtime_secs != mtime.secs
            || self.mtime_nanos != mtime.nanos
        {
            return None;
        }
        let mut set = RangeSet::from_pairs(&self.ranges)?;
        set.remove(size..u64::MAX);
        Some(set)
    }
}

/// What opening a destination produced.
pub enum Opened {
    /// A temporary file to write, with the ranges already present (resume).
    Partial { file: File, have: RangeSet },
    /// The final file already exists with this size and mtime (resume only).
    Complete,
}

/// Creates the directories above `final_path` and names the destination for
/// [`crate::claims`]: its directory's device and inode, and its file name.
pub fn destination_key(root: &Root, final_path: &Path) -> Result<crate::claims::Key, ErrorInfo> {
    let parent = final_path.parent().unwrap_or(Path::new(""));
    let shown = root.display(parent);
    root.create_dir_all(parent)
        .map_err(|e| dest_io_info(&shown, &e))?;
    let m = root
        .metadata(parent)
        .map_err(|e| dest_io_info(&shown, &e))?;
    let name = final_path.file_name().unwrap_or_default().to_owned();
    Ok((m.dev, m.ino, name))
}

/// Largest restart ledger read back (a ledger of a badly fragmented file is a few KiB).
const MAX_LEDGER: u64 = 4 << 20;

/// Opens the temporary file of destination `final_path` for a file of `size` bytes. With
/// `resume`, a valid ledger's ranges are kept and an identical final file counts as done.
///
/// A new temporary file is created exclusively and without following links, after removing
/// whatever had its name; an existing one is resumed only if it is a regular file with a
/// single link, opened without following a link. So a user who can write the destination
/// directory cannot make the transfer write through a planted `.NAME.haul-part` symlink or
/// hard link into another file.
pub fn open_destination(
    root: &Root,
    final_path: &Path,
    size: u64,
    mtime: Timestamp,
    resume: bool,
) -> Result<Opened, ErrorInfo> {
    let shown = root.display(final_path);
    let (part, ledger_path) = partial_paths(final_path);
    if let Some(parent) = final_path.parent() {
        root.create_dir_all(parent)
            .map_err(|e| dest_io_info(&root.display(parent), &e))?;
    }
    if let Ok(m) = root.metadata(final_path) {
        if m.is_dir {
            return Err(ErrorInfo::new(
                ErrorKind::NotWritable,
                format!("{shown} is a directory"),
            ));
        }
        if resume && m.is_file && m.len == size && m.mtime == mtime {
            let _ = root.remove_file(&part);
            let _ = root.remove_file(&ledger_path);
            return Ok(Opened::Complete);
        }
    }
    if resume {
        let ledger = root
            .read_private(&ledger_path, MAX_LEDGER)
            .ok()
            .and_then(|t| serde_json::from_slice::<Ledger>(&t).ok())
            .and_then(|l| l.valid_for(size, mtime));
        if let Some(have) = ledger
            && let Ok(file) = root.open(&part, OpenMode::Existing)
            && resumable(&file, size, &have)
        {
            return Ok(Opened::Partial { file, have });
        }
    }
    let _ = root.remove_file(&ledger_path);
    let _ = root.remove_file(&part);
    let file = root
        .open(&part, OpenMode::CreateNew)
        .map_err(|e| dest_io_info(&shown, &e))?;
    crate::sys::reserve(&file, size).map_err(|e| {
        let _ = root.remove_file(&part);
        dest_io_info(&shown, &e)
    })?;
    Ok(Opened::Partial {
        file,
        have: RangeSet::new(),
    })
}

/// Whether a partial file may be resumed with the ranges its ledger lists: a regular file
/// with one link (not a link a user made to some other file), holding every listed range, and
/// of the file's full length (a file cut short, e.g. by a crash before it was extended, is
/// extended first).
fn resumable(file: &File, size: u64, have: &RangeSet) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = file.metadata() else {
        return false;
    };
    if !m.is_file() || m.nlink() != 1 {
        return false;
    }
    let end = have.pairs().last().map(|p| p.1).unwrap_or(0);
    if m.len() == size {
        return true;
    }
    m.len() < size && end <= m.len() && file.set_len(size).is_ok()
}

/// Makes the ranges durable and records them in the ledger.
pub fn checkpoint(
    root: &Root,
    final_path: &Path,
    file: &File,
    size: u64,
    mtime: Timestamp,
    ranges: &RangeSet,
) -> io::Result<()> {
    file.sync_data()?;
    let (_, ledger_path) = partial_paths(final_path);
    let body = serde_json::to_vec(&Ledger::new(size, mtime, ranges)).expect("ledger serializes");
    root.write_atomic(&ledger_path, &body)
}

/// Refuses to receive a file whose final name exists (a storage node's replica), except an
/// identical one a resumed transfer finds complete.
pub fn refuse_existing(
    root: &Root,
    final_path: &Path,
    begin: &wire::data::FileBegin,
) -> Result<(), ErrorInfo> {
    match root.metadata(final_path) {
        Ok(m) if begin.resume && m.is_file && m.len == begin.size && m.mtime == begin.mtime => {
            Ok(())
        }
        Ok(_) => Err(ErrorInfo::new(
            ErrorKind::NotWritable,
            format!(
                "file {} already has a replica on this node; it is never overwritten",
                begin.path
            ),
        )),
        Err(_) => Ok(()),
    }
}

/// Moves a verified temporary file into place, replacing a file of that name only if
/// `replace` (otherwise an existing file makes the commit fail and stays as it is).
pub fn commit(
    root: &Root,
    final_path: &Path,
    file: &File,
    mode: u32,
    mtime: Timestamp,
    durable: bool,
    replace: bool,
) -> Result<(), ErrorInfo> {
    let shown = root.display(final_path);
    let (part, ledger_path) = partial_paths(final_path);
    let err = |e: io::Error| io_info(&shown, &e);
    if durable {
        file.sync_all().map_err(err)?;
    }
    use std::os::unix::fs::PermissionsExt;
    // Set-user-ID and set-group-ID bits are never taken from the peer: on an endpoint running
    // as root they would make a received file a privileged program.
    file.set_permissions(std::fs::Permissions::from_mode(mode & 0o1777))
        .map_err(err)?;
    let t = std::time::UNIX_EPOCH
        + std::time::Duration::new(mtime.secs.max(0) as u64, mtime.nanos.min(999_999_999));
    file.set_times(std::fs::FileTimes::new().set_modified(t))
        .map_err(err)?;
    // Only our own temporary file goes into place: the name must still lead to the file we
    // wrote (not to one swapped in under it).
    let ours = file.metadata().map_err(err)?;
    let there = root.metadata_nofollow(&part).map_err(err)?;
    {
        use std::os::unix::fs::MetadataExt;
        if (there.dev, there.ino) != (ours.dev(), ours.ino()) {
            return Err(ErrorInfo::new(
                ErrorKind::NotWritable,
                format!("{shown}: its temporary file was replaced while being written"),
            ));
        }
    }
    if replace {
        root.rename(&part, final_path).map_err(err)?;
    } else {
        root.rename_noreplace(&part, final_path).map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                let _ = root.remove_file(&part);
                let _ = root.remove_file(&ledger_path);
                ErrorInfo::new(
                    ErrorKind::NotWritable,
                    format!("{shown} already exists; it is never overwritten"),
                )
            } else {
                err(e)
            }
        })?;
    }
    if durable {
        let parent = final_path.parent().unwrap_or(Path::new(""));
        root.sync_dir(parent).map_err(err)?;
    }
    let _ = root.remove_file(&ledger_path);
    // A process killed while writing a checkpoint leaves the ledger's temporary file; a
    // resumed session that commits before its own first checkpoint would otherwise keep it.
    let _ = root.remove_file(&sibling(&ledger_path, ".tmp"));
    Ok(())
}

/// Drops a temporary file, or keeps it and its ledger for a later resume.
pub fn discard(root: &Root, final_path: &Path, keep_partial: bool) {
    if keep_partial {
        return;
    }
    let (part, ledger_path) = partial_paths(final_path);
    let _ = root.remove_file(&part);
    let _ = root.remove_file(&ledger_path);
    let _ = root.remove_file(&sibling(&ledger_path, ".tmp"));
}

/// Creates a directory entry of a tree.
pub fn make_dir(root: &Root, path: &Path, mode: u32) -> Result<(), ErrorInfo> {
    let shown = root.display(path);
    match root.metadata(path) {
        Ok(m) if m.is_dir => {}
        Ok(_) => {
            return Err(ErrorInfo::new(
                ErrorKind::NotWritable,
                format!("{shown} exists and is not a directory"),
            ));
        }
        Err(_) => root
            .create_dir_all(path)
            .map_err(|e| dest_io_info(&shown, &e))?,
    }
    // Keep the directory writable by us whatever the source mode says; never set-user-ID.
    let _ = root.set_dir_mode(path, (mode & 0o3777) | 0o700);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn confined(dir: &Path) -> Root {
        Root::confined(dir).unwrap()
    }

    #[test]
    fn confined_root_refuses_escapes() {
        let outer = tempfile::tempdir().unwrap();
        let root_dir = outer.path().join("root");
        std::fs::create_dir(&root_dir).unwrap();
        std::fs::write(outer.path().join("secret"), b"x").unwrap();
        std::os::unix::fs::symlink(outer.path().join("secret"), root_dir.join("link-out")).unwrap();
        std::os::unix::fs::symlink("../secret", root_dir.join("rel-out")).unwrap();
        std::fs::write(root_dir.join("inside"), b"y").unwrap();
        std::os::unix::fs::symlink("inside", root_dir.join("link-in")).unwrap();
        let root = confined(&root_dir);
        for bad in ["../secret", "link-out", "rel-out", "/etc/passwd"] {
            let err = root.open(Path::new(bad), OpenMode::Read).unwrap_err();
            let info = io_info(bad, &err);
            assert_eq!(info.kind, ErrorKind::PathEscapesRoot, "{bad}: {err}");
        }
        assert!(root.open(Path::new("link-in"), OpenMode::Read).is_ok());
        assert!(remote_rel_path("/a/../b").is_err());
        assert_eq!(remote_rel_path("/a/./b/").unwrap(), PathBuf::from("a/b"));
    }

    #[test]
    fn enumerate_tree_in_order_with_dirs() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("tree");
        std::fs::create_dir_all(t.join("sub/empty")).unwrap();
        std::fs::write(t.join("b"), b"12").unwrap();
        std::fs::write(t.join("sub/a"), b"1").unwrap();
        // Names POSIX allows but that once were left out silently: a backslash is sent, a
        // name that is not UTF-8 and a special file are reported as failed, not skipped.
        std::fs::write(t.join("back\\slash"), b"3").unwrap();
        use std::os::unix::ffi::OsStrExt;
        std::fs::write(t.join(std::ffi::OsStr::from_bytes(b"latin1-\xe9")), b"4").unwrap();
        let fifo = std::ffi::CString::new(t.join("fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let root = confined(d.path());
        let mut got = Vec::new();
        let mut failed = Vec::new();
        enumerate(&root, Path::new("tree"), true, &mut |f| {
            match f {
                Found::Entry(e) => got.push((e.rel, e.kind, e.size)),
                Found::Unsendable { rel, error } => {
                    assert!(!error.retryable);
                    failed.push(rel)
                }
            }
            true
        })
        .unwrap();
        assert_eq!(
            got,
            vec![
                ("tree".into(), EntryKind::Dir, 0),
                ("tree/b".into(), EntryKind::File, 2),
                ("tree/back\\slash".into(), EntryKind::File, 1),
                ("tree/sub".into(), EntryKind::Dir, 0),
                ("tree/sub/a".into(), EntryKind::File, 1),
                ("tree/sub/empty".into(), EntryKind::Dir, 0),
            ]
        );
        assert_eq!(failed, vec!["tree/fifo", "tree/latin1-\u{fffd}"]);
        let err = enumerate(&root, Path::new("tree"), false, &mut |_| true).unwrap_err();
        assert!(err.message.contains("use -r"));
        let err = enumerate(&root, Path::new("nope"), false, &mut |_| true).unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotFound);
    }

    #[test]
    fn destination_follows_cp_semantics() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("dir")).unwrap();
        let root = confined(d.path());
        let into = Destination::resolve(&root, Path::new("dir"), false).unwrap();
        assert!(into.into_dir);
        assert_eq!(into.map("x.nc"), PathBuf::from("dir/x.nc"));
        let named = Destination::resolve(&root, Path::new("new"), false).unwrap();
        assert_eq!(named.map("src"), PathBuf::from("new"));
        assert_eq!(named.map("src/a/b"), PathBuf::from("new/a/b"));
        assert!(Destination::resolve(&root, Path::new("missing"), true).is_err());
    }

    #[test]
    fn partial_resume_and_commit() {
        let d = tempfile::tempdir().unwrap();
        let root = confined(d.path());
        let fp = Path::new("out/f.dat");
        let mtime = Timestamp {
            secs: 1_600_000_000,
            nanos: 42,
        };
        let Opened::Partial { file, have } =
            open_destination(&root, fp, 100, mtime, false).unwrap()
        else {
            panic!()
        };
        assert!(have.is_empty());
        use std::os::unix::fs::FileExt;
        file.write_all_at(&[7; 40], 0).unwrap();
        checkpoint(&root, fp, &file, 100, mtime, &RangeSet::from_range(0..40)).unwrap();
        drop(file);
        assert!(
            !d.path().join("out/f.dat").exists(),
            "nothing under the final name"
        );
        // Resume with a different mtime: ledger not valid, start over.
        let other = Timestamp { secs: 1, nanos: 0 };
        let Opened::Partial { have, .. } = open_destination(&root, fp, 100, other, true).unwrap()
        else {
            panic!()
        };
        assert!(have.is_empty());
        // The ledger was removed by that fresh start; write it again and resume properly.
        let Opened::Partial { file, .. } = open_destination(&root, fp, 100, mtime, false).unwrap()
        else {
            panic!()
        };
        checkpoint(&root, fp, &file, 100, mtime, &RangeSet::from_range(0..40)).unwrap();
        let Opened::Partial { file, have } = open_destination(&root, fp, 100, mtime, true).unwrap()
        else {
            panic!()
        };
        assert_eq!(have.pairs(), &[(0, 40)]);
        // What a process killed in the middle of a checkpoint leaves: the commit removes it.
        std::fs::write(
            d.path().join("out/.f.dat.haul-ledger.tmp"),
            b"half a ledger",
        )
        .unwrap();
        commit(&root, fp, &file, 0o640, mtime, true, true).unwrap();
        assert!(!d.path().join("out/.f.dat.haul-ledger.tmp").exists());
        let m = root.metadata(fp).unwrap();
        assert_eq!((m.len, m.mode, m.mtime), (100, 0o640, mtime));
        assert!(!d.path().join("out/.f.dat.haul-part").exists());
        assert!(!d.path().join("out/.f.dat.haul-ledger").exists());
        // An identical final file counts as complete when resuming.
        assert!(matches!(
            open_destination(&root, fp, 100, mtime, true).unwrap(),
            Opened::Complete
        ));
        // Set-ID bits from the peer are dropped; the rest of the mode is kept.
        let fp2 = Path::new("out/g.dat");
        let Opened::Partial { file, .. } = open_destination(&root, fp2, 0, mtime, false).unwrap()
        else {
            panic!()
        };
        commit(&root, fp2, &file, 0o6755, mtime, false, true).unwrap();
        assert_eq!(root.metadata(fp2).unwrap().mode, 0o755);
    }

    /// Issue 11 C7: a storage node's commit never replaces a replica (a replayed write
    /// capability renamed over the verified copy); the refused file's temporary goes.
    #[test]
    fn a_commit_that_may_not_replace_leaves_the_existing_file() {
        let d = tempfile::tempdir().unwrap();
        let root = confined(d.path());
        let fp = Path::new("data/00/01/0000000000000001");
        let mtime = Timestamp { secs: 5, nanos: 0 };
        let write = |byte: u8| {
            let Opened::Partial { file, .. } =
                open_destination(&root, fp, 10, mtime, false).unwrap()
            else {
                panic!()
            };
            use std::os::unix::fs::FileExt;
            file.write_all_at(&[byte; 10], 0).unwrap();
            file
        };
        let first = write(1);
        commit(&root, fp, &first, 0o600, mtime, true, false).unwrap();
        let second = write(2);
        let e = commit(&root, fp, &second, 0o600, mtime, true, false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotWritable, "{e:?}");
        assert_eq!(std::fs::read(d.path().join(fp)).unwrap(), vec![1; 10]);
        assert!(
            !d.path()
                .join("data/00/01/.0000000000000001.haul-part")
                .exists()
        );
        // Receiving it at all is refused up front, unless a resume finds it identical.
        let begin = |resume, size| wire::data::FileBegin {
            file: 0,
            attempt: 0,
            kind: wire::data::EntryKind::File,
            path: "1".into(),
            size,
            mode: 0o600,
            mtime,
            resume,
        };
        assert!(refuse_existing(&root, fp, &begin(false, 10)).is_err());
        assert!(refuse_existing(&root, fp, &begin(true, 11)).is_err());
        assert!(refuse_existing(&root, fp, &begin(true, 10)).is_ok());
        assert!(refuse_existing(&root, Path::new("data/00/01/other"), &begin(false, 10)).is_ok());
    }
}
