//! The data-plane engine's server side: one TCP port, its connection limits and timeouts, the
//! control connections, sessions and their data streams. What is served is the business of
//! the endpoint's personality, a [`Service`]: `haul serve` exports a directory tree
//! (`tree::TreeService`), a storage node its spool (crate `node`).
//!
//! One TCP port carries everything. A control connection (TLS 1.3, client certificate mapped
//! to a local identity by the mapfile) opens a sink or source session; the session's data
//! connections arrive on the same port and bind to it by proving the session key. For a
//! third-party transfer the source endpoint itself connects to the destination endpoint, so
//! the data never passes through the client.

use crate::conn::{
    self, Accepted, ClientTls, ControlReader, ControlWriter, DataConn, Io, StreamTarget,
};
use crate::error::TransferError;
use crate::limits::{ConnLimiter, Limits};
use crate::metrics::{Direction, SessionTally};
use crate::pool::MemoryBudget;
use crate::progress::{Counters, Event};
use crate::service::{Caller, Service, SinkNaming, SourceList, SourceSelection};
use crate::sink_session::{SinkSpec, run_sink};
use crate::source_session::{SourceSpec, run_source};
use crate::store::{Root, SourceEntry};
use crate::sys;
use crate::translog::{self, Recorder, Role, SessionFacts, TransferLog};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use wire::control::{
    self, Bind, BindResult, DataKey, HostLimits, Protect, PushTarget, Request, Response, SessionId,
    SessionOptions, SessionSummary,
};
use wire::error::{ErrorInfo, ErrorKind};
use wire::plan::{Choices, PathFacts, plan};

/// TLS material of an endpoint: its server configuration (client certificates required) and a
/// client configuration with its host certificate, used to push data to other endpoints.
#[derive(Clone)]
pub struct EndpointTls {
    pub server: Arc<rustls::ServerConfig>,
    pub client: Arc<rustls::ClientConfig>,
    /// The names this endpoint answers to in users' delegations (its host certificate's; empty
    /// when `server` accepts no delegation).
    pub delegation_hosts: Vec<String>,
}

/// Configuration of an endpoint.
pub struct EndpointConfig {
    pub root: PathBuf,
    /// `None` runs without TLS (`--insecure`, local tests only).
    pub tls: Option<EndpointTls>,
    /// What is served: who is admitted, where received files go, what may be read.
    pub service: Arc<dyn Service>,
    /// Connections at once (in all and per source), handshake and idle timeouts.
    pub limits: Limits,
    /// Link rate assumed when planning pushes (bits/s).
    pub link_bps: u64,
    /// How often received files are synced and their restart ledgers written.
    pub checkpoint_interval: Duration,
    /// Live figures for whoever runs the endpoint (a storage node reports them).
    pub stats: Arc<EndpointStats>,
    /// Where each file, session and refused authentication is recorded (`--log-transfer`).
    pub log: Option<Arc<TransferLog>>,
    /// Each session this endpoint sends in is traced into `DIR/<session id>.trace.jsonl`
    /// (`--trace-dir`).
    pub trace_dir: Option<PathBuf>,
}

pub use crate::metrics::EndpointStats;

struct Registered {
    key: DataKey,
    protect: Protect,
    /// The transfer direction its streams count under (`None`: a path test's).
    direction: Option<Direction>,
    conns: mpsc::Sender<DataConn>,
    seen: Mutex<HashSet<u32>>,
}

struct Endpoint {
    cfg: EndpointConfig,
    root: Arc<Root>,
    sessions: Mutex<HashMap<SessionId, Arc<Registered>>>,
    limits: HostLimits,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    /// Block buffer bytes of all receiving sessions together.
    buffers: Arc<tokio::sync::Semaphore>,
    /// Push targets that proved to be endpoints of this CA, and when (address, server name).
    push_targets: Mutex<HashMap<(String, String), std::time::Instant>>,
    /// A UDP path test is running (one at a time: see `perf`).
    udp_test: std::sync::atomic::AtomicBool,
}

/// Serves until `shutdown` completes. Connections beyond the limits are refused as they are
/// accepted (see [`crate::limits`]).
pub async fn run(
    cfg: EndpointConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), TransferError> {
    let root = Root::confined(&cfg.root).map_err(|e| {
        TransferError::usage(format!(
            "cannot export {}: {e} (it must be an existing directory)",
            cfg.root.display()
        ))
    })?;
    let acceptor = cfg
        .tls
        .as_ref()
        .map(|t| tokio_rustls::TlsAcceptor::from(t.server.clone()));
    // On hosts whose explicit buffers may reach autotuning's ceiling (tuned data transfer
    // nodes), accepted data connections start with a window that is not limited by
    // tcp_rmem's small default: slow start on long paths is not held back by the receiver.
    let limits = sys::host_limits();
    if limits.core_rmem_max >= limits.tcp_rmem_max && limits.tcp_rmem_max >= 16 << 20 {
        let _ = sys::set_listener_recv_buffer(&listener, limits.tcp_rmem_max);
    }
    let limiter = ConnLimiter::new(cfg.limits.clone());
    let cfg_total_buffer = cfg.limits.total_buffer;
    let ep = Arc::new(Endpoint {
        cfg,
        root: Arc::new(root),
        sessions: Mutex::new(HashMap::new()),
        limits: sys::host_limits(),
        acceptor,
        buffers: MemoryBudget::shared(cfg_total_buffer),
        push_targets: Mutex::new(HashMap::new()),
        udp_test: std::sync::atomic::AtomicBool::new(false),
    });
    let stop = CancellationToken::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (tcp, addr) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(admission) = limiter.admit(addr.ip()) else {
                    ep.cfg.stats.metrics.connection_refused();
                    crate::limits::reset(tcp);
                    continue;
                };
                let open = ep.cfg.stats.metrics.connection_opened();
                let ep = ep.clone();
                let stop = stop.child_token();
                // Every log line of this connection names its peer and, once known, its
                // mapped user; sessions and their streams are spans inside it.
                let span = tracing::info_span!(
                    "connection",
                    peer = %addr,
                    user = tracing::field::Empty
                );
                tokio::spawn(
                    async move {
                        handle(ep, tcp, addr.to_string(), stop).await;
                        drop((admission, open));
                    }
                    .instrument(span),
                );
            }
            _ = &mut shutdown => break,
        }
    }
    // Stop accepting; give running sessions a moment to notice their clients are gone.
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}

async fn handle(
    ep: Arc<Endpoint>,
    tcp: tokio::net::TcpStream,
    peer: String,
    stop: CancellationToken,
) {
    let deadline = tokio::time::Instant::now() + ep.cfg.limits.handshake_timeout;
    let mut refusal = None;
    let accepted = conn::accept(tcp, ep.acceptor.as_ref(), &peer, deadline, &mut refusal);
    match accepted.await {
        Ok(Accepted::Data { io, bind, nonce }) => {
            bind_data(&ep, io, bind, nonce, &peer, deadline).await
        }
        Ok(Accepted::Control {
            io,
            subject,
            delegation,
            first,
        }) => {
            let _ = sys::set_keepalive(io.tcp());
            // Capabilities serve only the certificate they were issued to.
            let presenter = match &io {
                conn::Io::Tls(s) => crate::certid::peer_fingerprint(s.get_ref().1),
                conn::Io::Plain(_) => None,
            };
            let addrs = (io.tcp().local_addr(), io.tcp().peer_addr());
            let conn = conn::ControlConn::new(io, first, peer.clone());
            let addrs = match addrs {
                (Ok(l), Ok(p)) => Some((l, p)),
                _ => None,
            };
            let who = Who {
                subject,
                presenter,
                delegation,
            };
            if let Err(e) = control(ep, conn, who, addrs, stop).await {
                tracing::debug!(%peer, error = %e, "control connection ended");
            }
        }
        Err(e) => {
            let subject = refusal.as_ref().and_then(|r| r.subject.as_deref());
            tracing::info!(%peer, ?subject, error = %e, "connection refused");
            if let (Some(log), Some(_)) = (&ep.cfg.log, &refusal) {
                log.refused(&peer, subject, e.message());
            }
        }
    }
}

async fn refuse(mut io: Io, e: ErrorInfo, peer: &str) {
    tracing::info!(%peer, error = %e.message, "data connection refused");
    let _ = conn::write_all(
        &mut io,
        &control::encode_bind_result(&BindResult::Refused(e)),
        peer,
    )
    .await;
}

async fn bind_data(
    ep: &Endpoint,
    mut io: Io,
    bind: Bind,
    nonce: [u8; 32],
    peer: &str,
    deadline: tokio::time::Instant,
) {
    if bind.version != control::PROTOCOL_VERSION {
        let e = ErrorInfo::new(
            ErrorKind::Protocol,
            format!("protocol version {} not supported", bind.version),
        );
        return refuse(io, e, peer).await;
    }
    // The control request creating the session may still be on its way: wait for it, within
    // the connection's handshake deadline (the bind is not authenticated before).
    let mut reg = None;
    while tokio::time::Instant::now() < deadline {
        if let Some(r) = ep
            .sessions
            .lock()
            .expect("sessions lock")
            .get(&bind.session)
        {
            reg = Some(r.clone());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let Some(reg) = reg else {
        return refuse(
            io,
            ErrorInfo::new(ErrorKind::Authentication, "unknown or finished session"),
            peer,
        )
        .await;
    };
    if !control::verify_bind_proof(&reg.key, &nonce, &bind.session, bind.stream, &bind.proof) {
        return refuse(
            io,
            ErrorInfo::new(ErrorKind::Authentication, "session proof does not verify"),
            peer,
        )
        .await;
    }
    if reg.protect == Protect::Private && !io.is_tls() {
        let e = ErrorInfo::new(
            ErrorKind::Authentication,
            "this session is private: data streams must use TLS",
        );
        return refuse(io, e, peer).await;
    }
    if bind.stream >= ep.cfg.limits.max_streams {
        let e = ErrorInfo::new(
            ErrorKind::Invalid,
            format!(
                "stream {} refused: this endpoint takes at most {} streams per session (--max-streams)",
                bind.stream, ep.cfg.limits.max_streams
            ),
        );
        return refuse(io, e, peer).await;
    }
    if !reg.seen.lock().expect("seen lock").insert(bind.stream) {
        let e = ErrorInfo::new(
            ErrorKind::Protocol,
            format!("stream {} already bound", bind.stream),
        );
        return refuse(io, e, peer).await;
    }
    if let Some(b) = bind.buffer {
        let _ = sys::set_send_buffer(io.tcp(), b);
    }
    if conn::write_all(
        &mut io,
        &control::encode_bind_result(&BindResult::Accepted),
        peer,
    )
    .await
    .is_err()
    {
        return;
    }
    tracing::debug!(%peer, stream = bind.stream, "data stream bound");
    let _ = reg
        .conns
        .send(DataConn {
            stream: bind.stream,
            io,
            await_bind: false,
            open: reg.direction.map(|d| ep.cfg.stats.metrics.stream_opened(d)),
        })
        .await;
}

struct SessionGuard<'a> {
    ep: &'a Endpoint,
    id: SessionId,
}

impl Drop for SessionGuard<'_> {
    fn drop(&mut self) {
        self.ep
            .sessions
            .lock()
            .expect("sessions lock")
            .remove(&self.id);
    }
}

fn register(
    ep: &Endpoint,
    id: SessionId,
    key: DataKey,
    protect: Protect,
    direction: Option<Direction>,
) -> Result<mpsc::Receiver<DataConn>, ErrorInfo> {
    let (tx, rx) = mpsc::channel(256);
    let mut sessions = ep.sessions.lock().expect("sessions lock");
    if sessions.contains_key(&id) {
        return Err(ErrorInfo::new(
            ErrorKind::Invalid,
            "session id already in use",
        ));
    }
    sessions.insert(
        id,
        Arc::new(Registered {
            key,
            protect,
            direction,
            conns: tx,
            seen: Mutex::new(HashSet::new()),
        }),
    );
    Ok(rx)
}

/// Who opened a control connection, from the certificates TLS verified.
struct Who {
    subject: Option<String>,
    presenter: Option<crate::certid::Fingerprint>,
    /// The scope of the user's delegation, when the client presented one.
    delegation: Option<crate::delegation::Scope>,
}

/// Refuses, before anything is resolved, what a delegated session may not do: anything but
/// stat, list, read and write, and any path outside the delegation's scope at this endpoint.
fn delegated(
    ep: &Endpoint,
    scope: &crate::delegation::Scope,
    req: &Request,
) -> Result<(), ErrorInfo> {
    use crate::delegation::Access;
    let hosts = ep
        .cfg
        .tls
        .as_ref()
        .map(|t| t.delegation_hosts.as_slice())
        .unwrap_or_default();
    let check = |access: Access, path: &str| {
        if scope.permits(hosts, access, path) {
            Ok(())
        } else {
            Err(ErrorInfo::new(
                ErrorKind::PermissionDenied,
                format!(
                    "{path}: outside the delegation's scope ({} {path} is not delegated at this endpoint)",
                    access.name()
                ),
            ))
        }
    };
    match req {
        Request::Hello { .. } | Request::Cancel | Request::PerfSent { .. } => Ok(()),
        Request::Stat { path } | Request::List { path, .. } => check(Access::Read, path),
        Request::OpenSink { dest, .. } => check(Access::Write, dest),
        Request::OpenSource { path, files, .. } => {
            if files.is_empty() || !path.is_empty() {
                check(Access::Read, path)?;
            }
            files
                .iter()
                .try_for_each(|f| check(Access::Read, &f.locator))
        }
        _ => Err(ErrorInfo::new(
            ErrorKind::PermissionDenied,
            "a delegated credential may only stat, list, read and write",
        )),
    }
}

async fn control(
    ep: Arc<Endpoint>,
    conn: conn::ControlConn,
    who: Who,
    addrs: Option<(std::net::SocketAddr, std::net::SocketAddr)>,
    stop: CancellationToken,
) -> Result<(), TransferError> {
    let Who {
        subject,
        presenter,
        delegation,
    } = who;
    let (mut reader, mut writer) = conn.split();
    let peer = reader.peer.clone();
    if ep.acceptor.is_some() && subject.is_none() {
        let e = ErrorInfo::new(ErrorKind::Authentication, "no client certificate");
        if let Some(log) = &ep.cfg.log {
            log.refused(&peer, None, &e.message);
        }
        let _ = writer.send_response(&Response::Error(e)).await;
        return Err(TransferError::unauthenticated("no client certificate"));
    }
    // Without TLS nobody has a subject (`--insecure`: the service decides what that means).
    let subject = subject.filter(|_| ep.acceptor.is_some());
    let admitted = match ep.cfg.service.admit(subject.as_deref(), &ep.root) {
        Ok(a) => a,
        Err(e) => {
            tracing::info!(%peer, subject = ?subject, error = %e.message, "identity refused");
            if let Some(log) = &ep.cfg.log {
                log.refused(&peer, subject.as_deref(), &e.message);
            }
            let _ = writer.send_response(&Response::Error(e.clone())).await;
            return Err(e.into());
        }
    };
    let caller = Caller {
        subject,
        presenter: presenter.map(|f| f.as_bytes().to_vec()),
        identity: admitted.identity,
        root: admitted.root,
    };
    let identity = caller.identity.clone();
    tracing::Span::current().record("user", tracing::field::display(&identity));
    tracing::info!(peer = %reader.peer, %identity, "control connection");
    let ctl = &mut Control {
        reader: &mut reader,
        writer: &mut writer,
    };
    let idle = ep.cfg.limits.idle_timeout;
    // Sessions asked on this connection (a client may reuse it for the next one).
    let mut sessions = 0u32;
    loop {
        // A whole request (header and body) must arrive within the idle timeout: a peer that
        // stops talking, or trickles a frame, gives its connection back.
        let req = tokio::select! {
            r = tokio::time::timeout(idle, ctl.reader.request()) => match r {
                Ok(r) => r?,
                Err(_) => {
                    tracing::debug!(peer = %ctl.reader.peer, ?idle, "idle control connection closed");
                    return Ok(());
                }
            },
            _ = stop.cancelled() => return Ok(()),
        };
        let Some(req) = req else { return Ok(()) };
        if matches!(req, Request::OpenSink { .. } | Request::OpenSource { .. }) {
            if sessions > 0 && crate::faults::drop_reused_control() {
                tracing::info!(peer = %ctl.reader.peer, "fault injection: closing a reused control connection unanswered");
                return Ok(());
            }
            sessions = sessions.saturating_add(1);
        }
        if let Some(scope) = &delegation
            && let Err(e) = delegated(&ep, scope, &req)
        {
            tracing::info!(peer = %ctl.reader.peer, %identity, error = %e.message, "delegated request refused");
            ctl.writer.send_response(&Response::Error(e)).await?;
            continue;
        }
        match req {
            Request::Hello { version, .. } => {
                let reply = Response::Welcome {
                    version: control::PROTOCOL_VERSION,
                    agent: format!("haul/{}", env!("CARGO_PKG_VERSION")),
                    identity: identity.clone(),
                    subject: caller.subject.clone().unwrap_or_default(),
                    limits: ep.limits.clone(),
                };
                ctl.writer.send_response(&reply).await?;
                if version != control::PROTOCOL_VERSION {
                    return Ok(());
                }
            }
            Request::Stat { path } => {
                let reply = match ep.cfg.service.stat(&caller, &path) {
                    Ok(info) => Response::Stat(info),
                    Err(e) => Response::Error(e),
                };
                ctl.writer.send_response(&reply).await?;
            }
            Request::List { path, recursive } => {
                let request = SourceSelection {
                    path,
                    recursive,
                    files: Vec::new(),
                    grant: None,
                    limit: Some(control::MAX_LISTING),
                };
                match source_list(&ep, &caller, request).await {
                    Ok(list) => send_listing(ctl.writer, list).await?,
                    Err(e) => ctl.writer.send_response(&Response::Error(e)).await?,
                }
            }
            Request::Cancel | Request::PerfSent { .. } => {}
            Request::Perf { session, key, test } => {
                perf(&ep, ctl, session, key, test, addrs)
                    .instrument(session_span(&session))
                    .await?
            }
            Request::Service(body) => {
                ep.cfg
                    .service
                    .serve(&caller, body, ctl.reader, ctl.writer)
                    .await?
            }
            Request::OpenSink {
                session,
                key,
                dest,
                into_dir,
                options,
                grant,
            } => {
                let naming =
                    match ep
                        .cfg
                        .service
                        .sink_naming(&caller, &dest, into_dir, grant.as_ref())
                    {
                        Ok(n) => n,
                        Err(e) => {
                            ctl.writer.send_response(&Response::Error(e)).await?;
                            continue;
                        }
                    };
                let open = SessionOpen {
                    id: session,
                    key,
                    options,
                };
                sink(&ep, &caller, ctl, open, naming)
                    .instrument(session_span(&session))
                    .await?;
            }
            Request::OpenSource {
                session,
                key,
                path,
                recursive,
                range,
                options,
                push,
                files,
                grant,
            } => {
                let request = SourceSelection {
                    path,
                    recursive,
                    files,
                    grant,
                    limit: None,
                };
                let list = match source_list(&ep, &caller, request).await {
                    Ok(l) => l,
                    Err(e) => {
                        ctl.writer.send_response(&Response::Error(e)).await?;
                        continue;
                    }
                };
                for (path, error) in list.unsendable {
                    ctl.writer
                        .send_response(&Response::FileFailed { path, error })
                        .await?;
                }
                let open = SessionOpen {
                    id: session,
                    key,
                    options,
                };
                let push = push.map(|p| *p);
                source(&ep, &caller, ctl, open, list.entries, range, push)
                    .instrument(session_span(&session))
                    .await?;
            }
        }
    }
}

/// Runs a path test (`haul perf`) for an admitted caller, within this endpoint's limits.
async fn perf(
    ep: &Endpoint,
    ctl: &mut Control<'_>,
    session: SessionId,
    key: DataKey,
    test: wire::perf::PerfRequest,
    addrs: Option<(std::net::SocketAddr, std::net::SocketAddr)>,
) -> Result<(), TransferError> {
    let limits = &ep.cfg.limits;
    let max_ms = limits.perf_max.as_millis() as u64;
    let checked = wire::perf::check_request(&test, max_ms, limits.max_streams)
        .map_err(|m| ErrorInfo::new(ErrorKind::Invalid, m))
        .and_then(|()| {
            addrs.ok_or_else(|| {
                ErrorInfo::new(ErrorKind::Io, "the connection's addresses are unknown")
            })
        });
    let (local, peer) = match checked {
        Ok(a) => a,
        Err(e) => {
            tracing::info!(peer = %ctl.reader.peer, error = %e.message, "path test refused");
            return ctl.writer.send_response(&Response::Error(e)).await;
        }
    };
    let conns = match &test.spec {
        wire::perf::PerfSpec::Tcp { private, .. } => {
            let protect = if *private {
                Protect::Private
            } else {
                Protect::Clear
            };
            match register(ep, session, key, protect, None) {
                Ok(rx) => Some(rx),
                Err(e) => return ctl.writer.send_response(&Response::Error(e)).await,
            }
        }
        wire::perf::PerfSpec::Udp { .. } => None,
    };
    let _guard = conns.is_some().then_some(SessionGuard { ep, id: session });
    tracing::info!(peer = %ctl.reader.peer, ?test, "path test");
    crate::perf::serve(
        ctl.reader,
        ctl.writer,
        key,
        test,
        conns,
        local,
        peer,
        &ep.udp_test,
        limits.handshake_timeout,
    )
    .await
}

/// Bytes of names per `Listing` frame (well under a control message's limit).
const LISTING_FRAME_BYTES: usize = 256 * 1024;

/// Answers `List` with `list` in frames of at most [`LISTING_FRAME_BYTES`] of names.
async fn send_listing(
    writer: &mut crate::conn::ControlWriter,
    list: SourceList,
) -> Result<(), TransferError> {
    if list.entries.len() + list.unsendable.len() > control::MAX_LISTING {
        let e = ErrorInfo::new(
            ErrorKind::Invalid,
            format!(
                "more than {} entries: copy the tree in parts",
                control::MAX_LISTING
            ),
        );
        return writer.send_response(&Response::Error(e)).await;
    }
    let mut entries = Vec::new();
    let mut unsendable = Vec::new();
    let mut bytes = 0;
    let mut sent = false;
    let mut items = list
        .entries
        .into_iter()
        .map(Ok)
        .chain(list.unsendable.into_iter().map(Err))
        .peekable();
    while let Some(item) = items.next() {
        match item {
            Ok(e) => {
                bytes += e.rel.len() + 32;
                entries.push(control::ListingEntry {
                    rel: e.rel,
                    is_dir: e.kind == wire::data::EntryKind::Dir,
                    size: e.size,
                    mode: e.mode,
                    mtime: e.mtime,
                });
            }
            Err((rel, error)) => {
                bytes += rel.len() + error.message.len() + 32;
                unsendable.push((rel, error));
            }
        }
        let last = items.peek().is_none();
        if last || bytes >= LISTING_FRAME_BYTES {
            writer
                .send_response(&Response::Listing {
                    entries: std::mem::take(&mut entries),
                    unsendable: std::mem::take(&mut unsendable),
                    last,
                })
                .await?;
            bytes = 0;
            sent = true;
        }
    }
    if !sent {
        // Nothing to list: one empty, last part.
        writer
            .send_response(&Response::Listing {
                entries,
                unsendable,
                last: true,
            })
            .await?;
    }
    Ok(())
}

/// What a source session sends, as the service lists it on a blocking thread.
async fn source_list(
    ep: &Arc<Endpoint>,
    caller: &Caller,
    request: SourceSelection,
) -> Result<SourceList, ErrorInfo> {
    let (service, caller) = (ep.cfg.service.clone(), caller.clone());
    tokio::task::spawn_blocking(move || service.source_list(&caller, request))
        .await
        .map_err(|e| ErrorInfo::new(ErrorKind::Io, format!("enumeration failed: {e}")))?
}

/// The span of one transfer session on this endpoint: its id as the client chose it (the same
/// id is in the client's and, for third-party copies, the other endpoint's logs).
fn session_span(id: &control::SessionId) -> tracing::Span {
    tracing::info_span!("session", id = %hex::encode(id))
}

/// The control connection a session runs on: requests in, responses out.
struct Control<'a> {
    reader: &'a mut ControlReader,
    writer: &'a mut ControlWriter,
}

/// What every request opening a session carries.
struct SessionOpen {
    id: SessionId,
    key: DataKey,
    options: SessionOptions,
}

/// A running session's live state on this endpoint: its counters, the events its machines
/// send (relayed to the client) and its cancellation.
struct Live {
    counters: Arc<Counters>,
    events: mpsc::UnboundedReceiver<Event>,
    cancel: CancellationToken,
    /// Writes the session's records when the endpoint keeps a transfer log.
    recorder: Option<Recorder>,
    /// Counts the session into the endpoint's figures and metrics.
    tally: SessionTally,
}

impl Live {
    /// A new session's, and the sender its machines report events on.
    fn new(
        recorder: Option<Recorder>,
        tally: SessionTally,
    ) -> (Self, crate::progress::EventSender) {
        let (tx, events) = mpsc::unbounded_channel();
        let live = Live {
            counters: Arc::default(),
            events,
            cancel: CancellationToken::new(),
            recorder,
            tally,
        };
        (live, tx)
    }

    /// Writes the session's own record (when there is a log) and hands the result on.
    fn finish(
        &mut self,
        result: Result<SessionSummary, TransferError>,
    ) -> Result<SessionSummary, TransferError> {
        self.tally.finish(&result);
        if let Some(r) = &self.recorder {
            r.finish(match &result {
                Ok(summary) => Ok(summary.into()),
                Err(e) => Err(e.to_info()),
            });
        }
        result
    }
}

/// The facts of a session on this endpoint for its transfer log records.
fn session_facts(
    ep: &Endpoint,
    caller: &Caller,
    peer: &str,
    id: &SessionId,
    role: Role,
    options: &SessionOptions,
) -> Option<Recorder> {
    let log = ep.cfg.log.clone()?;
    let mut facts = SessionFacts::new(translog::guid(id), role, options);
    facts.user = caller.identity.clone();
    facts.subject = caller.subject.clone();
    facts.peer = peer.to_string();
    Some(Recorder::new(log, facts))
}

/// Forwards a session's events and progress to the client until it finishes, and hands each
/// event to the session's transfer log. A closed control connection, one that cannot be
/// written, or `Cancel` cancels the session, which still runs to its end: what it did is
/// recorded (ledgers, the transfer log) even when nobody is left to tell.
async fn relay<T>(
    ctl: &mut Control<'_>,
    live: &mut Live,
    run: impl Future<Output = Result<T, TransferError>>,
) -> Result<T, TransferError> {
    let Control { reader, writer } = ctl;
    let Live {
        counters,
        events,
        cancel,
        recorder,
        tally,
    } = live;
    tokio::pin!(run);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut control_open = true;
    let mut client_gone = false;
    // Set when the client closed its side of the control connection.
    let mut grace: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        tokio::select! {
            r = &mut run => {
                tally.bytes(Counters::get(&counters.bytes_done));
                while let Ok(ev) = events.try_recv() {
                    tally.on_event(&ev);
                    if let Some(rec) = recorder.as_mut() {
                        rec.on_event(&ev);
                    }
                    if !client_gone && send_event(writer, ev).await.is_err() {
                        client_gone = true;
                    }
                }
                return r;
            }
            Some(ev) = events.recv() => {
                tally.on_event(&ev);
                if let Some(rec) = recorder.as_mut() {
                    rec.on_event(&ev);
                }
                if !client_gone && send_event(writer, ev).await.is_err() {
                    client_gone = true;
                    cancel.cancel();
                }
            }
            _ = tick.tick() => {
                let now = Counters::get(&counters.bytes_done);
                tally.bytes(now);
                let p = Response::Progress {
                    bytes: now,
                    files: Counters::get(&counters.files_done),
                    skipped: Counters::get(&counters.bytes_skipped),
                };
                if !client_gone && writer.send_response(&p).await.is_err() {
                    client_gone = true;
                    cancel.cancel();
                }
            }
            req = reader.request(), if control_open => match req {
                // An upload's client closes its side once the destination acknowledged every
                // file, without waiting for the summary: the session is about to end on its
                // own, and is cancelled only if it does not within the grace. (A client that
                // vanished mid-transfer closed its data streams too, which ends the session.)
                Ok(None) => {
                    control_open = false;
                    grace = Some(Box::pin(tokio::time::sleep(CONTROL_CLOSE_GRACE)));
                }
                Ok(Some(Request::Cancel)) | Err(_) => {
                    control_open = false;
                    cancel.cancel();
                }
                Ok(Some(other)) => tracing::debug!(?other, "request ignored during a session"),
            },
            _ = async { grace.as_mut().expect("armed").await }, if grace.is_some() => {
                grace = None;
                cancel.cancel();
            }
        }
    }
}

/// How long a session may go on ending by itself after its client closed the control
/// connection (see [`relay`]).
const CONTROL_CLOSE_GRACE: Duration = Duration::from_secs(2);

async fn send_event(writer: &mut ControlWriter, ev: Event) -> Result<(), TransferError> {
    let msg = match ev {
        Event::FileDone {
            path,
            size,
            digests,
            ..
        } => Response::FileDone {
            path,
            bytes: size,
            digests,
        },
        Event::FileFailed { path, error } => Response::FileFailed { path, error },
        _ => return Ok(()),
    };
    writer.send_response(&msg).await
}

async fn finish(
    writer: &mut ControlWriter,
    result: Result<SessionSummary, TransferError>,
) -> Result<(), TransferError> {
    match result {
        Ok(summary) => writer.send_response(&Response::Done(summary)).await,
        Err(e) => writer.send_response(&Response::Error(e.to_info())).await,
    }
}

async fn sink(
    ep: &Arc<Endpoint>,
    caller: &Caller,
    ctl: &mut Control<'_>,
    open: SessionOpen,
    naming: Arc<dyn SinkNaming>,
) -> Result<(), TransferError> {
    let conns = match register(
        ep,
        open.id,
        open.key,
        open.options.protect,
        Some(Direction::Receive),
    ) {
        Ok(c) => c,
        Err(e) => return ctl.writer.send_response(&Response::Error(e)).await,
    };
    let _guard = SessionGuard { ep, id: open.id };
    ctl.writer
        .send_response(&Response::SinkReady {
            dest_is_dir: naming.dest_is_dir(),
        })
        .await?;
    let recorder = session_facts(
        ep,
        caller,
        &ctl.reader.peer,
        &open.id,
        Role::Receive,
        &open.options,
    );
    let tally = SessionTally::new(ep.cfg.stats.clone(), Direction::Receive);
    let (mut live, events) = Live::new(recorder, tally);
    let spec = SinkSpec {
        root: caller.root.clone(),
        naming,
        options: open.options,
        checkpoint_interval: ep.cfg.checkpoint_interval,
        budget: MemoryBudget::new(ep.cfg.limits.session_buffer, Some(ep.buffers.clone())),
        owner: caller.identity.clone(),
    };
    let (counters, cancel) = (live.counters.clone(), live.cancel.clone());
    let run = run_sink(spec, conns, counters.clone(), events, cancel.clone());
    let run = with_first_stream_deadline(run, &counters, &cancel);
    let result = relay(ctl, &mut live, run).await;
    let summary = live.finish(result.map(|o| o.summary()));
    finish(ctl.writer, summary).await
}

/// Fails a session whose first data connection never arrives.
async fn with_first_stream_deadline<T>(
    run: impl Future<Output = Result<T, TransferError>>,
    counters: &Counters,
    cancel: &CancellationToken,
) -> Result<T, TransferError> {
    tokio::pin!(run);
    let deadline = tokio::time::sleep(Duration::from_secs(60));
    tokio::pin!(deadline);
    tokio::select! {
        r = &mut run => r,
        _ = &mut deadline => {
            if Counters::get(&counters.activity) > 0 {
                return run.await;
            }
            cancel.cancel();
            let _ = (&mut run).await;
            Err(TransferError::connect("no data connection arrived within 60 s"))
        }
    }
}

async fn source(
    ep: &Arc<Endpoint>,
    caller: &Caller,
    ctl: &mut Control<'_>,
    open: SessionOpen,
    entries: Vec<SourceEntry>,
    range: Option<(u64, u64)>,
    push: Option<PushTarget>,
) -> Result<(), TransferError> {
    let SessionOpen {
        id: session,
        key,
        options,
    } = open;
    let writer = &mut *ctl.writer;
    if range.is_some() && (entries.len() != 1 || entries[0].kind != wire::data::EntryKind::File) {
        let e = ErrorInfo::new(
            ErrorKind::Invalid,
            "--offset/--length apply to a single file",
        );
        return writer.send_response(&Response::Error(e)).await;
    }
    let files = entries.len() as u64;
    let bytes = match range {
        Some((_, l)) => l,
        None => entries.iter().map(|e| e.size).sum(),
    };
    // The data goes to the client, or to the destination this source pushes to.
    let data_peer = push
        .as_ref()
        .map(|t| t.addr.clone())
        .unwrap_or_else(|| ctl.reader.peer.clone());
    let mut recorder = session_facts(ep, caller, &data_peer, &session, Role::Send, &options);
    if let Some(r) = recorder.as_mut() {
        r.facts.range = range;
        r.facts.zero_copy = Some(options.protect == Protect::Clear);
    }
    let tally = SessionTally::new(ep.cfg.stats.clone(), Direction::Send);
    let (mut live, events) = Live::new(recorder, tally);
    let cancel = live.cancel.clone();
    let mut options = options;
    let (conns, _guard, plan_text) = match &push {
        None => {
            let conns = match register(ep, session, key, options.protect, Some(Direction::Send)) {
                Ok(c) => c,
                Err(e) => return writer.send_response(&Response::Error(e)).await,
            };
            (conns, Some(SessionGuard { ep, id: session }), String::new())
        }
        Some(target) => {
            let (tx, rx) = mpsc::channel(64);
            let tls = match (options.protect, &ep.cfg.tls) {
                (Protect::Clear, _) => None,
                (Protect::Private, Some(t)) => Some(ClientTls {
                    config: t.client.clone(),
                }),
                (Protect::Private, None) => {
                    let e = ErrorInfo::new(
                        ErrorKind::Unsupported,
                        "--protect private needs TLS, but this endpoint runs --insecure",
                    );
                    return writer.send_response(&Response::Error(e)).await;
                }
            };
            // Push only to a longhaul endpoint of this grid's CA, and send nothing before it
            // accepted each stream: a client must not make this endpoint stream files to (or
            // even probe) any address it likes.
            if let (Some(t), Protect::Clear) = (&ep.cfg.tls, options.protect)
                && let Err(e) = verify_push_target(ep, t, target).await
            {
                return writer.send_response(&Response::Error(e)).await;
            }
            let st = StreamTarget {
                addr: target.addr.clone(),
                host: target.server_name.clone(),
                tls,
                session: target.session,
                key: target.key,
                buffer: options.tcp_buffer,
                limits: ep.limits.clone(),
                confirm_bind: true,
                hold_hello: false,
            };
            // The first stream measures the path; the plan decides how many follow.
            let first = match conn::open_data_stream(&st, 0).await {
                Ok(io) => io,
                Err(e) => return writer.send_response(&Response::Error(e.to_info())).await,
            };
            let rtt = conn::rtt(first.io.tcp()).unwrap_or(Duration::from_millis(1));
            let p = plan(
                &PathFacts {
                    rtt,
                    sender: ep.limits.clone(),
                    receiver: target.peer_limits.clone(),
                    total_bytes: bytes,
                    files,
                },
                &Choices {
                    streams: options.streams,
                    tcp_buffer: options.tcp_buffer,
                    rate_bps: options.rate_bps,
                    link_bps: ep.cfg.link_bps,
                    ..Default::default()
                },
            );
            options.streams = Some(p.streams);
            options.tcp_buffer = options.tcp_buffer.or(p.socket_buffer);
            if let Some(b) = options.tcp_buffer {
                let _ = sys::set_send_buffer(first.io.tcp(), b);
            }
            let mut st = st;
            st.buffer = options.tcp_buffer;
            let _ = tx.send(first).await;
            let n = p.streams;
            let c2 = cancel.clone();
            tokio::spawn(async move {
                conn::open_streams(st, 1, n, tx, c2).await;
            });
            (rx, None, p.explanation)
        }
    };
    writer
        .send_response(&Response::SourceReady { files, bytes })
        .await?;
    if let Some(r) = live.recorder.as_mut() {
        r.facts.streams = options.streams.unwrap_or(r.facts.streams);
        r.facts.buffer = options.tcp_buffer.unwrap_or(0);
    }
    let spec = SourceSpec {
        root: caller.root.clone(),
        entries,
        range,
        options,
        zero_copy: true,
        trace: trace_target(ep, &session, &data_peer),
    };
    let counters = live.counters.clone();
    let run = run_source(spec, conns, counters.clone(), events, cancel.clone());
    let run = with_first_stream_deadline(run, &counters, &cancel);
    let result = relay(ctl, &mut live, run).await;
    let summary = live.finish(result.map(|o| o.summary(plan_text)));
    finish(ctl.writer, summary).await
}

/// The trace of a sending session, when the endpoint traces (`--trace-dir`). A trace that
/// cannot be created is warned about and the session runs untraced.
fn trace_target(ep: &Endpoint, id: &SessionId, peer: &str) -> Option<crate::trace::TraceTarget> {
    let dir = ep.cfg.trace_dir.as_ref()?;
    let guid = translog::guid(id);
    match crate::trace::TraceFile::open(&dir.join(format!("{guid}.trace.jsonl"))) {
        Ok(file) => Some(crate::trace::TraceTarget {
            file: Arc::new(file),
            guid,
            peer: peer.to_string(),
        }),
        Err(e) => {
            tracing::warn!(error = %e, "session not traced");
            None
        }
    }
}

/// How long a push target, once it proved to be an endpoint of this grid's CA, is trusted
/// without proving it again.
const PUSH_TARGET_TRUST: Duration = Duration::from_secs(600);

/// Checks that a push target is a longhaul endpoint of this endpoint's CA, named as the client
/// said: a TLS handshake with its host certificate, verified for `server_name`. Data streams
/// of a clear session are plain TCP, so without this check a client could make this endpoint
/// connect to any address; private sessions verify the target on every stream anyway.
/// Targets that passed are remembered for a while (replication pushes to the same nodes
/// again and again).
async fn verify_push_target(
    ep: &Endpoint,
    tls: &EndpointTls,
    target: &PushTarget,
) -> Result<(), ErrorInfo> {
    let key = (target.addr.clone(), target.server_name.clone());
    if let Some(t) = ep.push_targets.lock().expect("push targets lock").get(&key)
        && t.elapsed() < PUSH_TARGET_TRUST
    {
        return Ok(());
    }
    let refused = |why: String| {
        ErrorInfo::new(
            ErrorKind::PermissionDenied,
            format!(
                "push target {} refused: not reachable as a longhaul endpoint named {} with a certificate of this CA ({why})",
                target.addr, target.server_name
            ),
        )
        .retryable(false)
    };
    let tcp = conn::connect_tcp(&target.addr, None)
        .await
        .map_err(|e| refused(e.to_string()))?;
    let client = ClientTls {
        config: tls.client.clone(),
    };
    let io = client
        .handshake(tcp, &target.server_name, &target.addr)
        .await
        .map_err(|e| refused(e.to_string()))?;
    drop(io);
    let mut known = ep.push_targets.lock().expect("push targets lock");
    known.retain(|_, t| t.elapsed() < PUSH_TARGET_TRUST);
    known.insert(key, std::time::Instant::now());
    Ok(())
}
