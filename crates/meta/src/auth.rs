//! Who is calling: the metadata server accepts only mutually authenticated TLS 1.3 (the same
//! CA and certificates as the data plane), hands the peer's parsed certificate
//! ([`CertIdentity`]: subject, host, fingerprint) to the gRPC handlers with each request, and
//! maps it to a caller: a storage node (a host certificate as `transfer::certid` defines it,
//! whose CN names the node) or a user (through the mapfile), with the user's groups (from the
//! groups file) and whether it is an administrator. Nothing is parsed from subject strings.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tonic::Status;
use tonic::transport::server::Connected;
use transfer::certid::{CertIdentity, Fingerprint};
use transfer::limits::{Admission, ConnLimiter, Limits};
use transfer::tls::Mapfile;

/// What a handler knows about the connection a request came on.
#[derive(Clone, Debug)]
pub struct PeerInfo {
    /// The client certificate, parsed (`None` if it does not parse: such a peer is refused).
    pub cert: Option<Arc<CertIdentity>>,
    pub addr: SocketAddr,
}

/// A TLS connection carrying gRPC, with its peer's identity for the handlers. It holds its
/// slot in the listener's connection limits until tonic drops it.
pub struct TlsConn {
    inner: TlsStream<TcpStream>,
    peer: PeerInfo,
    _slot: Admission,
    /// For a peer nobody here knows (a certificate of the CA that is neither a node's nor in
    /// the mapfile): when its connection ends, the handshake timeout after it was accepted.
    /// Its calls are refused with the line to add to the mapfile; it may not keep the
    /// connection (a slot) beyond that, as it never authenticated as anyone.
    ends: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Connected for TlsConn {
    type ConnectInfo = PeerInfo;
    fn connect_info(&self) -> PeerInfo {
        self.peer.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(end) = self.ends.as_mut()
            && end.as_mut().poll(cx).is_ready()
        {
            // The end of the stream: the server closes the connection.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Accepts TCP connections within `limits` (refused at once beyond them, see
/// [`transfer::limits`]) and completes their TLS handshakes concurrently, each within the
/// handshake timeout (a slow or hostile client cannot hold up the others), yielding
/// authenticated connections.
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    limits: Limits,
    log: Option<Arc<transfer::translog::TransferLog>>,
    known: impl Fn(&CertIdentity) -> bool + Send + Sync + 'static,
) -> tokio_stream::wrappers::ReceiverStream<Result<TlsConn, std::io::Error>> {
    let known = Arc::new(known);
    let limiter = ConnLimiter::new(limits);
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let (tcp, addr) = match listener.accept().await {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = limiter.admit(addr.ip()) else {
                transfer::limits::reset(tcp);
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, conn_tx, known) = (acceptor.clone(), tx.clone(), known.clone());
            let log = log.clone();
            let handshake_timeout = limiter.limits().handshake_timeout;
            tokio::spawn(async move {
                transfer::tls::take_refused_subject();
                let hs =
                    tokio::time::timeout(handshake_timeout, acceptor.accept(tcp).into_fallible())
                        .await;
                let tls = match hs {
                    Ok(Ok(t)) => t,
                    Ok(Err((e, tcp))) => {
                        // Taken before anything else runs on this thread.
                        let refusal = transfer::tls::cert_refusal(&e);
                        let subject = refusal.as_ref().and_then(|r| r.subject.clone());
                        tracing::info!(%addr, ?subject, error = %e, "TLS handshake refused");
                        if let (Some(log), Some(_)) = (&log, &refusal) {
                            let why = transfer::tls::explain_tls_error("client", &e);
                            log.refused(&addr.to_string(), subject.as_deref(), why.message());
                        }
                        // The alert saying why must reach the client, not a reset.
                        transfer::conn::close_after_alert(tcp).await;
                        return;
                    }
                    Err(_) => {
                        tracing::info!(%addr, "TLS handshake timed out");
                        return;
                    }
                };
                let cert = CertIdentity::of_peer(tls.get_ref().1).map(Arc::new);
                let ends = match &cert {
                    Some(c) if known(c) => None,
                    _ => {
                        tracing::info!(%addr, subject = ?cert.as_ref().map(|c| &c.subject), "connection of an unknown certificate: its calls are refused");
                        if let Some(log) = &log {
                            let subject = cert.as_ref().map(|c| c.subject.as_str());
                            let why =
                                "the certificate is in neither the mapfile nor the nodes file";
                            log.refused(&addr.to_string(), subject, why);
                        }
                        Some(Box::pin(tokio::time::sleep(handshake_timeout)))
                    }
                };
                let conn = TlsConn {
                    inner: tls,
                    peer: PeerInfo { cert, addr },
                    _slot: slot,
                    ends,
                };
                let _ = conn_tx.send(Ok(conn)).await;
            });
            if tx.is_closed() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// A user of the namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub name: String,
    /// Primary group first.
    pub groups: Vec<String>,
    pub admin: bool,
    /// The certificate the user called with: capabilities signed for this user are bound to
    /// it (`None` when acting for a user who is not on the line, e.g. outputs of a run).
    pub cert: Option<Fingerprint>,
}

impl User {
    pub fn in_group(&self, g: &str) -> bool {
        self.groups.iter().any(|x| x == g)
    }

    pub fn primary_group(&self) -> &str {
        self.groups
            .first()
            .map(|s| s.as_str())
            .unwrap_or(&self.name)
    }
}

/// Who a request comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    User(User),
    /// A storage node, by name (its host certificate's CN).
    Node(String),
}

/// Group membership: `group: user1 user2` lines (like /etc/group). A user's primary group is
/// the first group that lists them, or a group named like the user.
#[derive(Clone, Debug, Default)]
pub struct Groups {
    by_user: HashMap<String, Vec<String>>,
}

impl Groups {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut by_user: HashMap<String, Vec<String>> = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (group, members) = line
                .split_once(':')
                .ok_or_else(|| format!("line {}: expected `group: user1 user2`", n + 1))?;
            let group = group.trim();
            if group.is_empty() {
                return Err(format!("line {}: empty group name", n + 1));
            }
            for m in members.split([' ', ',', '\t']).filter(|m| !m.is_empty()) {
                let g = by_user.entry(m.to_string()).or_default();
                if !g.iter().any(|x| x == group) {
                    g.push(group.to_string());
                }
            }
        }
        Ok(Self { by_user })
    }

    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read groups file {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn of(&self, user: &str) -> Vec<String> {
        let mut g = self.by_user.get(user).cloned().unwrap_or_default();
        if g.is_empty() {
            g.push(user.to_string());
        }
        g
    }
}

/// Maps certificates to callers.
pub struct Identities {
    pub mapfile: Mapfile,
    pub groups: Groups,
    pub admins: Vec<String>,
    /// Which host certificates may join as storage nodes.
    pub nodes: crate::enrol::Enrolment,
}

impl Identities {
    /// The caller behind a certificate.
    pub fn caller(&self, cert: &CertIdentity) -> Result<Caller, Status> {
        if let Some(host) = &cert.host {
            return Ok(Caller::Node(host.clone()));
        }
        let subject = &cert.subject;
        let Some(mapped) = self.mapfile.lookup(subject) else {
            return Err(Status::permission_denied(format!(
                "certificate subject {subject:?} is not in the metadata server's mapfile; ask its operator to add: \"{subject}\" <user>"
            )));
        };
        // `user` or `user,other` (the first account is the identity).
        let name = mapped
            .split(',')
            .next()
            .unwrap_or(mapped)
            .trim()
            .to_string();
        Ok(Caller::User(User {
            groups: self.groups.of(&name),
            admin: self.admins.contains(&name),
            name,
            cert: Some(cert.fingerprint),
        }))
    }

    /// The user named `name` (as the mapfile maps to it), with groups and admin rights.
    pub fn user_named(&self, name: &str) -> User {
        User {
            groups: self.groups.of(name),
            admin: self.admins.iter().any(|a| a == name),
            name: name.to_string(),
            cert: None,
        }
    }

    /// The certificate of a request's connection.
    pub fn cert_of<T>(req: &tonic::Request<T>) -> Result<Arc<CertIdentity>, Status> {
        req.extensions()
            .get::<PeerInfo>()
            .and_then(|p| p.cert.clone())
            .ok_or_else(|| Status::unauthenticated("no usable client certificate"))
    }

    /// The caller of a request (its connection's certificate).
    pub fn of_request<T>(&self, req: &tonic::Request<T>) -> Result<Caller, Status> {
        self.caller(Self::cert_of(req)?.as_ref())
    }

    /// A user caller, or an error for nodes.
    pub fn user<T>(&self, req: &tonic::Request<T>) -> Result<User, Status> {
        match self.of_request(req)? {
            Caller::User(u) => Ok(u),
            Caller::Node(n) => Err(Status::permission_denied(format!(
                "host certificate of {n} cannot use the namespace; use a user certificate"
            ))),
        }
    }

    /// A node caller, or an error for users.
    pub fn node<T>(&self, req: &tonic::Request<T>) -> Result<String, Status> {
        match self.of_request(req)? {
            Caller::Node(n) => Ok(n),
            Caller::User(u) => Err(Status::permission_denied(format!(
                "{} is a user; only storage nodes (host certificates) may do this",
                u.name
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> Identities {
        Identities {
            mapfile: Mapfile::parse(
                "\"/O=g/OU=users/CN=Alice A\" alice\n\"/O=g/OU=users/CN=Root\" root\n",
            )
            .unwrap(),
            groups: Groups::parse("# groups\natlas: alice bob\ncms: alice\n").unwrap(),
            admins: vec!["root".into()],
            nodes: Default::default(),
        }
    }

    fn identity(der: &[u8]) -> CertIdentity {
        CertIdentity::from_der(der).unwrap()
    }

    fn cert(ou: &str, cn: &str, server: bool) -> Vec<u8> {
        use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose as E, KeyPair};
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        let mut d = rcgen::DistinguishedName::new();
        d.push(DnType::OrganizationName, "g");
        d.push(DnType::OrganizationalUnitName, ou);
        d.push(DnType::CommonName, cn);
        p.distinguished_name = d;
        p.extended_key_usages = if server {
            vec![E::ServerAuth, E::ClientAuth]
        } else {
            vec![E::ClientAuth]
        };
        p.self_signed(&KeyPair::generate().unwrap())
            .unwrap()
            .der()
            .to_vec()
    }

    #[test]
    fn certificates_map_to_callers() {
        let i = ids();
        assert_eq!(
            i.caller(&identity(&cert("hosts", "node1", true))).unwrap(),
            Caller::Node("node1".into())
        );
        let alice = identity(&cert("users", "Alice A", false));
        let Caller::User(a) = i.caller(&alice).unwrap() else {
            panic!()
        };
        assert_eq!(a.name, "alice");
        assert_eq!(a.groups, vec!["atlas", "cms"]);
        assert_eq!(a.cert, Some(alice.fingerprint));
        assert!(!a.admin);
        let Caller::User(r) = i.caller(&identity(&cert("users", "Root", false))).unwrap() else {
            panic!()
        };
        assert!(r.admin);
        assert_eq!(r.primary_group(), "root");
        let e = i
            .caller(&identity(&cert("users", "Mallory", false)))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("mapfile"));
        assert!(Groups::parse("nogroupline").is_err());
    }

    /// Issue 11 C2: a user certificate whose CN spells a host subject is a user (here an
    /// unmapped one), never the storage node it names.
    #[test]
    fn a_user_certificate_cannot_pose_as_a_node() {
        let i = ids();
        for (ou, cn, server) in [
            ("users", "eve/OU=hosts/CN=node3", false),
            ("hosts", "node3", false),
            ("hosts", "eve/OU=hosts/CN=node3", true),
        ] {
            let e = i.caller(&identity(&cert(ou, cn, server))).unwrap_err();
            assert!(e.message().contains("mapfile"), "{ou} {cn}: {e:?}");
        }
    }
}
