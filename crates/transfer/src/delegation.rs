//! Delegated credentials: what a user hands a service (the metadata server running a job) so
//! that it can act as the user at standalone endpoints for a while, and only there and on the
//! paths named.
//!
//! A *delegation* is an X.509 certificate for a fresh key, issued and signed by the user's own
//! certificate (not by a CA), short-lived, and carrying the longhaul delegation extension that
//! lists its scope, one grant per line: `read HOST PATH` or `write HOST PATH` (the path and
//! everything below it, at the endpoint whose host certificate names HOST). The holder
//! presents the chain `[delegation, user certificate, ...]`; an endpoint that accepts
//! delegations verifies the user's certificate against its CA as for any client, then the
//! delegation's signature with the user's key, its validity period, that it names the user's
//! certificate as issuer and that it is not itself signed by a delegation (one level only).
//! The session is the user's (the mapfile maps the user's subject), confined to the scope.
//!
//! Why not RFC 3820 proxy certificates: no TLS library here verifies them (rustls refuses the
//! critical proxyCertInfo extension), and their policy language says nothing of paths. This
//! format is written by hand because no maintained crate scopes a delegation to paths; the
//! cryptography is rcgen's (issuing), x509-parser's with ring (the one signature check) and
//! rustls-webpki's (the user's chain).

use rcgen::{CertificateParams, CustomExtension, DnType, Issuer, KeyPair};
use rustls::pki_types::CertificateDer;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// OID of the delegation extension: 2.25.N, a UUID-derived arc (ITU-T X.667) needing no
/// registration; N is a random 64-bit value fixed for longhaul.
pub const OID: [u64; 3] = [2, 25, 12_993_370_912_839_514_467];

/// The longest life a delegation may have.
pub const MAX_LIFE: Duration = Duration::from_secs(30 * 24 * 3600);

pub use wire::delegation::{Access, Grant, MAX_GRANTS, MAX_SCOPE_BYTES, Scope, normalize};

/// A delegation the holder may use: its certificate chain and key, PEM.
#[derive(Clone, Debug)]
pub struct Issued {
    pub chain_pem: String,
    pub key_pem: String,
    pub not_after: SystemTime,
}

/// Issues a delegation of `scope` for `life` (at most [`MAX_LIFE`]), signed with the user's
/// certificate `user_pem` (its first certificate) and key `user_key_pem`. The chain holds the
/// delegation, then the user's chain.
pub fn issue(
    user_pem: &str,
    user_key_pem: &str,
    scope: &Scope,
    life: Duration,
) -> Result<Issued, String> {
    use rustls::pki_types::pem::PemObject;
    if life.is_zero() || life > MAX_LIFE {
        return Err(format!(
            "a delegation lives from a second to {} days",
            MAX_LIFE.as_secs() / 86400
        ));
    }
    if scope.grants.is_empty() || scope.grants.len() > MAX_GRANTS {
        return Err(format!("a delegation has 1 to {MAX_GRANTS} grants"));
    }
    let user_chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(user_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("user certificate: {e}"))?;
    let user = user_chain.first().ok_or("no user certificate")?;
    if is_delegation(user) {
        return Err("a delegation cannot delegate again: use your own certificate".into());
    }
    let user_key = KeyPair::from_pem(user_key_pem).map_err(|e| format!("user key: {e}"))?;
    let issuer =
        Issuer::from_ca_cert_der(user, user_key).map_err(|e| format!("user certificate: {e}"))?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    let subject = crate::certid::CertIdentity::from_der(user.as_ref())?.subject;
    // The delegation's own name says what it is; who it acts for is its issuer's.
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationalUnitName, "delegations");
    params.distinguished_name.push(
        DnType::CommonName,
        format!(
            "delegation of {}",
            subject.chars().take(40).collect::<String>()
        ),
    );
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    let now = SystemTime::now();
    // A little slack for clocks behind ours.
    params.not_before = (now - Duration::from_secs(300)).into();
    let not_after = now + life;
    params.not_after = not_after.into();
    let text = scope.render();
    if text.len() > MAX_SCOPE_BYTES {
        return Err(format!("delegation scope over {MAX_SCOPE_BYTES} bytes"));
    }
    params.custom_extensions = vec![CustomExtension::from_oid_content(&OID, text.into_bytes())];
    let key = KeyPair::generate().map_err(|e| e.to_string())?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| format!("cannot sign the delegation: {e}"))?;
    let mut chain_pem = cert.pem();
    if !chain_pem.ends_with('\n') {
        chain_pem.push('\n');
    }
    chain_pem.push_str(user_pem.trim_start());
    Ok(Issued {
        chain_pem,
        key_pem: key.serialize_pem(),
        not_after,
    })
}

fn scope_extension<'a>(
    c: &'a x509_parser::certificate::X509Certificate<'a>,
) -> Option<&'a x509_parser::extensions::X509Extension<'a>> {
    let oid = x509_parser::der_parser::oid::Oid::from(&OID).ok()?;
    c.extensions().iter().find(|e| e.oid == oid)
}

/// Whether a certificate carries the delegation extension.
pub fn is_delegation(cert: &CertificateDer<'_>) -> bool {
    x509_parser::parse_x509_certificate(cert.as_ref())
        .is_ok_and(|(_, c)| scope_extension(&c).is_some())
}

/// Checks that `delegation` was issued by `user` (whose own chain the caller verifies against
/// the CA) and is valid at `now`; returns its scope.
pub fn verify(
    delegation: &CertificateDer<'_>,
    user: &CertificateDer<'_>,
    now: SystemTime,
) -> Result<Scope, String> {
    let (_, d) = x509_parser::parse_x509_certificate(delegation.as_ref())
        .map_err(|e| format!("delegation does not parse: {e}"))?;
    let (_, u) = x509_parser::parse_x509_certificate(user.as_ref())
        .map_err(|e| format!("delegating certificate does not parse: {e}"))?;
    let ext = scope_extension(&d).ok_or("not a delegation")?;
    if scope_extension(&u).is_some() {
        return Err("a delegation signed by a delegation".into());
    }
    if u.is_ca() {
        return Err("a delegation must be signed by a user's certificate, not a CA".into());
    }
    if d.is_ca() {
        return Err("a delegation cannot be a CA".into());
    }
    if d.issuer().as_raw() != u.subject().as_raw() {
        return Err("the delegation does not name the presented user certificate as issuer".into());
    }
    d.verify_signature(Some(u.public_key()))
        .map_err(|_| "the delegation's signature is not the user's")?;
    let now = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let v = d.validity();
    if now < v.not_before.timestamp() || now > v.not_after.timestamp() {
        return Err(format!("the delegation expired on {}", v.not_after));
    }
    if v.not_after.timestamp() - v.not_before.timestamp() > MAX_LIFE.as_secs() as i64 + 600 {
        return Err("the delegation lives longer than 30 days".into());
    }
    Scope::parse(ext.value)
}

/// The scope of `certs` if they are a delegation chain (`[delegation, user, ...]`) whose
/// delegation the user issued and which is valid at `now`; `Ok(None)` for a chain that is
/// not a delegation. (The user's own chain is the caller's to verify against its CA.)
pub fn verify_chain(
    certs: &[CertificateDer<'_>],
    now: SystemTime,
) -> Result<Option<Scope>, String> {
    match certs {
        [first, user, ..] if is_delegation(first) => verify(first, user, now).map(Some),
        [first, ..] if is_delegation(first) => {
            Err("a delegation without its user's certificate".into())
        }
        _ => Ok(None),
    }
}

/// Parses a delegation's PEM chain and checks it as [`verify_chain`] does (it must be one);
/// returns its scope and the user's certificate.
pub fn verify_pem(
    chain_pem: &str,
    now: SystemTime,
) -> Result<(Scope, CertificateDer<'static>), String> {
    use rustls::pki_types::pem::PemObject;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the delegation is not PEM: {e}"))?;
    match verify_chain(&chain, now)? {
        Some(scope) => Ok((scope, chain[1].clone())),
        None => Err("not a delegation chain (the delegation, then your certificate)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;

    fn user(dir: &std::path::Path, name: &str) -> (String, String) {
        let ca = dir.join("ca");
        if !ca.join("ca.pem").exists() {
            crate::pki::init_ca(&ca, "longhaul", 30).unwrap();
        }
        let out = dir.join(name);
        crate::pki::issue(
            &ca,
            &out,
            &crate::pki::Subject::User { name: name.into() },
            "longhaul",
            &crate::pki::Validity::days(1),
        )
        .unwrap();
        (
            std::fs::read_to_string(out.with_extension("pem")).unwrap(),
            std::fs::read_to_string(out.with_extension("key")).unwrap(),
        )
    }

    fn chain(pem: &str) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap()
    }

    fn scope(lines: &str) -> Scope {
        Scope::parse(format!("longhaul-delegation 1\n{lines}").as_bytes()).unwrap()
    }

    #[test]
    fn a_delegation_verifies_against_its_user_only_and_only_while_valid() {
        let dir = tempfile::tempdir().unwrap();
        let (alice, alice_key) = user(dir.path(), "alice");
        let (bob, bob_key) = user(dir.path(), "bob");
        let s = scope("write dtn.example.org /out\nread dtn.example.org /in/a.dat");
        let d = issue(&alice, &alice_key, &s, Duration::from_secs(3600)).unwrap();
        let c = chain(&d.chain_pem);
        assert_eq!(c.len(), 2, "delegation then the user's certificate");
        assert!(is_delegation(&c[0]) && !is_delegation(&c[1]));
        let now = SystemTime::now();
        assert_eq!(verify(&c[0], &c[1], now).unwrap(), s);
        // Presented with another user's certificate: refused.
        let b = chain(&bob)[0].clone();
        let e = verify(&c[0], &b, now).unwrap_err();
        assert!(e.contains("issuer"), "{e}");
        // Expired, and not yet valid.
        let e = verify(&c[0], &c[1], now + Duration::from_secs(7200)).unwrap_err();
        assert!(e.contains("expired"), "{e}");
        assert!(verify(&c[0], &c[1], now - Duration::from_secs(3600)).is_err());
        // Signed by bob's key under alice's name: the signature check refuses it.
        let forged = issue(&alice, &bob_key, &s, Duration::from_secs(3600));
        if let Ok(f) = forged {
            let e = verify(&chain(&f.chain_pem)[0], &c[1], now).unwrap_err();
            assert!(e.contains("signature"), "{e}");
        }
        // A delegation cannot delegate.
        let e = issue(&d.chain_pem, &d.key_pem, &s, Duration::from_secs(60)).unwrap_err();
        assert!(e.contains("cannot delegate"), "{e}");
        let e = verify(&c[0], &c[0], now).unwrap_err();
        assert!(e.contains("delegation"), "{e}");
        // The life is bounded.
        assert!(issue(&alice, &alice_key, &s, MAX_LIFE + Duration::from_secs(1)).is_err());
        // A plain user certificate is no delegation.
        assert!(verify(&c[1], &c[1], now).is_err());
        // As a chain, and as PEM.
        assert_eq!(verify_chain(&c, now).unwrap(), Some(s.clone()));
        assert_eq!(verify_chain(&c[1..], now).unwrap(), None);
        assert!(verify_chain(&c[..1], now).is_err());
        let (scope, user) = verify_pem(&d.chain_pem, now).unwrap();
        assert_eq!((scope, user), (s.clone(), c[1].clone()));
        assert!(verify_pem(&alice, now).is_err());
        assert!(verify_pem("garbage", now).is_err());
    }
}
