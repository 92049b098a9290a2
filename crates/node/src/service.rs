//! The storage node's personality of the data-plane engine ([`transfer::service::Service`]):
//! any certificate of the grid's CA may connect, but every request must carry a capability
//! the metadata server signed for this node and for that certificate; files are named by
//! catalog id ([`crate::spool`]); and the node serves its own requests ([`wire::node`]):
//! `Verify` ([`crate::verify`]) and `Run` ([`crate::run`]).

use crate::spool::{self, MetaLink, SpoolNaming};
use std::path::PathBuf;
use std::sync::Arc;
use transfer::conn::{ControlReader, ControlWriter};
use transfer::service::{
    Admitted, Caller, Served, Service, SinkNaming, SourceList, SourceSelection,
};
use transfer::store::{Root, SourceEntry};
use wire::control::{EntryInfo, Response};
use wire::error::{ErrorInfo, ErrorKind};
use wire::grant::{Operation, SignedGrant};
use wire::node::{NodeRequest, NodeResponse};

/// A storage node's data service.
pub struct NodeService {
    link: Arc<dyn MetaLink>,
    /// The node's root (the spool is `data/` below it; runs use `.run/`).
    root: PathBuf,
}

impl NodeService {
    pub fn new(link: Arc<dyn MetaLink>, root: PathBuf) -> Self {
        Self { link, root }
    }
}

impl Service for NodeService {
    fn admit(&self, subject: Option<&str>, base: &Arc<Root>) -> Result<Admitted, ErrorInfo> {
        // Capabilities authorize each request; the subject only names the client in logs.
        let Some(subject) = subject else {
            return Err(ErrorInfo::new(
                ErrorKind::Authentication,
                "storage nodes serve only clients with a certificate",
            ));
        };
        Ok(Admitted {
            identity: subject.to_string(),
            root: base.clone(),
        })
    }

    fn stat(&self, _caller: &Caller, _path: &str) -> Result<Option<EntryInfo>, ErrorInfo> {
        Err(ErrorInfo::new(
            ErrorKind::Unsupported,
            "storage nodes have no namespace; ask the metadata server",
        ))
    }

    fn sink_naming(
        &self,
        caller: &Caller,
        _dest: &str,
        _into_dir: Option<bool>,
        grant: Option<&SignedGrant>,
    ) -> Result<Arc<dyn SinkNaming>, ErrorInfo> {
        let presenter = caller.presenter.as_deref();
        let g = spool::check(self.link.as_ref(), grant, Operation::Write, presenter)?;
        Ok(Arc::new(SpoolNaming {
            allowed: g.ids.into_iter().collect(),
            replace: g.replace.into_iter().collect(),
            link: self.link.clone(),
        }))
    }

    /// Exactly the listed files a read capability covers, each checked for presence and size
    /// here (and against its catalog checksum as it is read).
    fn source_list(
        &self,
        caller: &Caller,
        request: SourceSelection,
    ) -> Result<SourceList, ErrorInfo> {
        let presenter = caller.presenter.as_deref();
        let g = spool::check(
            self.link.as_ref(),
            request.grant.as_ref(),
            Operation::Read,
            presenter,
        )?;
        if request.files.is_empty() {
            return Err(ErrorInfo::new(
                ErrorKind::Invalid,
                "storage nodes send listed files only",
            ));
        }
        let node = self.link.node();
        let mut list = SourceList::default();
        for f in request.files {
            let id = spool::parse_id(&f.locator)?;
            g.covers([id])
                .map_err(|e| ErrorInfo::new(ErrorKind::PermissionDenied, e.to_string()))?;
            let locator = spool::spool_path(id);
            let meta = caller.root.metadata(&locator).map_err(|e| {
                let kind = if e.kind() == std::io::ErrorKind::NotFound {
                    ErrorKind::NotFound
                } else {
                    ErrorKind::Io
                };
                ErrorInfo::new(
                    kind,
                    format!("{}: replica {id} missing on node {node} ({e})", f.name),
                )
            })?;
            if meta.len != f.size {
                return Err(ErrorInfo::new(
                    ErrorKind::SourceDamaged,
                    format!(
                        "{}: replica {id} on node {node} is damaged (size {} instead of {})",
                        f.name, meta.len, f.size
                    ),
                ));
            }
            list.entries.push(SourceEntry {
                rel: f.name,
                kind: wire::data::EntryKind::File,
                size: f.size,
                mode: f.mode,
                mtime: f.mtime,
                locator,
                expect: f.expect,
                known_crcs: None,
            });
        }
        Ok(list)
    }

    fn serve<'a>(
        &'a self,
        caller: &'a Caller,
        body: Vec<u8>,
        reader: &'a mut ControlReader,
        writer: &'a mut ControlWriter,
    ) -> Served<'a> {
        Box::pin(async move {
            let presenter = caller.presenter.as_deref();
            let request = match NodeRequest::decode(&body) {
                Ok(r) => r,
                Err(e) => {
                    let e = ErrorInfo::new(
                        ErrorKind::Protocol,
                        format!("malformed storage-node request: {e}"),
                    );
                    return writer.send_response(&Response::Error(e)).await;
                }
            };
            match request {
                NodeRequest::Verify { files, grant } => {
                    let reply = match crate::verify::verify_files(
                        self.link.as_ref(),
                        &caller.root,
                        files,
                        grant.as_ref(),
                        presenter,
                    )
                    .await
                    {
                        Ok(r) => Response::Service(NodeResponse::Verified(r).encode()),
                        Err(e) => Response::Error(e),
                    };
                    writer.send_response(&reply).await
                }
                NodeRequest::Run(spec) => {
                    crate::run::serve(
                        self.link.clone(),
                        &self.root,
                        reader,
                        writer,
                        *spec,
                        presenter,
                    )
                    .await
                }
                NodeRequest::Task(_) | NodeRequest::RunEnd => {
                    let e =
                        ErrorInfo::new(ErrorKind::Protocol, "no run is open on this connection");
                    writer.send_response(&Response::Error(e)).await
                }
            }
        })
    }
}

/// The node's personality in a real engine, in process: TLS on loopback, capabilities from a
/// [`FakeLink`](crate::testing::FakeLink), no metadata server.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeLink;
    use std::path::Path;
    use std::time::Duration;
    use transfer::TransferError;
    use transfer::client::{self, AttemptContext, CopyOptions, Peer, ServiceChannel, SinkRequest};
    use transfer::conn::ClientTls;
    use transfer::endpoint::{EndpointConfig, EndpointTls};
    use transfer::pki::{self, Subject, Validity};
    use transfer::store::Destination;
    use transfer::tls::{self, CredentialPaths, Credentials};
    use wire::control::ListedFile;

    struct Node {
        peer: Peer,
        root: tempfile::TempDir,
        link: Arc<FakeLink>,
        client: ClientTls,
        /// The client certificate's fingerprint: capabilities name it as their holder.
        holder: Vec<u8>,
        stop: tokio_util::sync::CancellationToken,
        _pki: tempfile::TempDir,
    }

    fn creds(dir: &Path, name: &str) -> Credentials {
        Credentials::load(&CredentialPaths {
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
            ca: dir.join("ca/ca.pem"),
        })
        .unwrap()
    }

    async fn start_node() -> Node {
        let pki_dir = tempfile::tempdir().unwrap();
        let d = pki_dir.path();
        pki::init_ca(&d.join("ca"), "longhaul", 1).unwrap();
        let host = Subject::Host {
            names: vec!["127.0.0.1".into()],
        };
        pki::issue(
            &d.join("ca"),
            &d.join("node"),
            &host,
            "longhaul",
            &Validity::days(1),
        )
        .unwrap();
        let user = Subject::User {
            name: "alice".into(),
        };
        let issued = pki::issue(
            &d.join("ca"),
            &d.join("alice"),
            &user,
            "longhaul",
            &Validity::days(1),
        )
        .unwrap();
        let node_creds = creds(d, "node");
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("data")).unwrap();
        let link = Arc::new(FakeLink::new("n1"));
        let cfg = EndpointConfig {
            root: root.path().to_path_buf(),
            tls: Some(EndpointTls {
                server: tls::server_config(&node_creds).unwrap(),
                client: tls::client_config(&node_creds).unwrap(),
                delegation_hosts: Vec::new(),
            }),
            service: Arc::new(NodeService::new(link.clone(), root.path().to_path_buf())),
            limits: Default::default(),
            link_bps: 1_000_000_000,
            checkpoint_interval: Duration::from_secs(5),
            stats: Default::default(),
            log: None,
            trace_dir: None,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = tokio_util::sync::CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(transfer::endpoint::run(cfg, listener, async move {
            s.cancelled().await
        }));
        Node {
            peer: Peer::new("127.0.0.1", port),
            root,
            link,
            client: ClientTls {
                config: tls::client_config(&creds(d, "alice")).unwrap(),
            },
            holder: issued.fingerprint.as_bytes().to_vec(),
            stop,
            _pki: pki_dir,
        }
    }

    fn options(n: &Node) -> CopyOptions {
        CopyOptions {
            recursive: false,
            range: None,
            session: Default::default(),
            retry: Default::default(),
            tls: Some(n.client.clone()),
            link_bps: 1_000_000_000,
            checkpoint_interval: Duration::from_secs(5),
            control_pool: None,
            peer_tls: Vec::new(),
            zero_copy: false,
            trace: None,
            receiver_evidence: false,
        }
    }

    fn context() -> AttemptContext {
        let (events, _) = tokio::sync::mpsc::unbounded_channel();
        AttemptContext {
            counters: Default::default(),
            events,
            cancel: Default::default(),
        }
    }

    /// Sends local file `path` to the node as file `id`.
    async fn put(
        n: &Node,
        path: &Path,
        id: i64,
        grant: Option<SignedGrant>,
    ) -> Result<client::Attempt, TransferError> {
        put_as(n, path, id, grant, false).await
    }

    /// [`put`], resuming (what the node has of the file is not sent again) if `resume`.
    async fn put_as(
        n: &Node,
        path: &Path,
        id: i64,
        grant: Option<SignedGrant>,
        resume: bool,
    ) -> Result<client::Attempt, TransferError> {
        put_with(n, path, id, grant, resume, None).await
    }

    /// [`put_as`], with the block CRCs a writer recorded (sent with `sendfile` on clear
    /// streams, where they spare the read).
    async fn put_with(
        n: &Node,
        path: &Path,
        id: i64,
        grant: Option<SignedGrant>,
        resume: bool,
        known_crcs: Option<Arc<wire::known_crcs::KnownCrcs>>,
    ) -> Result<client::Attempt, TransferError> {
        let size = std::fs::metadata(path).unwrap().len();
        let entry = SourceEntry {
            rel: id.to_string(),
            kind: wire::data::EntryKind::File,
            size,
            mode: 0o644,
            mtime: Default::default(),
            locator: path.to_path_buf(),
            expect: vec![],
            known_crcs: known_crcs.clone(),
        };
        let request = SinkRequest {
            grant,
            ..Default::default()
        };
        let mut opts = options(n);
        let mut session = opts.session.clone();
        session.resume = resume;
        if known_crcs.is_some() {
            opts.zero_copy = true;
            session.protect = wire::control::Protect::Clear;
        }
        client::upload(vec![entry], &n.peer, request, &opts, session, context()).await
    }

    /// Files an upload delivered (none when the session failed as a whole).
    fn done(a: Result<client::Attempt, TransferError>) -> u64 {
        a.map(|a| a.source.files_done).unwrap_or(0)
    }

    fn listed(id: i64, size: u64) -> ListedFile {
        ListedFile {
            locator: id.to_string(),
            name: format!("f{id}"),
            size,
            mode: 0o644,
            mtime: Default::default(),
            expect: vec![],
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_stores_reports_serves_and_verifies_replicas_by_capability() {
        let n = start_node().await;
        let local = tempfile::tempdir().unwrap();
        let src = local.path().join("src");
        let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&src, &body).unwrap();

        // A write capability for file 12 stores it under its id and reports it.
        let write = n.link.grant(Operation::Write, &[12], &n.holder);
        let a = put(&n, &src, 12, Some(write.clone())).await.unwrap();
        assert_eq!(a.source.files_done, 1, "{a:?}");
        let stored = n.root.path().join(spool::spool_path(12));
        assert_eq!(std::fs::read(&stored).unwrap(), body);
        assert_eq!(
            *n.link.committed.lock().unwrap(),
            vec![(12, body.len() as u64)]
        );

        // A replayed write capability does not replace the verified replica.
        std::fs::write(&src, b"something else").unwrap();
        let a = put(&n, &src, 12, Some(write)).await;
        assert_eq!(done(a), 0);
        assert_eq!(std::fs::read(&stored).unwrap(), body);

        // Reading needs a read capability for this very certificate.
        let read = n.link.grant(Operation::Read, &[12], &n.holder);
        let dest = local.path().join("back");
        let size = body.len() as u64;
        download_12(&n, &options(&n), size, None, Some(read), &dest)
            .await
            .unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), body);

        // Verify recomputes the replica's checksums where it is.
        let verify = n.link.grant(Operation::Verify, &[12], &n.holder);
        let mut ch = ServiceChannel::open(&n.peer, Some(&n.client))
            .await
            .unwrap();
        let files = vec![listed(12, body.len() as u64)];
        ch.send(
            NodeRequest::Verify {
                files,
                grant: Some(verify),
            }
            .encode(),
        )
        .await
        .unwrap();
        let NodeResponse::Verified(r) = NodeResponse::decode(&ch.recv().await.unwrap()).unwrap()
        else {
            panic!("not a verification");
        };
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].size, body.len() as u64);
        assert!(r[0].error.is_none());
        let crc = wire::checksum::crc32c_append(0, &body)
            .to_be_bytes()
            .to_vec();
        assert_eq!(r[0].digests[0].value, crc);
        n.stop.cancel();
    }

    /// A file sent with the block CRCs its writer recorded (`haul mount`'s spools) is sent
    /// without being read to checksum it. A recorded CRC that does not match the file's bytes
    /// (a lying or stale record) is caught by the node: the file fails at once (it is not
    /// sent again under the same record) and is not committed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn recorded_crcs_spare_the_read_and_a_wrong_one_commits_nothing() {
        let n = start_node().await;
        let local = tempfile::tempdir().unwrap();
        let src = local.path().join("src");
        let block = u64::from(wire::control::SessionOptions::default().block_size);
        let body: Vec<u8> = (0..3 * block + 1000).map(|i| (i % 253) as u8).collect();
        std::fs::write(&src, &body).unwrap();
        let record = |data: &[u8]| {
            let mut r = wire::known_crcs::CrcRecorder::new(block);
            r.write(0, data);
            Some(Arc::new(r.snapshot().unwrap()))
        };

        let write = n.link.grant(Operation::Write, &[31], &n.holder);
        let a = put_with(&n, &src, 31, Some(write), false, record(&body))
            .await
            .unwrap();
        assert_eq!(a.source.files_done, 1, "{a:?}");
        assert_eq!(a.zero_copy, Some(true));
        assert_eq!(a.blocks_unread, 4, "{a:?}");
        let stored = n.root.path().join(spool::spool_path(31));
        assert_eq!(std::fs::read(&stored).unwrap(), body);

        // A record of other bytes (one bit of the second block): refused, not committed.
        let mut other = body.clone();
        other[block as usize + 5] ^= 1;
        let write = n.link.grant(Operation::Write, &[32], &n.holder);
        let a = put_with(&n, &src, 32, Some(write), false, record(&other))
            .await
            .unwrap();
        assert_eq!(
            (a.source.files_done, a.source.files_failed),
            (0, 1),
            "{a:?}"
        );
        // Failed at once, not sent again and again under the same record.
        assert!(a.source.bytes_moved <= body.len() as u64, "{a:?}");
        assert!(!n.root.path().join(spool::spool_path(32)).exists());
        assert_eq!(
            *n.link.committed.lock().unwrap(),
            vec![(31, body.len() as u64)]
        );
        n.stop.cancel();
    }

    /// A node killed between a file's commit and its report (or whose report was lost) holds
    /// the file under its final name while the catalog still has it pending: a resumed
    /// session finds it complete, and the node reports it (with checksums read from the disk)
    /// before the sender counts it done; a report the metadata server refuses fails the file
    /// and leaves the replica where it is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_found_complete_by_a_resumed_session_is_reported_again() {
        let n = start_node().await;
        let local = tempfile::tempdir().unwrap();
        let src = local.path().join("src");
        let body: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8).collect();
        std::fs::write(&src, &body).unwrap();
        let plant = |id: i64| {
            // As the dead session's commit left it: final name, the sender's mtime (0).
            let p = n.root.path().join(spool::spool_path(id));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, &body).unwrap();
            let f = std::fs::File::options().write(true).open(&p).unwrap();
            f.set_modified(std::time::UNIX_EPOCH).unwrap();
            p
        };
        let stored = plant(21);
        let write = n.link.grant(Operation::Write, &[21], &n.holder);
        let a = put_as(&n, &src, 21, Some(write), true).await.unwrap();
        assert_eq!(a.source.files_done, 1, "{a:?}");
        assert_eq!(a.source.bytes_moved, 0, "nothing sent again: {a:?}");
        assert_eq!(
            *n.link.committed.lock().unwrap(),
            vec![(21, body.len() as u64)],
            "reported again"
        );
        assert_eq!(std::fs::read(&stored).unwrap(), body);

        n.link
            .refuse
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let stored = plant(22);
        let write = n.link.grant(Operation::Write, &[22], &n.holder);
        let a = put_as(&n, &src, 22, Some(write), true).await;
        assert_eq!(done(a), 0, "refused by the metadata server: not done");
        assert_eq!(std::fs::read(&stored).unwrap(), body, "kept");
        n.stop.cancel();
    }

    /// Downloads file 12 (of `size` bytes), or `range` of it, into `dest`, with `opts`.
    async fn download_12(
        n: &Node,
        opts: &CopyOptions,
        size: u64,
        range: Option<(u64, u64)>,
        grant: Option<SignedGrant>,
        dest: &Path,
    ) -> Result<client::Attempt, TransferError> {
        let mut opts = opts.clone();
        opts.range = range;
        let request = client::SourceRequest {
            files: vec![listed(12, size)],
            grant,
            range,
            ..Default::default()
        };
        let naming = Destination::resolve(&Root::Ambient, dest, false).unwrap();
        client::download(
            &n.peer,
            request,
            Arc::new(Root::Ambient),
            Arc::new(naming),
            &opts,
            opts.session.clone(),
            context(),
        )
        .await
    }

    /// Ranged downloads through a control pool (as a mount fetches its extents): the next
    /// session runs on the control connection the last one left, reads its own range, and
    /// still needs a capability of its own (a reused connection carries no earlier session's
    /// grant); the connection of a refused session is not kept.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ranged_downloads_reuse_a_control_connection_and_each_needs_a_capability() {
        let n = start_node().await;
        let local = tempfile::tempdir().unwrap();
        let src = local.path().join("src");
        let body: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        let size = body.len() as u64;
        std::fs::write(&src, &body).unwrap();
        let write = n.link.grant(Operation::Write, &[12], &n.holder);
        put(&n, &src, 12, Some(write)).await.unwrap();
        let pool = Arc::new(transfer::control_pool::ControlPool::new());
        let mut opts = options(&n);
        opts.control_pool = Some(pool.clone());

        let mut ports = Vec::new();
        for (i, (at, len)) in [(0u64, 1_000_000u64), (1_000_000, 2_000_000)]
            .into_iter()
            .enumerate()
        {
            let read = n.link.grant(Operation::Read, &[12], &n.holder);
            let dest = local.path().join(format!("part{i}"));
            let a = download_12(&n, &opts, size, Some((at, len)), Some(read), &dest)
                .await
                .unwrap();
            assert!(a.rtt.is_some());
            assert_eq!(
                std::fs::read(&dest).unwrap(),
                &body[at as usize..(at + len) as usize]
            );
            assert_eq!(pool.idle_count(), 1, "the session's connection is kept");
            let s = pool.take_idle("127.0.0.1", n.peer.port).unwrap();
            ports.push(s.local_port());
            pool.put(s);
        }
        assert_eq!(
            ports[0], ports[1],
            "the second session reused the connection"
        );

        // No capability on the reused connection: refused, and the connection goes.
        let dest = local.path().join("refused");
        let e = download_12(&n, &opts, size, Some((0, 10)), None, &dest)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
        assert!(!dest.exists());
        assert_eq!(pool.idle_count(), 0);
        n.stop.cancel();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_refuses_what_no_capability_covers() {
        let n = start_node().await;
        let local = tempfile::tempdir().unwrap();
        let src = local.path().join("src");
        std::fs::write(&src, b"payload").unwrap();

        // No capability; a capability for another file; one issued to another certificate.
        assert!(put(&n, &src, 12, None).await.is_err());
        let other_file = n.link.grant(Operation::Write, &[13], &n.holder);
        let a = put(&n, &src, 12, Some(other_file)).await;
        assert_eq!(done(a), 0);
        let other_holder = n
            .link
            .grant(Operation::Write, &[12], b"not this certificate");
        assert!(put(&n, &src, 12, Some(other_holder)).await.is_err());
        assert!(!n.root.path().join(spool::spool_path(12)).exists());
        assert!(n.link.committed.lock().unwrap().is_empty());

        // A metadata server that refuses the report: the sender hears the file failed and the
        // node keeps no copy under the final name.
        n.link
            .refuse
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let write = n.link.grant(Operation::Write, &[14], &n.holder);
        let a = put(&n, &src, 14, Some(write)).await;
        assert_eq!(done(a), 0);
        assert!(!n.root.path().join(spool::spool_path(14)).exists());

        // Node requests: garbage, a task without a run, and a verification of an uncovered id.
        let mut ch = ServiceChannel::open(&n.peer, Some(&n.client))
            .await
            .unwrap();
        ch.send(vec![0xff, 0xff, 0xff]).await.unwrap();
        let e = ch.recv().await.unwrap_err();
        assert!(e.to_string().contains("malformed"), "{e}");
        ch.send(NodeRequest::RunEnd.encode()).await.unwrap();
        let e = ch.recv().await.unwrap_err();
        assert!(e.to_string().contains("no run is open"), "{e}");
        let verify = n.link.grant(Operation::Verify, &[12], &n.holder);
        ch.send(
            NodeRequest::Verify {
                files: vec![listed(13, 7)],
                grant: Some(verify),
            }
            .encode(),
        )
        .await
        .unwrap();
        let e = ch.recv().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
        n.stop.cancel();
    }
}
