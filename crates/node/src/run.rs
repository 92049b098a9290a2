//! File-affinity computing on a storage node ("owner computes", seed 000): runs a user's
//! command on replicas held here, as the local account the grid identity maps to (never root),
//! collects each task's exit status and the head of its output, and registers the files a task
//! leaves in its output directory with the metadata server as new replicas on this node.
//!
//! One `Run` request opens a run on a control connection; the client then streams `Task`s and
//! receives a `TaskDone` for each as it finishes, so the client keeps every node's slots full
//! without a round trip per scheduling decision.

use crate::spool::{self, MetaLink, OutputFile};
use cap_std::fs::Dir;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::sync::{Semaphore, mpsc};
use transfer::TransferError;
use transfer::conn::{ControlReader, ControlWriter};
use wire::control::{Request, Response};
use wire::data::Timestamp;
use wire::error::{ErrorInfo, ErrorKind};
use wire::grant::{Grant, Operation, SignedGrant};
use wire::node::{NodeRequest, NodeResponse, RunSpec, RunTask, TaskResult};

/// Bytes of each of stdout and stderr kept per task.
pub const OUTPUT_KEPT: usize = 64 * 1024;
/// Most processes a node runs at once for one run.
pub const MAX_SLOTS: u32 = 256;
/// Where task directories live, under the node's root.
pub const RUN_DIR: &str = ".run";

/// A local account tasks run as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

/// The lowest uid of an ordinary account: `UID_MIN` of /etc/login.defs, 1000 when it says
/// nothing. Accounts below it (daemon, bin, the node's own service account, ...) and `nobody`
/// own system files or are shared by services; tasks never run as them.
pub fn uid_min() -> u32 {
    std::fs::read_to_string("/etc/login.defs")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some("UID_MIN")).then(|| w.next()?.parse().ok())?
            })
        })
        .unwrap_or(1000)
}

/// `nobody`'s uid on Linux: shared by every unprivileged service.
const NOBODY_UID: u32 = 65534;

/// Looks up the local account `name`; refuses root, system accounts (when the node switches
/// users) and accounts this process cannot become.
pub fn account(name: &str, node: &str) -> Result<Account, ErrorInfo> {
    let denied = |m: String| ErrorInfo::new(ErrorKind::PermissionDenied, m);
    let acct = transfer::sys::lookup_user(name).ok_or_else(|| {
        denied(format!(
            "node {node} has no local account {name:?} to run tasks as (the grid identity maps to the local account of the same name)"
        ))
    })?;
    if acct.uid == 0 {
        return Err(denied(format!(
            "node {node} never runs tasks as root: map the certificate to an unprivileged account"
        )));
    }
    let me = transfer::sys::effective_uid();
    if me == 0 && (acct.uid < uid_min() || acct.uid >= NOBODY_UID) {
        return Err(denied(format!(
            "node {node} never runs tasks as the system account {name:?} (uid {}): map the certificate to an ordinary user account (uid {} or above)",
            acct.uid,
            uid_min()
        )));
    }
    if me != 0 && me != acct.uid {
        return Err(denied(format!(
            "node {node} runs as uid {me} and cannot start processes as {name} (uid {}); run the node as root to run tasks for other users",
            acct.uid
        )));
    }
    Ok(Account {
        name: name.to_string(),
        uid: acct.uid,
        gid: acct.gid,
        home: acct.home,
    })
}

/// What a run needs to start tasks.
struct RunCtx {
    link: Arc<dyn MetaLink>,
    root: PathBuf,
    run_id: String,
    spec: RunSpec,
    grant: Grant,
    signed: SignedGrant,
    account: Account,
}

/// Serves one `Run` on a control connection until `RunEnd` and the last task.
pub async fn serve(
    link: Arc<dyn MetaLink>,
    root: &Path,
    reader: &mut ControlReader,
    writer: &mut ControlWriter,
    spec: RunSpec,
    presenter: Option<&[u8]>,
) -> Result<(), TransferError> {
    let ctx = match prepare(link, root, spec, presenter) {
        Ok(c) => Arc::new(c),
        Err(e) => return writer.send_response(&Response::Error(e)).await,
    };
    let slots = ctx.spec.parallel.clamp(1, MAX_SLOTS);
    writer
        .send_response(&Response::Service(
            NodeResponse::RunReady {
                user: ctx.account.name.clone(),
                slots,
            }
            .encode(),
        ))
        .await?;
    tracing::info!(run = %ctx.run_id, user = %ctx.account.name, slots, argv = ?ctx.spec.argv, "run started");
    let (task_tx, mut task_rx) = mpsc::unbounded_channel::<RunTask>();
    let stop = tokio_util::sync::CancellationToken::new();
    // Requests are read in their own future (never cancelled mid-frame) while results are
    // written by the other.
    let read = async {
        let r = loop {
            match reader.request().await {
                Ok(Some(Request::Service(body))) => match NodeRequest::decode(&body) {
                    Ok(NodeRequest::Task(t)) => {
                        if task_tx.send(t).is_err() {
                            break Ok(());
                        }
                    }
                    Ok(NodeRequest::RunEnd) => break Ok(()),
                    Ok(other) => {
                        stop.cancel();
                        break Err(TransferError::protocol(format!(
                            "unexpected request during a run: {other:?}"
                        )));
                    }
                    Err(e) => {
                        stop.cancel();
                        break Err(TransferError::protocol(format!(
                            "malformed node request during a run: {e}"
                        )));
                    }
                },
                Ok(Some(Request::Cancel)) | Ok(None) => {
                    stop.cancel();
                    break Ok(());
                }
                Ok(Some(other)) => {
                    stop.cancel();
                    break Err(TransferError::protocol(format!(
                        "unexpected request during a run: {other:?}"
                    )));
                }
                Err(e) => {
                    stop.cancel();
                    break Err(e);
                }
            }
        };
        drop(task_tx);
        r
    };
    let run = async {
        let sem = Arc::new(Semaphore::new(slots as usize));
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<TaskResult>();
        let mut running = 0usize;
        let mut open = true;
        let mut failed: Option<TransferError> = None;
        loop {
            tokio::select! {
                t = task_rx.recv(), if open => match t {
                    Some(t) => {
                        running += 1;
                        let (ctx, sem, done, stop) = (ctx.clone(), sem.clone(), done_tx.clone(), stop.clone());
                        tokio::spawn(async move {
                            let _permit = sem.acquire_owned().await;
                            let r = tokio::select! {
                                r = run_task(&ctx, &t) => r,
                                _ = stop.cancelled() => TaskResult {
                                    task: t.task,
                                    error: Some(ErrorInfo::new(ErrorKind::Cancelled, "run cancelled")),
                                    ..Default::default()
                                },
                            };
                            let _ = done.send(r);
                        });
                    }
                    None => open = false,
                },
                r = done_rx.recv(), if running > 0 => {
                    let Some(r) = r else { break };
                    running -= 1;
                    if failed.is_none()
                        && let Err(e) = writer.send_response(&Response::Service(NodeResponse::TaskDone(Box::new(r)).encode())).await
                    {
                        stop.cancel();
                        failed = Some(e);
                    }
                }
                else => break,
            }
            if !open && running == 0 {
                break;
            }
        }
        match failed {
            Some(e) => Err(e),
            None => {
                writer
                    .send_response(&Response::Service(NodeResponse::RunDone.encode()))
                    .await
            }
        }
    };
    let (r1, r2) = tokio::join!(read, run);
    cleanup_run_dir(&ctx);
    tracing::info!(run = %ctx.run_id, "run finished");
    r1.and(r2)
}

fn prepare(
    link: Arc<dyn MetaLink>,
    root: &Path,
    spec: RunSpec,
    presenter: Option<&[u8]>,
) -> Result<RunCtx, ErrorInfo> {
    let signed = spec.grant.clone().ok_or_else(|| {
        ErrorInfo::new(
            ErrorKind::PermissionDenied,
            "a run needs a capability from the metadata server (use haul run)",
        )
    })?;
    let grant = spool::check(link.as_ref(), Some(&signed), Operation::Run, presenter)?;
    if spec.argv.is_empty() || spec.argv[0].is_empty() {
        return Err(ErrorInfo::new(ErrorKind::Invalid, "no command to run"));
    }
    let account = account(&grant.user, &link.node())?;
    let root =
        std::fs::canonicalize(root).map_err(|e| transfer::error::io_info("node root", &e))?;
    let run_id = format!("{:016x}", rand::random::<u64>());
    let base = root.join(RUN_DIR);
    for d in [base.clone(), base.join(&run_id)] {
        match std::fs::create_dir(&d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(transfer::error::io_info(&d.display().to_string(), &e)),
        }
        // Others may pass through to their own task directories, not list them.
        let _ = std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o711));
    }
    Ok(RunCtx {
        link,
        root,
        run_id,
        spec,
        grant,
        signed,
        account,
    })
}

fn cleanup_run_dir(ctx: &RunCtx) {
    let _ = std::fs::remove_dir_all(ctx.root.join(RUN_DIR).join(&ctx.run_id));
}

/// `{}` → input, `{name}`, `{path}`, `{out}`.
pub fn substitute(argv: &[String], input: &str, grid_path: &str, out: &str) -> Vec<String> {
    let name = grid_path.rsplit('/').next().unwrap_or(grid_path);
    argv.iter()
        .map(|a| {
            a.replace("{}", input)
                .replace("{name}", name)
                .replace("{path}", grid_path)
                .replace("{out}", out)
        })
        .collect()
}

/// Runs one task. Only a missing replica is worth trying on another node (the error is
/// marked retryable); a task that ran, timed out or could not start is final.
async fn run_task(ctx: &RunCtx, t: &RunTask) -> TaskResult {
    let mut r = run_task_here(ctx, t).await;
    if let Some(e) = &mut r.error {
        e.retryable = e.retryable && e.kind == ErrorKind::NotFound;
    }
    r
}

async fn run_task_here(ctx: &RunCtx, t: &RunTask) -> TaskResult {
    let mut result = TaskResult {
        task: t.task,
        ..Default::default()
    };
    let node = ctx.link.node();
    // The replica this task reads.
    let input = if t.file.locator.is_empty() {
        PathBuf::from("/dev/null")
    } else {
        let id = match spool::parse_id(&t.file.locator) {
            Ok(id) => id,
            Err(e) => {
                result.error = Some(e);
                return result;
            }
        };
        if let Err(e) = ctx.grant.covers([id]) {
            result.error = Some(ErrorInfo::new(ErrorKind::PermissionDenied, e.to_string()));
            return result;
        }
        let p = ctx.root.join(spool::spool_path(id));
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_file() => {}
            _ => {
                result.error = Some(
                    ErrorInfo::new(
                        ErrorKind::NotFound,
                        format!("{}: replica missing on node {node}", t.file.name),
                    )
                    .retryable(true),
                );
                return result;
            }
        }
        p
    };
    let task_rel = PathBuf::from(RUN_DIR)
        .join(&ctx.run_id)
        .join(format!("t{}", t.task));
    let task_dir = ctx.root.join(&task_rel);
    if let Err(e) = make_task_dir(&task_dir, &ctx.account) {
        result.error = Some(transfer::error::io_info("task directory", &e));
        return result;
    }
    // The task reaches its replica only through a link in a directory of its own: replicas
    // live in the node's private data directory (0700), which no task can enter.
    let input = if t.file.locator.is_empty() {
        input
    } else {
        match give_input(&input, &task_dir, &t.file.name, &ctx.account) {
            Ok(p) => p,
            Err(e) => {
                result.error = Some(transfer::error::io_info("task input", &e));
                let _ = std::fs::remove_dir_all(&task_dir);
                return result;
            }
        }
    };
    let argv = substitute(
        &ctx.spec.argv,
        &input.to_string_lossy(),
        &t.file.name,
        &task_dir.to_string_lossy(),
    );
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &ctx.account.home)
        .env("USER", &ctx.account.name)
        .env("LOGNAME", &ctx.account.name)
        .env("HAUL_INPUT", &input)
        .env("HAUL_OUTPUT", &task_dir)
        .env("HAUL_GRID_PATH", &t.file.name)
        .env("HAUL_NODE", &node)
        .env("HAUL_TASK", t.task.to_string())
        .current_dir(&task_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if transfer::sys::effective_uid() == 0 {
        // std drops supplementary groups when it changes the uid as root.
        cmd.uid(ctx.account.uid).gid(ctx.account.gid);
    }
    // Descriptors the node inherited or opened without close-on-exec (sockets, catalog
    // files, a parent's pipes) must not reach the task: every descriptor above stderr is
    // closed at exec. (Marked close-on-exec rather than closed, so that the spawn's own
    // error pipe still reports an exec that fails.)
    // SAFETY: the closure only makes system calls (close_range, getrlimit, fcntl), which are
    // async-signal-safe, and touches no memory but a local.
    unsafe {
        cmd.pre_exec(|| {
            let all_above_stderr = libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            if all_above_stderr == 0 {
                return Ok(());
            }
            // Kernels before 5.11 (or a seccomp filter) lack it: mark each descriptor.
            let mut lim: libc::rlimit = std::mem::zeroed();
            let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
                lim.rlim_cur.min(1 << 16) as libc::c_int
            } else {
                1024
            };
            for fd in 3..max {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags >= 0 {
                    libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
                }
            }
            Ok(())
        });
    }
    let started = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let (kind, why) = match e.kind() {
                std::io::ErrorKind::NotFound => (ErrorKind::NotFound, "command not found"),
                std::io::ErrorKind::PermissionDenied => {
                    (ErrorKind::PermissionDenied, "permission denied")
                }
                _ => (ErrorKind::Io, "cannot start"),
            };
            result.error = Some(ErrorInfo::new(
                kind,
                format!("{}: {why} on node {node} ({e})", argv[0]),
            ));
            remove_task_dirs(&task_dir);
            return result;
        }
    };
    let pgid = child.id();
    let (out, err) = (child.stdout.take(), child.stderr.take());
    let collect = async {
        let (a, b) = tokio::join!(read_head(out), read_head(err));
        let status = child.wait().await;
        (a, b, status)
    };
    let timeout = match ctx.spec.timeout_s {
        0 => Duration::MAX,
        s => Duration::from_secs(s as u64),
    };
    let outcome = tokio::time::timeout(timeout, collect).await;
    // Whatever the task left running in its process group ends with it.
    if let Some(pg) = pgid {
        transfer::sys::kill_group(pg);
    }
    result.micros = started.elapsed().as_micros() as u64;
    match outcome {
        Err(_) => {
            result.error = Some(ErrorInfo::new(
                ErrorKind::Stalled,
                format!(
                    "{}: killed after {} s on node {node}",
                    t.file.name, ctx.spec.timeout_s
                ),
            ));
        }
        Ok(((out, t1), (err, t2), status)) => {
            result.stdout = out;
            result.stderr = err;
            result.truncated = t1 + t2;
            match status {
                Ok(s) => {
                    use std::os::unix::process::ExitStatusExt;
                    result.exit = s.code();
                    result.signal = s.signal();
                }
                Err(e) => result.error = Some(transfer::error::io_info("waiting for the task", &e)),
            }
        }
    }
    if !ctx.spec.output.is_empty() && result.error.is_none() {
        let (root, rel, link, signed, output, uid) = (
            ctx.root.clone(),
            task_rel.clone(),
            ctx.link.clone(),
            ctx.signed.clone(),
            ctx.spec.output.clone(),
            ctx.account.uid,
        );
        let r = tokio::task::spawn_blocking(move || {
            register_outputs(&root, &rel, link.as_ref(), &signed, &output, uid)
        })
        .await;
        match r {
            Ok(Ok((outs, notes))) => {
                result.outputs = outs;
                for n in notes {
                    result
                        .stderr
                        .extend_from_slice(format!("haul: {n}\n").as_bytes());
                }
            }
            Ok(Err(e)) => result.error = Some(e),
            Err(e) => {
                result.error = Some(ErrorInfo::new(
                    ErrorKind::Io,
                    format!("registering outputs failed: {e}"),
                ))
            }
        }
    }
    remove_task_dirs(&task_dir);
    result
}

/// Removes a task's working directory and its input link.
fn remove_task_dirs(task_dir: &Path) {
    let _ = std::fs::remove_dir_all(task_dir);
    let _ = std::fs::remove_dir_all(task_dir.with_extension("in"));
}

/// Gives a task its input: a hard link to the replica in a directory only the task's account
/// may enter (`tN.in`, mode 0500, its account's), named like the grid file. The replica is
/// made readable (0644, still the node's and still in the node's private data directory), so
/// this link is the task's only way to it.
fn give_input(
    replica: &Path,
    task_dir: &Path,
    grid_path: &str,
    acct: &Account,
) -> std::io::Result<PathBuf> {
    let dir = task_dir.with_extension("in");
    std::fs::create_dir(&dir)?;
    let name = grid_path
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty() && *n != "." && *n != "..")
        .unwrap_or("input");
    let link = dir.join(name);
    std::fs::hard_link(replica, &link)?;
    std::fs::set_permissions(replica, std::fs::Permissions::from_mode(0o644))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o500))?;
    if transfer::sys::effective_uid() == 0 {
        std::os::unix::fs::chown(&dir, Some(acct.uid), Some(acct.gid))?;
    }
    Ok(link)
}

fn make_task_dir(dir: &Path, acct: &Account) -> std::io::Result<()> {
    std::fs::create_dir(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    if transfer::sys::effective_uid() == 0 {
        std::os::unix::fs::chown(dir, Some(acct.uid), Some(acct.gid))?;
    }
    Ok(())
}

/// Reads a task's stream, keeping its first [`OUTPUT_KEPT`] bytes; returns them and how many
/// more there were.
async fn read_head<R: tokio::io::AsyncRead + Unpin>(r: Option<R>) -> (Vec<u8>, u64) {
    let Some(mut r) = r else {
        return (Vec::new(), 0);
    };
    let mut kept = Vec::new();
    let mut extra = 0u64;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return (kept, extra),
            Ok(n) => {
                let room = OUTPUT_KEPT.saturating_sub(kept.len()).min(n);
                kept.extend_from_slice(&buf[..room]);
                extra += (n - room) as u64;
            }
        }
    }
}

/// Output files registered (grid path, size), and notes on files that were not.
type Registered = (Vec<(String, u64)>, Vec<String>);

/// Moves the files a task left under `task_rel` into the spool and registers them under
/// `output` in the grid. Files are first renamed into a directory only the node can reach, so
/// the task's account can no longer swap them for links, and must be regular files with one
/// link owned by that account.
fn register_outputs(
    root: &Path,
    task_rel: &Path,
    link: &dyn MetaLink,
    grant: &SignedGrant,
    output: &str,
    uid: u32,
) -> Result<Registered, ErrorInfo> {
    use cap_std::fs::MetadataExt;
    let io = |what: &str, e: std::io::Error| transfer::error::io_info(what, &e);
    let root_dir = Dir::open_ambient_dir(root, cap_std::ambient_authority())
        .map_err(|e| io("node root", e))?;
    let task_dir = root_dir
        .open_dir(task_rel)
        .map_err(|e| io("task directory", e))?;
    let stage_rel = task_rel.with_extension("stage");
    root_dir
        .create_dir(&stage_rel)
        .map_err(|e| io("staging directory", e))?;
    let stage = root_dir
        .open_dir(&stage_rel)
        .map_err(|e| io("staging directory", e))?;
    let mut notes = Vec::new();
    let mut staged: Vec<(String, String)> = Vec::new();
    collect(&task_dir, "", &stage, &mut staged, &mut notes, 0)?;
    let mut files = Vec::new();
    let mut kept = Vec::new();
    for (name, sname) in staged {
        let m = match stage.symlink_metadata(&sname) {
            Ok(m) => m,
            Err(e) => {
                notes.push(format!("{name}: {e}"));
                continue;
            }
        };
        if !m.is_file() || m.nlink() != 1 || (transfer::sys::effective_uid() == 0 && m.uid() != uid)
        {
            notes.push(format!(
                "{name}: not registered (not a regular file with one link owned by the task's account)"
            ));
            continue;
        }
        // The replica belongs to the node from now on.
        let f = stage.open(&sname).map_err(|e| io(&name, e))?.into_std();
        if transfer::sys::effective_uid() == 0 {
            let _ = std::os::unix::fs::fchown(&f, Some(0), Some(0));
        }
        let mode = m.mode() & 0o777;
        let _ = f.set_permissions(std::fs::Permissions::from_mode(0o644));
        let (size, digests) = crate::digest::digest_reader(f, &[]);
        let digests = digests.map_err(|e| io(&name, e))?;
        let mtime = m
            .modified()
            .ok()
            .and_then(|t| t.into_std().duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| Timestamp {
                secs: d.as_secs() as i64,
                nanos: d.subsec_nanos(),
            })
            .unwrap_or_default();
        files.push(OutputFile {
            name: name.clone(),
            size,
            digests,
            mtime,
            mode,
        });
        kept.push(sname);
    }
    let mut registered = Vec::new();
    if !files.is_empty() {
        let ids = link.register_outputs(grant, output, &files)?;
        for ((f, sname), id) in files.iter().zip(&kept).zip(ids) {
            let grid_path = format!("{}/{}", output.trim_end_matches('/'), f.name);
            let id = match id {
                Ok(id) => id,
                Err(e) => {
                    notes.push(format!("{grid_path}: not registered: {}", e.message));
                    continue;
                }
            };
            if id < 0 {
                // An empty file: complete in the catalog, no replica to keep.
                let _ = stage.remove_file(sname);
                registered.push((grid_path, 0));
                continue;
            }
            let dest = spool::spool_path(id);
            if let Some(parent) = dest.parent() {
                root_dir
                    .create_dir_all(parent)
                    .map_err(|e| io("spool directory", e))?;
            }
            stage
                .rename(sname, &root_dir, &dest)
                .map_err(|e| io(&grid_path, e))?;
            match link.committed(id, f.size, &f.digests, f.mtime) {
                Ok(()) => registered.push((grid_path, f.size)),
                Err(e) => {
                    let _ = root_dir.remove_file(&dest);
                    notes.push(format!("{grid_path}: not registered: {}", e.message));
                }
            }
        }
    }
    let _ = root_dir.remove_dir_all(&stage_rel);
    Ok((registered, notes))
}

/// Renames every regular file below `dir` into `stage` (flat names), depth-first.
fn collect(
    dir: &Dir,
    prefix: &str,
    stage: &Dir,
    staged: &mut Vec<(String, String)>,
    notes: &mut Vec<String>,
    depth: usize,
) -> Result<(), ErrorInfo> {
    const MAX_OUTPUTS: usize = 10_000;
    let entries = dir
        .entries()
        .map_err(|e| transfer::error::io_info("task directory", &e))?;
    let mut names: Vec<(String, cap_std::fs::FileType)> = Vec::new();
    for e in entries.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        match e.file_name().into_string() {
            Ok(n) => names.push((n, ft)),
            Err(n) => notes.push(format!("{n:?}: not registered (name is not UTF-8)")),
        }
    }
    names.sort_by(|a, b| a.0.cmp(&b.0));
    for (n, ft) in names {
        let rel = if prefix.is_empty() {
            n.clone()
        } else {
            format!("{prefix}/{n}")
        };
        if ft.is_dir() && depth < 16 {
            if let Ok(sub) = dir.open_dir(&n) {
                collect(&sub, &rel, stage, staged, notes, depth + 1)?;
            }
        } else if ft.is_file() {
            if staged.len() >= MAX_OUTPUTS {
                notes.push(format!(
                    "{rel}: not registered (more than {MAX_OUTPUTS} outputs)"
                ));
                continue;
            }
            let sname = format!("{}", staged.len());
            match dir.rename(&n, stage, &sname) {
                Ok(()) => staged.push((rel, sname)),
                Err(e) => notes.push(format!("{rel}: {e}")),
            }
        } else {
            notes.push(format!("{rel}: not registered (not a regular file)"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_substituted_everywhere() {
        let argv: Vec<String> = ["sh", "-c", "wc -c {} > {out}/{name}.n", "{path}"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let got = substitute(&argv, "/n/data/01/02/x", "/cmip/tas/a.nc", "/n/.run/r/t1");
        assert_eq!(
            got,
            [
                "sh",
                "-c",
                "wc -c /n/data/01/02/x > /n/.run/r/t1/a.nc.n",
                "/cmip/tas/a.nc"
            ]
        );
    }

    #[test]
    fn root_is_refused_and_unknown_accounts_are_named() {
        let e = account("root", "n1").unwrap_err();
        assert!(
            e.message.contains("never runs tasks as root"),
            "{}",
            e.message
        );
        let e = account("no-such-user-xyz", "n1").unwrap_err();
        assert!(e.message.contains("no local account"), "{}", e.message);
    }

    #[test]
    fn only_the_head_of_a_stream_is_kept() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let data = vec![b'x'; OUTPUT_KEPT + 100];
        let (kept, extra) = rt.block_on(read_head(Some(&data[..])));
        assert_eq!(kept.len(), OUTPUT_KEPT);
        assert_eq!(extra, 100);
    }
}
