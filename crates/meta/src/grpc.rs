//! The one way every gRPC handler of the metadata server begins and ends. The handler names
//! its call and how many items it counts. This module then takes care of three things:
//!
//! - *Who is calling.* It reads the caller from the certificate, never from a field of the
//!   request. A node may act only for the node its certificate registered as.
//! - *The figures.* It times and counts the call in the server's figures (`haul status`, the
//!   dashboard, `/metrics`). Failed calls count as errors, refused callers too.
//! - *The reply.* It wraps the reply.
//!
//! So the handlers in `namespace`, `files` and `nodes` are adapters of a few lines over domain
//! methods of [`Meta`].

use crate::auth::{Caller, Identities, User};
use crate::error::Error;
use crate::state::Meta;
use std::sync::Arc;
use std::time::Instant;
use tonic::{Request, Response, Status};
use transfer::certid::CertIdentity;

/// How a call shows in the server's figures: its name, and how many items it handled (files
/// created, paths looked up, ...).
#[derive(Clone, Copy, Debug)]
pub struct Op {
    pub name: &'static str,
    pub items: u64,
}

impl Op {
    /// A call about one item.
    pub const fn one(name: &'static str) -> Self {
        Self { name, items: 1 }
    }

    /// A call about `items` items.
    pub const fn many(name: &'static str, items: u64) -> Self {
        Self { name, items }
    }
}

/// A request a storage node sends about itself: the node it names must be the caller.
pub trait FromNode {
    fn node_name(&self) -> &str;
}

macro_rules! from_node {
    ($($t:ty => $field:ident),* $(,)?) => {
        $(impl FromNode for $t {
            fn node_name(&self) -> &str {
                &self.$field
            }
        })*
    };
}

from_node! {
    api::meta::RegisterRequest => name,
    api::meta::HeartbeatRequest => name,
    api::meta::InventoryRequest => name,
    api::meta::ReplicaWrittenRequest => node,
    api::meta::ReplicasWrittenRequest => node,
    api::meta::RemovedRequest => node,
    api::meta::RegisterOutputsRequest => node,
}

impl Meta {
    /// Serves a user's call: `f` gets the user its certificate maps to and the request.
    pub async fn user_call<Q, T>(
        &self,
        op: Op,
        req: &Request<Q>,
        f: impl AsyncFnOnce(User, &Q) -> Result<T, Error>,
    ) -> Result<Response<T>, Status> {
        let started = Instant::now();
        let r = async { f(self.ids.user(req)?, req.get_ref()).await }.await;
        self.finish(op, started, r)
    }

    /// Serves a call anybody of the CA may make, user or node: `f` gets who it is.
    pub async fn caller_call<Q, T>(
        &self,
        op: Op,
        req: &Request<Q>,
        f: impl AsyncFnOnce(Caller, &Q) -> Result<T, Error>,
    ) -> Result<Response<T>, Status> {
        let started = Instant::now();
        let r = async { f(self.ids.of_request(req)?, req.get_ref()).await }.await;
        self.finish(op, started, r)
    }

    /// Serves a user's call whose items are known from its reply only (files a directory held):
    /// `f` returns the reply and that count.
    pub async fn user_call_counting<Q, T>(
        &self,
        name: &'static str,
        req: &Request<Q>,
        f: impl AsyncFnOnce(User, &Q) -> Result<(T, u64), Error>,
    ) -> Result<Response<T>, Status> {
        let started = Instant::now();
        let r = async { f(self.ids.user(req)?, req.get_ref()).await }.await;
        let items = r.as_ref().map(|(_, n)| *n).unwrap_or(0);
        self.finish(Op::many(name, items), started, r.map(|(reply, _)| reply))
    }

    /// Serves a call of a registered storage node about itself. The caller must hold the very
    /// certificate the node registered with, and the request must name that node.
    pub async fn node_call<Q: FromNode, T>(
        &self,
        op: Op,
        req: Request<Q>,
        f: impl AsyncFnOnce(Q) -> Result<T, Error>,
    ) -> Result<Response<T>, Status> {
        let started = Instant::now();
        let r = async {
            let caller = self.registered_node(&req)?;
            same_node(&caller, req.get_ref().node_name())?;
            f(req.into_inner()).await
        }
        .await;
        self.finish(op, started, r)
    }

    /// Serves `Register`: a host certificate of the CA for the node the request names. Whether
    /// it is enrolled for that node is `f`'s to check (it gets the certificate).
    pub async fn enrolling_call<Q: FromNode, T>(
        &self,
        op: Op,
        req: Request<Q>,
        f: impl AsyncFnOnce(Arc<CertIdentity>, Q) -> Result<T, Error>,
    ) -> Result<Response<T>, Status> {
        let started = Instant::now();
        let r = async {
            let caller = self.ids.node(&req)?;
            same_node(&caller, req.get_ref().node_name())?;
            let cert = Identities::cert_of(&req)?;
            f(cert, req.into_inner()).await
        }
        .await;
        self.finish(op, started, r)
    }

    /// The one place a domain error becomes a status: its kind named beside the code.
    fn finish<T>(
        &self,
        op: Op,
        started: Instant,
        r: Result<T, Error>,
    ) -> Result<Response<T>, Status> {
        self.record(op.name, started, op.items, r.is_ok());
        r.map(Response::new).map_err(Status::from)
    }

    /// The node a request comes from, for every call but `Register`. It must come with a host
    /// certificate, the very one the node registered with (recorded with its key), and that
    /// certificate must still be enrolled. Another host certificate for the same name cannot
    /// report for the node: a copy made for an attack, a rotated-out one, one whose enrolment
    /// line was removed. Heartbeats, inventories and replica reports would otherwise let it
    /// hide the node's replicas or vouch for data it never held.
    pub fn registered_node<T>(&self, req: &Request<T>) -> Result<String, Status> {
        let name = self.ids.node(req)?;
        let cert = Identities::cert_of(req)?;
        let fp = cert.fingerprint;
        if let Some(entry) = self.node(&name)
            && !entry.cert.is_empty()
            && entry.cert != fp.to_string()
        {
            self.event(format!(
                "node {name}: a call with another certificate ({fp}) refused"
            ));
            return Err(Status::permission_denied(format!(
                "{fp} is not the certificate node {name} registered with; a replacement must be enrolled and register first"
            )));
        }
        self.ids
            .nodes
            .check(&name, &fp)
            .map_err(Status::permission_denied)?;
        Ok(name)
    }
}

/// Where a long-running call (replicate, verify) reports its progress, and its error if it
/// fails before doing anything: the domain's typed error, made a `Status` once, by
/// [`progress_stream`].
pub type ProgressSender<T> = tokio::sync::mpsc::Sender<Result<T, Error>>;

/// The stream a streaming call answers with.
pub type ProgressStream<T> =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The gRPC stream of the progress reports sent on `rx`.
pub fn progress_stream<T: Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<Result<T, Error>>,
) -> ProgressStream<T> {
    use tokio_stream::StreamExt;
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx).map(|r| r.map_err(Status::from)))
}

/// Runs `run` (the work behind a streaming call) while its client gets `snapshot(false)` every
/// half second. A client that goes away cancels the work through `cancel` and waits for it to
/// stop; `false` then (a rerun finishes what is missing). The caller sends the last report.
pub async fn stream_progress<T>(
    run: impl std::future::Future,
    tx: &ProgressSender<T>,
    cancel: &tokio_util::sync::CancellationToken,
    snapshot: impl Fn(bool) -> T,
) -> bool {
    tokio::pin!(run);
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = &mut run => return true,
            _ = tick.tick() => {
                if tx.send(Ok(snapshot(false))).await.is_err() {
                    cancel.cancel();
                    let _ = (&mut run).await;
                    return false;
                }
            }
        }
    }
}

/// A node may only speak for itself.
pub fn same_node(caller: &str, claimed: &str) -> Result<(), Status> {
    if caller == claimed {
        Ok(())
    } else {
        Err(Status::permission_denied(format!(
            "host certificate of {caller} cannot act for node {claimed}"
        )))
    }
}

#[cfg(test)]
mod tests {
    //! The progress streams of replicate and verify, in process: a refusal made before any
    //! work travels as the domain's typed error and reaches the client as its gRPC status.
    use super::*;
    use crate::auth::Identities;
    use crate::state::Settings;
    use api::meta as pb;
    use tokio_stream::StreamExt;

    async fn meta() -> Arc<Meta> {
        let ids = Identities {
            mapfile: Default::default(),
            groups: Default::default(),
            admins: vec![],
            nodes: Default::default(),
        };
        let catalog = catalog::Catalog::open("sqlite::memory:").await.unwrap();
        Arc::new(Meta::new(catalog, ids, Settings::default()))
    }

    fn alice() -> User {
        User {
            name: "alice".into(),
            groups: vec!["alice".into()],
            admin: false,
            cert: None,
        }
    }

    #[tokio::test]
    async fn a_verify_of_a_missing_path_streams_not_found() {
        let m = meta().await;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let req = pb::VerifyRequest {
            paths: vec!["/nowhere/x".into()],
            recursive: false,
            repair: false,
        };
        m.verify(alice(), req, tx).await;
        let mut stream = progress_stream(rx);
        let status = stream.next().await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
        assert!(status.message().contains("/nowhere/x"), "{status:?}");
        assert!(stream.next().await.is_none(), "nothing after the error");
    }

    #[tokio::test]
    async fn a_replicate_naming_nothing_streams_invalid_argument() {
        let m = meta().await;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        m.replicate(alice(), pb::ReplicateRequest::default(), tx)
            .await;
        let status = progress_stream(rx).next().await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    }
}
