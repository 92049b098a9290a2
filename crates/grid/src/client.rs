//! A connection to a metadata server: gRPC over mutually authenticated TLS 1.3 (our own
//! rustls configuration, so the same certificates as the data plane), with errors turned into
//! the data plane's error kinds so that every command reports them the same way and exits
//! with the same documented codes.

use api::meta as pb;
use api::meta::files_client::FilesClient;
use api::meta::namespace_client::NamespaceClient;
use api::meta::node_service_client::NodeServiceClient;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};
use transfer::TransferError;
use transfer::client::Peer;
use wire::error::ErrorKind;

/// Default port of a metadata server.
pub const DEFAULT_META_PORT: u16 = 5811;

/// Largest gRPC message either way.
pub const MAX_MESSAGE: usize = 64 << 20;

/// A connected metadata server.
#[derive(Clone)]
pub struct MetaClient {
    pub addr: Peer,
    pub ns: NamespaceClient<Channel>,
    pub files: FilesClient<Channel>,
    pub nodes: NodeServiceClient<Channel>,
}

/// Turns a gRPC status into the error kinds (and exit codes) of the data plane. Failures below
/// gRPC are named for what they are: a certificate the server refused (TLS 1.3 reports it
/// only after the handshake, at the first request) is an authentication error with the reason,
/// a connection that broke (the server died) is a connection error.
pub fn from_status(s: tonic::Status) -> TransferError {
    if let Some(e) = transport_cause(&s) {
        return e;
    }
    let m = s.message().to_string();
    // The metadata server names the kind beside the code: it is kept as it is.
    let kind = api::errors::kind_of(&s);
    if m.is_empty() && matches!(kind, ErrorKind::Connect | ErrorKind::Unavailable) {
        return TransferError::new(kind, "metadata server unavailable");
    }
    TransferError::new(kind, m)
}

/// The last component of a grid path ("/a/b/" -> "b"; "/" stays "/").
pub fn base_name(path: &str) -> &str {
    let trimmed = path.trim_end_matches('/');
    trimmed
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or(path)
}

/// Whether a TLS handshake failed because the server speaks none of our ALPN protocols (a data
/// endpoint answers a grid command's "h2" so), whichever side noticed first.
fn is_no_application_protocol(e: &std::io::Error) -> bool {
    use rustls::{AlertDescription, Error as E};
    matches!(
        e.get_ref().and_then(|i| i.downcast_ref::<E>()),
        Some(E::NoApplicationProtocol | E::AlertReceived(AlertDescription::NoApplicationProtocol))
    )
}

/// What failed below gRPC, if that is what `s` reports: a TLS alert or error in its causes
/// (explained as the data plane does), or a broken connection.
fn transport_cause(s: &tonic::Status) -> Option<TransferError> {
    use std::error::Error;
    let mut cur: Option<&(dyn Error + 'static)> = s.source();
    let mut broken = None;
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|i| i.downcast_ref::<rustls::Error>().is_some())
            {
                return Some(transfer::tls::explain_tls_error("the metadata server", io));
            }
            // The TLS stream's error, re-made by hyper as a message: "received fatal alert: X".
            if let Some(alert) = io
                .to_string()
                .strip_prefix("received fatal alert: ")
                .and_then(alert_named)
            {
                let io = std::io::Error::other(rustls::Error::AlertReceived(alert));
                return Some(transfer::tls::explain_tls_error("the metadata server", &io));
            }
            broken.get_or_insert_with(|| io.to_string());
        }
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            let io = std::io::Error::other(r.clone());
            return Some(transfer::tls::explain_tls_error("the metadata server", &io));
        }
        if e.downcast_ref::<tonic::transport::Error>().is_some() {
            broken.get_or_insert_with(|| e.to_string());
        }
        cur = e.source();
    }
    let transport = s.code() == tonic::Code::Unknown
        && (s.message().contains("transport error") || s.message().contains("h2 protocol error"));
    if broken.is_some() || transport {
        // The request may only have seen the connection break; the refusal came on it first.
        // (Only a broken connection is explained so: a call the server answered is not.)
        if let Some(e) = REFUSED.lock().expect("refusal slot").clone() {
            return Some(e);
        }
        let why = broken.unwrap_or_else(|| s.message().to_string());
        return Some(TransferError::connect(format!(
            "connection to the metadata server lost ({why}); it may have stopped: run the command again when it is back"
        )));
    }
    None
}

/// The metadata server's refusal of our certificate, once one arrived. TLS 1.3 reports it after
/// the handshake, as an alert on the connection's next read, which a request that fails with
/// it may only see as a broken connection; `from_status` names it from here.
static REFUSED: std::sync::Mutex<Option<TransferError>> = std::sync::Mutex::new(None);

/// Whether [`REFUSED`] holds a refusal (checked on every read without taking its lock).
static REFUSAL_NOTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A connection to a metadata server that notes TLS errors arriving on it in [`REFUSED`].
struct Watched<S>(S);

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Watched<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::sync::atomic::Ordering;
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.0).poll_read(cx, buf);
        match &r {
            std::task::Poll::Ready(Err(e))
                if e.get_ref()
                    .is_some_and(|i| i.downcast_ref::<rustls::Error>().is_some()) =>
            {
                *REFUSED.lock().expect("refusal slot") =
                    Some(transfer::tls::explain_tls_error("the metadata server", e));
                REFUSAL_NOTED.store(true, Ordering::Relaxed);
            }
            // Data from the server: it accepted this connection's certificate (it speaks only
            // after verifying it), so an earlier refusal is history.
            std::task::Poll::Ready(Ok(()))
                if buf.filled().len() > before && REFUSAL_NOTED.load(Ordering::Relaxed) =>
            {
                *REFUSED.lock().expect("refusal slot") = None;
                REFUSAL_NOTED.store(false, Ordering::Relaxed);
            }
            _ => {}
        }
        r
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

/// The TLS alerts a server sends about a client certificate, by the name rustls prints.
fn alert_named(name: &str) -> Option<rustls::AlertDescription> {
    use rustls::AlertDescription as A;
    Some(match name.trim() {
        "CertificateExpired" => A::CertificateExpired,
        "UnknownCA" => A::UnknownCA,
        "BadCertificate" => A::BadCertificate,
        "DecryptError" => A::DecryptError,
        "CertificateRequired" => A::CertificateRequired,
        "CertificateRevoked" => A::CertificateRevoked,
        "CertificateUnknown" => A::CertificateUnknown,
        "UnsupportedCertificate" => A::UnsupportedCertificate,
        "AccessDenied" => A::AccessDenied,
        "HandshakeFailure" => A::HandshakeFailure,
        _ => return None,
    })
}

/// The progress reports of a long operation the server runs (replication, verification).
pub struct Reports<T>(tonic::Streaming<T>);

impl<T> Reports<T> {
    /// The next report; `None` once the server has sent the last one (or stopped).
    pub async fn next(&mut self) -> Result<Option<T>, TransferError> {
        self.0.message().await.map_err(from_status)
    }

    /// Reads reports up to the one `finished` says is the last, and returns it; `None` when
    /// the server stopped before it finished.
    pub async fn until_finished(
        mut self,
        finished: impl Fn(&T) -> bool,
    ) -> Result<Option<T>, TransferError> {
        while let Some(p) = self.next().await? {
            if finished(&p) {
                return Ok(Some(p));
            }
        }
        Ok(None)
    }
}

/// A per-file error of a batch reply: its code is a kind's name. A code this client does not
/// know (a newer server's) counts as a destination that cannot take the file.
pub fn from_file_error(e: &pb::FileError) -> TransferError {
    let kind = ErrorKind::from_name(&e.code).unwrap_or(ErrorKind::NotWritable);
    TransferError::new(kind, e.message.clone())
}

impl MetaClient {
    /// Connects (TCP, TLS with ALPN h2, HTTP/2) and fails fast with a clear message when the
    /// server cannot be reached or is not a metadata server.
    pub async fn connect(
        addr: &Peer,
        tls: Arc<rustls::ClientConfig>,
    ) -> Result<Self, TransferError> {
        let mut cfg = (*tls).clone();
        cfg.alpn_protocols = vec![transfer::tls::ALPN_GRPC.to_vec()];
        let cfg = Arc::new(cfg);
        let last_error: Arc<Mutex<Option<TransferError>>> = Arc::default();
        let (host, shown) = (addr.host.clone(), addr.to_string());
        let errors = last_error.clone();
        let connector = tower::service_fn(move |_uri: tonic::transport::Uri| {
            let (cfg, host, shown, errors) =
                (cfg.clone(), host.clone(), shown.clone(), errors.clone());
            async move {
                let r = handshake(&host, &shown, cfg).await;
                match r {
                    Ok(s) => Ok(hyper_util::rt::TokioIo::new(Watched(s))),
                    Err(e) => {
                        let msg = e.to_string();
                        *errors.lock().expect("error slot") = Some(e);
                        Err(std::io::Error::other(msg))
                    }
                }
            }
        });
        // The URI is only a label: the connector decides where to connect.
        let endpoint = Endpoint::from_shared(format!("http://{}", addr))
            .map_err(|e| TransferError::usage(format!("{addr}: {e}")))?
            .connect_timeout(Duration::from_secs(15))
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(true);
        let channel = endpoint
            .connect_with_connector(connector)
            .await
            .map_err(|e| {
                last_error
                    .lock()
                    .expect("error slot")
                    .take()
                    .unwrap_or_else(|| {
                        TransferError::connect(format!("cannot reach metadata server {addr}: {e}"))
                    })
            })?;
        Ok(Self {
            addr: addr.clone(),
            ns: NamespaceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
            files: FilesClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
            nodes: NodeServiceClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        })
    }

    // ---- namespace -------------------------------------------------------------------

    pub async fn stat(&self, path: &str) -> Result<pb::Entry, TransferError> {
        let r = self
            .ns
            .clone()
            .stat(pb::PathRequest { path: path.into() })
            .await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    /// `Ok(None)` when nothing is at `path`.
    pub async fn lookup(&self, path: &str) -> Result<Option<pb::Entry>, TransferError> {
        match self.stat(path).await {
            Ok(e) => Ok(Some(e)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn stat_many(&self, paths: Vec<String>) -> Result<pb::StatManyReply, TransferError> {
        let r = self
            .ns
            .clone()
            .stat_many(pb::StatManyRequest { paths })
            .await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    /// One page of a directory's entries: at most `limit` after the name `after` (`""`: from
    /// the start), and whether more follow.
    pub async fn list_page(
        &self,
        path: &str,
        after: &str,
        limit: u32,
    ) -> Result<(Vec<pb::Entry>, bool), TransferError> {
        let r = self
            .ns
            .clone()
            .list(pb::ListRequest {
                path: path.into(),
                after: after.into(),
                limit,
            })
            .await
            .map_err(from_status)?
            .into_inner();
        Ok((r.entries, r.more))
    }

    /// Every entry of a directory (all pages), or the file itself.
    pub async fn list(&self, path: &str) -> Result<Vec<pb::Entry>, TransferError> {
        let mut out = Vec::new();
        let mut after = String::new();
        loop {
            let r = self
                .ns
                .clone()
                .list(pb::ListRequest {
                    path: path.into(),
                    after: after.clone(),
                    limit: 10_000,
                })
                .await
                .map_err(from_status)?
                .into_inner();
            let more = r.more;
            if let Some(last) = r.entries.last() {
                after = last.path.rsplit('/').next().unwrap_or_default().to_string();
            }
            out.extend(r.entries);
            if !more {
                return Ok(out);
            }
        }
    }

    pub async fn mkdir(
        &self,
        path: &str,
        mode: u32,
        parents: bool,
    ) -> Result<pb::Entry, TransferError> {
        let r = self
            .ns
            .clone()
            .mkdir(pb::MkdirRequest {
                path: path.into(),
                mode,
                parents,
            })
            .await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    pub async fn remove(&self, path: &str, recursive: bool) -> Result<u64, TransferError> {
        let r = self
            .ns
            .clone()
            .remove(pb::RemoveRequest {
                path: path.into(),
                recursive,
            })
            .await;
        Ok(r.map_err(from_status)?.into_inner().removed)
    }

    pub async fn rename(&self, from: &str, to: &str) -> Result<pb::Entry, TransferError> {
        let r = self
            .ns
            .clone()
            .rename(pb::RenameRequest {
                from: from.into(),
                to: to.into(),
            })
            .await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    /// `mv`: renames `from` to `to`, or, when `to` is an existing directory, moves `from` into
    /// it under its own name. Returns the entry at its new path.
    pub async fn move_to(&self, from: &str, to: &str) -> Result<pb::Entry, TransferError> {
        let to = match self.lookup(to).await? {
            Some(d) if d.is_dir => format!("{}/{}", to.trim_end_matches('/'), base_name(from)),
            _ => to.to_string(),
        };
        self.rename(from, &to).await
    }

    pub async fn chmod(&self, path: &str, mode: u32) -> Result<pb::Entry, TransferError> {
        let r = self
            .ns
            .clone()
            .chmod(pb::ChmodRequest {
                path: path.into(),
                mode,
            })
            .await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    pub async fn chown(
        &self,
        path: &str,
        owner: &str,
        group: &str,
    ) -> Result<pb::Entry, TransferError> {
        let r = self
            .ns
            .clone()
            .chown(pb::ChownRequest {
                path: path.into(),
                owner: owner.into(),
                group: group.into(),
            })
            .await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    /// Sets the modification time of `path`: `Some(ns)` an explicit time (the owner only),
    /// `None` now (anyone who may write it).
    pub async fn set_mtime(
        &self,
        path: &str,
        mtime_ns: Option<i64>,
    ) -> Result<pb::Entry, TransferError> {
        let r = self
            .ns
            .clone()
            .set_mtime(pb::SetMtimeRequest {
                path: path.into(),
                mtime_ns: mtime_ns.unwrap_or(0),
                now: mtime_ns.is_none(),
            })
            .await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    pub async fn xattr_get(
        &self,
        path: &str,
        name: &str,
    ) -> Result<Option<Vec<u8>>, TransferError> {
        let r = self
            .ns
            .clone()
            .xattr_get(pb::XattrRequest {
                path: path.into(),
                name: name.into(),
            })
            .await
            .map_err(from_status)?
            .into_inner();
        Ok(r.found.then_some(r.value))
    }

    pub async fn xattr_set(
        &self,
        path: &str,
        name: &str,
        value: &[u8],
    ) -> Result<(), TransferError> {
        self.ns
            .clone()
            .xattr_set(pb::XattrSetRequest {
                path: path.into(),
                name: name.into(),
                value: value.to_vec(),
            })
            .await
            .map_err(from_status)?;
        Ok(())
    }

    pub async fn xattr_list(&self, path: &str) -> Result<Vec<pb::Xattr>, TransferError> {
        let r = self
            .ns
            .clone()
            .xattr_list(pb::PathRequest { path: path.into() })
            .await;
        Ok(r.map_err(from_status)?.into_inner().attrs)
    }

    pub async fn xattr_remove(&self, path: &str, name: &str) -> Result<(), TransferError> {
        self.ns
            .clone()
            .xattr_remove(pb::XattrRequest {
                path: path.into(),
                name: name.into(),
            })
            .await
            .map_err(from_status)?;
        Ok(())
    }

    // ---- files and nodes -------------------------------------------------------------

    pub async fn create_files(
        &self,
        req: pb::CreateFilesRequest,
    ) -> Result<pb::CreateFilesReply, TransferError> {
        let r = self.files.clone().create_files(req).await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    pub async fn abort_files(&self, ids: Vec<i64>) -> Result<(), TransferError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.files
            .clone()
            .abort_files(pb::AbortFilesRequest { ids })
            .await
            .map_err(from_status)?;
        Ok(())
    }

    pub async fn open_read(
        &self,
        req: pb::OpenReadRequest,
    ) -> Result<pb::OpenReadReply, TransferError> {
        let r = self.files.clone().open_read(req).await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    pub async fn where_is(&self, path: &str) -> Result<pb::WhereReply, TransferError> {
        let r = self
            .files
            .clone()
            .r#where(pb::PathRequest { path: path.into() })
            .await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    pub async fn nodes(&self) -> Result<Vec<pb::NodeInfo>, TransferError> {
        let r = self.files.clone().nodes(pb::Empty {}).await;
        Ok(r.map_err(from_status)?.into_inner().nodes)
    }

    pub async fn df(&self) -> Result<pb::DfReply, TransferError> {
        let r = self.files.clone().df(pb::Empty {}).await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    /// A fresh capability for files a capability of ours covered (`op` "read" or "write").
    pub async fn renew(
        &self,
        node: &str,
        op: &str,
        ids: Vec<i64>,
    ) -> Result<pb::Capability, TransferError> {
        let r = self
            .files
            .clone()
            .renew(pb::RenewRequest {
                node: node.into(),
                op: op.into(),
                ids,
            })
            .await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    /// Starts a replication on the server; its progress comes as a stream of reports.
    pub async fn replicate(
        &self,
        req: pb::ReplicateRequest,
    ) -> Result<Reports<pb::ReplicateProgress>, TransferError> {
        let r = self.files.clone().replicate(req).await;
        Ok(Reports(r.map_err(from_status)?.into_inner()))
    }

    /// Starts a verification on the server; its progress comes as a stream of reports.
    pub async fn verify(
        &self,
        req: pb::VerifyRequest,
    ) -> Result<Reports<pb::VerifyProgress>, TransferError> {
        let r = self.files.clone().verify(req).await;
        Ok(Reports(r.map_err(from_status)?.into_inner()))
    }

    /// Sets or clears a replica policy; the policies that apply now.
    pub async fn set_policy(
        &self,
        req: pb::PolicyRequest,
    ) -> Result<pb::PolicyReply, TransferError> {
        let r = self.files.clone().set_policy(req).await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    /// The replica policies below `path` the caller may see.
    pub async fn policies(&self, path: &str) -> Result<pb::PolicyReply, TransferError> {
        let r = self
            .files
            .clone()
            .policies(pb::PathRequest { path: path.into() })
            .await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    /// Policies, the reconciler's figures, nodes and recent events (`haul status`).
    pub async fn status(&self) -> Result<pb::StatusReply, TransferError> {
        let r = self.files.clone().status(pb::Empty {}).await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    /// Starts (or with `cancel` ends) the drain of a node; the node as it is now.
    pub async fn drain_node(
        &self,
        node: &str,
        cancel: bool,
    ) -> Result<pb::NodeInfo, TransferError> {
        let r = self
            .files
            .clone()
            .drain_node(pb::DrainRequest {
                node: node.into(),
                cancel,
            })
            .await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    /// Removes a stopped node from the registry (`force`: one that still holds replicas).
    pub async fn remove_node(
        &self,
        node: &str,
        force: bool,
    ) -> Result<pb::RemoveNodeReply, TransferError> {
        let r = self
            .files
            .clone()
            .remove_node(pb::RemoveNodeRequest {
                node: node.into(),
                force,
            })
            .await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    /// Records a transfer (or more of its files) in the grid's history; returns its id.
    pub async fn record_transfer(
        &self,
        req: pb::RecordTransferRequest,
    ) -> Result<i64, TransferError> {
        let r = self.files.clone().record_transfer(req).await;
        Ok(r.map_err(from_status)?.into_inner().id)
    }

    /// Records of the transfer history, newest first.
    pub async fn transfers(
        &self,
        req: pb::TransfersRequest,
    ) -> Result<Vec<pb::Transfer>, TransferError> {
        let r = self.files.clone().transfers(req).await;
        Ok(r.map_err(from_status)?.into_inner().transfers)
    }

    /// One record of the history and `limit` of its files from the `offset`th.
    pub async fn get_transfer(
        &self,
        id: i64,
        offset: u64,
        limit: u32,
    ) -> Result<pb::TransferReply, TransferError> {
        let r = self
            .files
            .clone()
            .get_transfer(pb::TransferRequest { id, offset, limit })
            .await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    /// Reports a copy in progress (id 0: a new one); returns its id.
    pub async fn report_live(&self, req: pb::LiveReport) -> Result<i64, TransferError> {
        let r = self.files.clone().report_live(req).await;
        Ok(r.map_err(from_status)?.into_inner().id)
    }

    /// The copies in progress the caller may see.
    pub async fn live(&self) -> Result<Vec<pb::LiveCopy>, TransferError> {
        let r = self.files.clone().live(pb::Empty {}).await;
        Ok(r.map_err(from_status)?.into_inner().copies)
    }

    /// Hands a job to the metadata server.
    pub async fn submit_job(
        &self,
        req: pb::SubmitJobRequest,
    ) -> Result<pb::JobInfo, TransferError> {
        let r = self.files.clone().submit_job(req).await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    /// The caller's jobs (an administrator's `all_users`: everybody's), newest first.
    pub async fn jobs(&self, req: pb::JobsRequest) -> Result<pb::JobsReply, TransferError> {
        let r = self.files.clone().jobs(req).await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    /// One job and `limit` of its files from the `offset`th (only those in `state`, if not
    /// empty).
    pub async fn get_job(
        &self,
        id: i64,
        offset: u64,
        limit: u32,
        state: &str,
    ) -> Result<pb::JobDetail, TransferError> {
        let r = self
            .files
            .clone()
            .get_job(pb::GetJobRequest {
                id,
                offset,
                limit,
                state: state.to_string(),
            })
            .await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    pub async fn cancel_job(&self, id: i64) -> Result<pb::JobInfo, TransferError> {
        let r = self.files.clone().cancel_job(pb::JobId { id }).await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    /// Retries job `id`; `delegation` (PEM chain, key): a new one for a job with endpoints.
    pub async fn retry_job(
        &self,
        id: i64,
        delegation: Option<(String, String)>,
    ) -> Result<pb::JobInfo, TransferError> {
        let (delegation_chain, delegation_key) = delegation.unwrap_or_default();
        let r = self
            .files
            .clone()
            .retry_job(pb::RetryJobRequest {
                id,
                delegation_chain,
                delegation_key,
            })
            .await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    /// A sign-in link for the dashboard (good once, for two minutes).
    pub async fn dashboard_login(&self) -> Result<pb::DashboardLoginReply, TransferError> {
        let r = self.files.clone().dashboard_login(pb::Empty {}).await;
        Ok(r.map_err(from_status)?.into_inner())
    }

    pub async fn who_am_i(&self) -> Result<pb::Identity, TransferError> {
        let r = self.files.clone().who_am_i(pb::Empty {}).await;
        Ok(r.map_err(from_status)?.into_inner())
    }
}

/// TCP and TLS to `host:port`; a data endpoint (which does not speak HTTP/2) is named as such.
async fn handshake(
    host: &str,
    shown: &str,
    cfg: Arc<rustls::ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, TransferError> {
    let tcp = transfer::conn::connect_tcp(shown, None)
        .await
        .map_err(|e| match e.kind() {
            ErrorKind::Connect => {
                let m = format!("metadata server unreachable: {e}");
                e.with_message(m)
            }
            _ => e,
        })?;
    let _ = tcp.set_nodelay(true);
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|_| TransferError::usage(format!("{host:?} is not a valid host name")))?;
    let connector = tokio_rustls::TlsConnector::from(cfg);
    let tls = tokio::time::timeout(Duration::from_secs(15), connector.connect(name, tcp))
        .await
        .map_err(|_| TransferError::connect(format!("{shown}: TLS handshake timed out")))?
        .map_err(|e| {
            if is_no_application_protocol(&e) {
                TransferError::usage(format!(
                    "{shown} is a data endpoint, not a metadata server (grid commands need haul://META/path)"
                ))
            } else {
                transfer::tls::explain_tls_error(shown, &e)
            }
        })?;
    if tls.get_ref().1.alpn_protocol() != Some(transfer::tls::ALPN_GRPC) {
        return Err(TransferError::usage(format!(
            "{shown} is not a metadata server (it does not speak the grid API)"
        )));
    }
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_names() {
        assert_eq!(base_name("/a/b"), "b");
        assert_eq!(base_name("/a/b/"), "b");
        assert_eq!(base_name("b"), "b");
        assert_eq!(base_name("/"), "/");
    }

    /// The kind the metadata server names beside the code decides, not the message.
    #[test]
    fn a_status_kind_outweighs_its_code_and_text() {
        let mut s = tonic::Status::failed_precondition("/d: something");
        assert_eq!(from_status(s.clone()).exit_code(), 6);
        s.metadata_mut().insert(
            api::ERROR_KIND_KEY,
            tonic::metadata::MetadataValue::from_static("not_empty"),
        );
        let e = from_status(s);
        assert_eq!(e.kind(), ErrorKind::NotEmpty, "{e:?}");
        assert_eq!(e.exit_code(), 6);
    }

    /// Issue 11 C15: a metadata server that went away mid-call is "connection lost" (exit 4),
    /// not a protocol error (exit 9).
    #[test]
    fn broken_connections_are_connection_errors() {
        for s in [
            tonic::Status::unknown("transport error"),
            tonic::Status::unknown("h2 protocol error: error reading a body from connection"),
        ] {
            let e = from_status(s);
            assert_eq!(e.kind(), ErrorKind::Connect, "{e:?}");
            assert_eq!(e.exit_code(), 4);
        }
        assert_eq!(
            from_status(tonic::Status::unknown("something else")).exit_code(),
            9
        );
        assert_eq!(
            from_status(tonic::Status::permission_denied("no")).exit_code(),
            5
        );
        assert!(alert_named("CertificateExpired").is_some());
        assert!(alert_named("Nonsense").is_none());
    }
}
