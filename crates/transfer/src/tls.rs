//! TLS 1.3 with mutual certificate authentication (rustls): loading credentials, server and
//! client configurations, the peer's subject, the grid-mapfile that maps subjects to local
//! identities, and turning handshake failures into messages a user can act on.

use crate::error::TransferError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// ALPN protocol name of longhaul data-plane connections.
pub const ALPN: &[u8] = b"haul/1";

/// ALPN protocol of a metadata server (gRPC over HTTP/2). Clients offer both, so that a
/// `haul://host/path` can name either kind of server.
pub const ALPN_GRPC: &[u8] = b"h2";

/// Label of the TLS exporter that binds private data connections to their session.
pub const EXPORTER_LABEL: &[u8] = b"EXPERIMENTAL-haul-data-bind";

/// Where credentials come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CredentialPaths {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// A certificate chain, its key and the trusted CA roots.
pub struct Credentials {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    pub roots: Arc<RootCertStore>,
}

impl Credentials {
    /// Credentials from PEM text (a delegation a service holds for a user), trusting `roots`.
    pub fn from_pem(
        chain_pem: &str,
        key_pem: &str,
        roots: Arc<RootCertStore>,
    ) -> Result<Self, TransferError> {
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(chain_pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| TransferError::unauthenticated(format!("not a PEM chain: {e}")))?;
        if chain.is_empty() {
            return Err(TransferError::unauthenticated("no certificate"));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| TransferError::unauthenticated(format!("not a PEM private key: {e}")))?;
        Ok(Self { chain, key, roots })
    }

    pub fn load(paths: &CredentialPaths) -> Result<Self, TransferError> {
        let hint = "pass --cert/--key/--ca (or HAUL_CERT/HAUL_KEY/HAUL_CA), or create them with `haul ca init` and `haul cert issue`";
        let read_certs = |p: &Path| -> Result<Vec<CertificateDer<'static>>, TransferError> {
            let data = std::fs::read(p).map_err(|e| {
                TransferError::unauthenticated(format!(
                    "cannot read certificate {}: {e}; {hint}",
                    p.display()
                ))
            })?;
            let certs: Vec<_> = CertificateDer::pem_slice_iter(&data)
                .collect::<Result<_, _>>()
                .map_err(|e| {
                    TransferError::unauthenticated(format!(
                        "{} is not a PEM certificate: {e}",
                        p.display()
                    ))
                })?;
            if certs.is_empty() {
                return Err(TransferError::unauthenticated(format!(
                    "{} holds no certificate",
                    p.display()
                )));
            }
            Ok(certs)
        };
        let chain = read_certs(&paths.cert)?;
        check_own_certificate(&paths.cert, &chain[0], std::time::SystemTime::now())?;
        let key_data = std::fs::read(&paths.key).map_err(|e| {
            TransferError::unauthenticated(format!(
                "cannot read key {}: {e}; {hint}",
                paths.key.display()
            ))
        })?;
        let key = PrivateKeyDer::from_pem_slice(&key_data).map_err(|e| {
            TransferError::unauthenticated(format!(
                "{} is not a PEM private key: {e}",
                paths.key.display()
            ))
        })?;
        let mut roots = RootCertStore::empty();
        for c in read_certs(&paths.ca)? {
            roots.add(c).map_err(|e| {
                TransferError::unauthenticated(format!(
                    "CA certificate {} unusable: {e}",
                    paths.ca.display()
                ))
            })?;
        }
        Ok(Self {
            chain,
            key,
            roots: Arc::new(roots),
        })
    }
}

/// OIDs of the proxyCertInfo extension that marks an X.509 proxy certificate: RFC 3820's,
/// and the one of the pre-RFC Globus proxies.
const PROXY_CERT_INFO: [&str; 2] = ["1.3.6.1.5.5.7.1.14", "1.3.6.1.4.1.3536.1.222"];

/// Whether a certificate is an X.509 proxy certificate (RFC 3820).
pub fn is_proxy_certificate(cert: &CertificateDer<'_>) -> bool {
    x509_parser::parse_x509_certificate(cert.as_ref()).is_ok_and(|(_, c)| {
        c.extensions()
            .iter()
            .any(|e| PROXY_CERT_INFO.contains(&e.oid.to_id_string().as_str()))
    })
}

/// Refuses, with what to do about it, a certificate of our own that cannot work: an X.509
/// proxy certificate (which the TLS library would reject with a baffling "key does not match:
/// UnsupportedCriticalExtension"), or one outside its validity period (which a peer would
/// only report as "expired", even when it is not valid *yet*).
fn check_own_certificate(
    path: &Path,
    cert: &CertificateDer<'_>,
    now: std::time::SystemTime,
) -> Result<(), TransferError> {
    let Ok((_, c)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Err(TransferError::unauthenticated(format!(
            "{} is not a valid X.509 certificate",
            path.display()
        )));
    };
    if is_proxy_certificate(cert) {
        return Err(TransferError::unauthenticated(format!(
            "{} is an X.509 proxy certificate (RFC 3820); longhaul does not accept proxies: pass your end-entity certificate and its key (e.g. usercert.pem and userkey.pem)",
            path.display()
        )));
    }
    let now = now
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let v = c.validity();
    if now < v.not_before.timestamp() {
        return Err(TransferError::unauthenticated(format!(
            "{} is not valid before {} (is this machine's clock right?)",
            path.display(),
            v.not_before
        )));
    }
    if now > v.not_after.timestamp() {
        return Err(TransferError::unauthenticated(format!(
            "{} expired on {}; issue a new one with `haul cert issue`",
            path.display(),
            v.not_after
        )));
    }
    Ok(())
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

thread_local! {
    /// The subject of the last client certificate [`NotingVerifier`] refused on this thread.
    static REFUSED_SUBJECT: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// A client refused for its certificate: a TLS handshake that failed on the certificate
/// (or for the lack of one), or a plain connection where a certificate is required.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertRefusal {
    /// The presented certificate's subject, parsed from it (`None`: none was presented).
    pub subject: Option<String>,
}

/// Whether a failed server handshake (`e`) refused the client's certificate, and whose it
/// was; `None` for handshakes that failed for other reasons (garbage, a scanner, an
/// incompatible client). Call it right after the failure (see [`take_refused_subject`]).
pub fn cert_refusal(e: &std::io::Error) -> Option<CertRefusal> {
    let subject = take_refused_subject();
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    let about_certificate = matches!(
        inner,
        Some(rustls::Error::InvalidCertificate(_)) | Some(rustls::Error::NoCertificatesPresented)
    );
    (subject.is_some() || about_certificate).then_some(CertRefusal { subject })
}

/// The subject of the client certificate the last TLS handshake on this thread refused, parsed
/// from the certificate (`"(unparsable certificate)"` when it could not be), and forgets it.
/// A server's handshake runs inside one poll of its accept future and fails from it, so the
/// task that awaited the accept takes this right after the failure, before its next await;
/// calling it before a handshake clears what an earlier one left.
pub fn take_refused_subject() -> Option<String> {
    REFUSED_SUBJECT.with(|s| s.borrow_mut().take())
}

/// The CA's client certificate verifier, noting the subject of each certificate it refuses
/// ([`take_refused_subject`]) so that listeners can log who was refused and why. Verification
/// itself, and the alert the client gets, are the inner verifier's.
///
/// With `delegations`, it also accepts a user's delegation ([`crate::delegation`]): the chain
/// `[delegation, user, ...]` passes when the user's chain passes the CA's verifier and the
/// delegation is the user's and valid now. The handshake's signature is checked against the
/// delegation's key (the end entity's) as for any client.
#[derive(Debug)]
struct NotingVerifier {
    inner: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    delegations: bool,
}

impl rustls::server::danger::ClientCertVerifier for NotingVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        let delegated = self.delegations && crate::delegation::is_delegation(end_entity);
        // A delegation is its user's: the user's certificate is what the CA vouches for.
        let (holder, chain) = match intermediates.split_first() {
            Some((user, rest)) if delegated => (user, rest),
            _ => (end_entity, intermediates),
        };
        let mut verdict = self.inner.verify_client_cert(holder, chain, now);
        if verdict.is_ok() && delegated {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(now.as_secs());
            verdict = match crate::delegation::verify(end_entity, holder, at) {
                Ok(_) => Ok(rustls::server::danger::ClientCertVerified::assertion()),
                Err(e) => Err(rustls::Error::General(e)),
            };
        }
        if verdict.is_err() {
            let subject = subject_of(holder).unwrap_or_else(|| "(unparsable certificate)".into());
            REFUSED_SUBJECT.with(|s| *s.borrow_mut() = Some(subject));
        }
        verdict
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Server side: TLS 1.3 only, client certificate required and verified against the CA.
pub fn server_config(creds: &Credentials) -> Result<Arc<ServerConfig>, TransferError> {
    build_server_config(creds, false)
}

/// [`server_config`] that also accepts users' delegations (a standalone endpoint's: the
/// sessions they open are confined to the delegation's scope, see `endpoint`).
pub fn server_config_accepting_delegations(
    creds: &Credentials,
) -> Result<Arc<ServerConfig>, TransferError> {
    build_server_config(creds, true)
}

fn build_server_config(
    creds: &Credentials,
    delegations: bool,
) -> Result<Arc<ServerConfig>, TransferError> {
    let verifier = WebPkiClientVerifier::builder_with_provider(creds.roots.clone(), provider())
        .build()
        .map_err(|e| {
            TransferError::unauthenticated(format!("cannot build certificate verifier: {e}"))
        })?;
    let verifier = Arc::new(NotingVerifier {
        inner: verifier,
        delegations,
    });
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TransferError::unauthenticated(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(creds.chain.clone(), creds.key.clone_key())
        .map_err(|e| {
            TransferError::unauthenticated(format!("certificate and key do not match: {e}"))
        })?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    cfg.send_tls13_tickets = 0;
    Ok(Arc::new(cfg))
}

/// Client side: TLS 1.3 only, presenting our certificate, trusting the CA.
pub fn client_config(creds: &Credentials) -> Result<Arc<ClientConfig>, TransferError> {
    let mut cfg = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TransferError::unauthenticated(e.to_string()))?
        .with_root_certificates(creds.roots.clone())
        .with_client_auth_cert(creds.chain.clone(), creds.key.clone_key())
        .map_err(|e| {
            TransferError::unauthenticated(format!("certificate and key do not match: {e}"))
        })?;
    cfg.alpn_protocols = vec![ALPN.to_vec(), ALPN_GRPC.to_vec()];
    cfg.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(cfg))
}

/// The subject of a certificate as `/O=.../OU=.../CN=...`, each value escaped
/// ([`crate::certid::escape_value`]): one string per certificate, which no attribute value
/// can forge. Identities beyond the mapfile come from [`crate::certid::CertIdentity`].
pub fn subject_of(cert: &CertificateDer<'_>) -> Option<String> {
    crate::certid::CertIdentity::from_der(cert.as_ref())
        .ok()
        .map(|i| i.subject)
}

/// The subject of the peer's end-entity certificate; for a delegation (which only a
/// [`server_config_accepting_delegations`] lets through) the subject of the user who issued it.
pub fn peer_subject(conn: &rustls::CommonState) -> Option<String> {
    let certs = conn.peer_certificates()?;
    let first = certs.first()?;
    if crate::delegation::is_delegation(first) {
        return certs.get(1).and_then(subject_of);
    }
    subject_of(first)
}

/// The scope of the delegation the peer presented, if it presented one (the handshake
/// verified it; `Err` if it no longer verifies, e.g. expired since).
pub fn peer_delegation(
    conn: &rustls::CommonState,
) -> Result<Option<crate::delegation::Scope>, String> {
    let Some(certs) = conn.peer_certificates() else {
        return Ok(None);
    };
    crate::delegation::verify_chain(certs, std::time::SystemTime::now())
}

/// The host names a host certificate is for (its DNS and IP subject alternative names, and
/// its host common name): the names delegations for this endpoint may give.
pub fn host_names(cert: &CertificateDer<'_>) -> Vec<String> {
    let mut names = Vec::new();
    if let Ok((_, c)) = x509_parser::parse_x509_certificate(cert.as_ref())
        && let Ok(Some(san)) = c.subject_alternative_name()
    {
        for n in &san.value.general_names {
            match n {
                x509_parser::extensions::GeneralName::DNSName(d) => {
                    names.push(d.to_ascii_lowercase())
                }
                x509_parser::extensions::GeneralName::IPAddress(b) => {
                    if let Ok(a) = <[u8; 4]>::try_from(*b) {
                        names.push(std::net::Ipv4Addr::from(a).to_string());
                    } else if let Ok(a) = <[u8; 16]>::try_from(*b) {
                        names.push(std::net::Ipv6Addr::from(a).to_string());
                    }
                }
                _ => {}
            }
        }
    }
    if let Ok(id) = crate::certid::CertIdentity::from_der(cert.as_ref())
        && let Some(h) = id.host
        && !names.contains(&h)
    {
        names.push(h.to_ascii_lowercase());
    }
    names
}

/// A 32-byte value both ends of a TLS connection derive, binding a data stream to this very
/// TLS session.
pub fn exporter_nonce<D>(conn: &rustls::ConnectionCommon<D>) -> Result<[u8; 32], TransferError> {
    let mut out = [0u8; 32];
    conn.export_keying_material(&mut out, EXPORTER_LABEL, None)
        .map_err(|e| TransferError::protocol(format!("TLS exporter unavailable: {e}")))?;
    Ok(out)
}

/// The grid-mapfile: `"<subject>" <identity>[,<identity>...]` per line, `#` comments.
#[derive(Clone, Debug, Default)]
pub struct Mapfile {
    entries: HashMap<String, String>,
}

impl Mapfile {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut entries = HashMap::new();
        for (no, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || {
                format!(
                    "mapfile line {}: expected \"/O=.../CN=name\" localname",
                    no + 1
                )
            };
            let rest = line.strip_prefix('"').ok_or_else(bad)?;
            let end = rest.find('"').ok_or_else(bad)?;
            let subject = &rest[..end];
            let ident = rest[end + 1..]
                .trim()
                .split(',')
                .next()
                .unwrap_or("")
                .trim();
            if subject.is_empty() || ident.is_empty() || ident.contains(char::is_whitespace) {
                return Err(bad());
            }
            entries.insert(subject.to_string(), ident.to_string());
        }
        Ok(Self { entries })
    }

    pub fn load(path: &Path) -> Result<Self, TransferError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            TransferError::usage(format!("cannot read mapfile {}: {e}", path.display()))
        })?;
        Self::parse(&text).map_err(TransferError::usage)
    }

    /// The local identity of a subject, if mapped.
    pub fn lookup(&self, subject: &str) -> Option<&str> {
        self.entries.get(subject).map(String::as_str)
    }

    /// The local accounts subjects are mapped to, each once, sorted.
    pub fn accounts(&self) -> Vec<&str> {
        let mut a: Vec<&str> = self.entries.values().map(String::as_str).collect();
        a.sort_unstable();
        a.dedup();
        a
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Explains a TLS failure in terms of what the user can fix.
pub fn explain_tls_error(peer: &str, e: &std::io::Error) -> TransferError {
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    use rustls::{AlertDescription as A, CertificateError as C, Error as R};
    let msg = match inner {
        Some(R::InvalidCertificate(C::Expired))
        | Some(R::InvalidCertificate(C::ExpiredContext { .. })) => {
            format!("{peer}: its certificate has expired")
        }
        Some(R::InvalidCertificate(C::NotValidYet))
        | Some(R::InvalidCertificate(C::NotValidYetContext { .. })) => {
            format!("{peer}: its certificate is not valid yet (check clocks)")
        }
        Some(R::InvalidCertificate(C::UnknownIssuer)) => {
            format!("{peer}: its certificate is not signed by a CA we trust (check --ca)")
        }
        Some(R::InvalidCertificate(C::NotValidForName))
        | Some(R::InvalidCertificate(C::NotValidForNameContext { .. })) => {
            format!("{peer}: its certificate is not issued for this host name")
        }
        // TLS has one alert for both ends of the validity period.
        Some(R::AlertReceived(A::CertificateExpired)) => {
            format!(
                "{peer} refused our certificate as expired or not yet valid (check its dates and both clocks; issue a new one with `haul cert issue`)"
            )
        }
        Some(R::InvalidCertificate(C::Other(o)))
            if matches!(
                o.0.downcast_ref::<webpki::Error>(),
                Some(webpki::Error::UnsupportedCriticalExtension)
            ) =>
        {
            format!(
                "{peer}: its certificate has a critical extension we do not support (an X.509 proxy certificate? longhaul accepts end-entity certificates only)"
            )
        }
        Some(R::AlertReceived(A::UnknownCA)) | Some(R::AlertReceived(A::BadCertificate)) => {
            format!("{peer} refused our certificate: not signed by a CA it trusts")
        }
        Some(R::AlertReceived(A::DecryptError)) => {
            format!(
                "{peer} refused our certificate: its signature does not verify against the CA it trusts (issued by another CA?)"
            )
        }
        Some(R::InvalidCertificate(C::BadSignature)) => {
            format!(
                "{peer}: its certificate's signature does not verify against our CA (check --ca)"
            )
        }
        Some(R::AlertReceived(A::CertificateRequired)) => {
            format!("{peer} requires a client certificate (pass --cert and --key)")
        }
        Some(other) => format!("{peer}: TLS handshake failed: {other}"),
        None => format!(
            "{peer}: TLS handshake failed: {e} (is the endpoint running with --insecure, or is this not a haul endpoint?)"
        ),
    };
    TransferError::unauthenticated(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate, optionally with the proxyCertInfo extension, valid from
    /// `from` to `to` (years).
    fn made(proxy: bool, from: i32, to: i32) -> CertificateDer<'static> {
        let mut p = rcgen::CertificateParams::new(vec!["x".into()]).unwrap();
        p.not_before = rcgen::date_time_ymd(from, 1, 1);
        p.not_after = rcgen::date_time_ymd(to, 1, 1);
        if proxy {
            // ProxyCertInfo { proxyPolicy { id-ppl-inheritAll } }, critical as RFC 3820 says.
            let info = vec![
                0x30, 0x0c, 0x30, 0x0a, 0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x15, 0x01,
            ];
            let mut ext =
                rcgen::CustomExtension::from_oid_content(&[1, 3, 6, 1, 5, 5, 7, 1, 14], info);
            ext.set_criticality(true);
            p.custom_extensions.push(ext);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        p.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn own_certificates_that_cannot_work_are_refused_with_the_reason() {
        let now = std::time::SystemTime::now();
        let path = Path::new("me.pem");
        assert!(check_own_certificate(path, &made(false, 2020, 2099), now).is_ok());
        let proxy = made(true, 2020, 2099);
        assert!(is_proxy_certificate(&proxy));
        let e = check_own_certificate(path, &proxy, now)
            .unwrap_err()
            .to_string();
        assert!(e.contains("proxy certificate (RFC 3820)"), "{e}");
        let e = check_own_certificate(path, &made(false, 2090, 2099), now)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not valid before") && e.contains("2090"), "{e}");
        let e = check_own_certificate(path, &made(false, 2000, 2001), now)
            .unwrap_err()
            .to_string();
        assert!(e.contains("expired on") && e.contains("2001"), "{e}");
    }

    /// A peer presenting a proxy certificate is refused by the verifier with a message that
    /// says what it is.
    #[test]
    fn a_proxy_certificate_from_a_peer_is_named_as_such() {
        let err = webpki::Error::UnsupportedCriticalExtension;
        let io = std::io::Error::other(rustls::Error::InvalidCertificate(
            rustls::CertificateError::Other(rustls::OtherError(Arc::new(err))),
        ));
        let e = explain_tls_error("peer", &io).to_string();
        assert!(e.contains("X.509 proxy certificate"), "{e}");
        assert_eq!(explain_tls_error("peer", &io).exit_code(), 5);
    }

    #[test]
    fn mapfile_maps_quoted_subjects() {
        let m = Mapfile::parse(
            "# comment\n\"/O=longhaul/OU=users/CN=alice smith\" alice,other\n\n\"/O=x/CN=b\"   bob\n",
        )
        .unwrap();
        assert_eq!(
            m.lookup("/O=longhaul/OU=users/CN=alice smith"),
            Some("alice")
        );
        assert_eq!(m.lookup("/O=x/CN=b"), Some("bob"));
        assert_eq!(m.lookup("/O=x/CN=c"), None);
        assert!(
            Mapfile::parse("/O=x/CN=b bob")
                .unwrap_err()
                .contains("line 1")
        );
        assert!(Mapfile::parse("\"/O=x\"").is_err());
    }

    #[test]
    fn subjects_of_issued_certificates() {
        let dir = tempfile::tempdir().unwrap();
        crate::pki::init_ca(&dir.path().join("ca"), "longhaul", 1).unwrap();
        let subj = crate::pki::issue(
            &dir.path().join("ca"),
            &dir.path().join("u"),
            &crate::pki::Subject::User {
                name: "alice".into(),
            },
            "longhaul",
            &crate::pki::Validity::days(1),
        )
        .unwrap();
        let creds = Credentials::load(&CredentialPaths {
            cert: dir.path().join("u.pem"),
            key: dir.path().join("u.key"),
            ca: dir.path().join("ca/ca.pem"),
        })
        .unwrap();
        assert_eq!(subject_of(&creds.chain[0]).unwrap(), subj.subject);
        server_config(&creds).unwrap();
        client_config(&creds).unwrap();
    }

    #[test]
    fn missing_credentials_say_how_to_make_them() {
        let err = Credentials::load(&CredentialPaths {
            cert: "/nonexistent/c.pem".into(),
            key: "/nonexistent/c.key".into(),
            ca: "/nonexistent/ca.pem".into(),
        })
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("haul cert issue"), "{err}");
    }
}
