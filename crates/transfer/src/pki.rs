//! A small certificate authority for a longhaul federation: `haul ca init` creates the CA,
//! `haul cert issue` signs host certificates (server and client use: hosts also push data to
//! other hosts in third-party transfers) and user certificates (client use).
//!
//! Subjects follow the grid convention `/O=<org>/OU=hosts|users/CN=<name>`, which is what the
//! endpoint's mapfile maps to local identities. Names are checked before anything is signed:
//! host names must be DNS names or IP addresses, and user names and organizations may not hold
//! `/ = , " \`, control characters or nothing at all, so that a subject reads one way only.

use crate::error::TransferError;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use time::{Duration, OffsetDateTime};

/// What kind of certificate to issue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    /// A host: `names` become subject alternative names (DNS names or IP addresses); the
    /// first is the common name.
    Host { names: Vec<String> },
    /// A user, identified by a common name.
    User { name: String },
}

/// Validity of an issued certificate.
#[derive(Clone, Debug)]
pub struct Validity {
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl Validity {
    /// From now (minus a minute of clock skew) for `days` days.
    pub fn days(days: i64) -> Self {
        let now = OffsetDateTime::now_utc();
        Self {
            not_before: now - Duration::minutes(1),
            not_after: now + Duration::days(days),
        }
    }
}

/// Paths of a CA directory.
pub struct CaPaths {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CaPaths {
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            cert: dir.join("ca.pem"),
            key: dir.join("ca.key"),
        }
    }
}

fn io_err(path: &Path, e: std::io::Error) -> TransferError {
    TransferError::local(format!("{}: {e}", path.display()))
}

fn cert_err(e: rcgen::Error) -> TransferError {
    TransferError::local(format!("certificate generation failed: {e}"))
}

/// Writes `contents` to a new file with mode `mode`, refusing to overwrite.
pub fn write_new(path: &Path, contents: &str, mode: u32) -> Result<(), TransferError> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                TransferError::local(format!(
                    "{} already exists; remove it or choose another output",
                    path.display()
                ))
            } else {
                io_err(path, e)
            }
        })?;
    f.write_all(contents.as_bytes())
        .map_err(|e| io_err(path, e))
}

/// What `haul cert issue` made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    /// The subject as the mapfile spells it.
    pub subject: String,
    /// SHA-256 of the certificate, as `haul meta serve --nodes` lists it.
    pub fingerprint: crate::certid::Fingerprint,
}

/// Checks a user name or organization for a subject: not empty, at most 64 characters, none
/// of `/ = , " \` or control characters (they would make the subject read another way in
/// mapfiles and in tools that print subjects).
pub fn check_name(what: &str, name: &str) -> Result<(), TransferError> {
    let bad = |why: &str| {
        Err(TransferError::usage(format!(
            "{what} {name:?} {why}; use letters, digits, spaces, '.', '-', '_' or '@'"
        )))
    };
    if name.trim().is_empty() {
        return bad("is empty");
    }
    if name.chars().count() > 64 {
        return bad("is longer than 64 characters");
    }
    if let Some(c) = name
        .chars()
        .find(|c| matches!(c, '/' | '=' | ',' | '"' | '\\') || c.is_control())
    {
        return bad(&format!("contains {c:?}"));
    }
    Ok(())
}

/// Checks a host name for a host certificate: a DNS name or an IP address.
pub fn check_host(name: &str) -> Result<(), TransferError> {
    if crate::certid::is_host_name(name) {
        Ok(())
    } else {
        Err(TransferError::usage(format!(
            "--host {name:?} is not a DNS name or IP address (letters, digits, '-' and '.', e.g. node1.example.org)"
        )))
    }
}

fn dn(org: &str, unit: &str, cn: &str) -> DistinguishedName {
    let mut d = DistinguishedName::new();
    d.push(DnType::OrganizationName, org);
    d.push(DnType::OrganizationalUnitName, unit);
    d.push(DnType::CommonName, cn);
    d
}

/// Creates a CA (`ca.pem`, `ca.key`) in `dir`. Returns the CA subject.
pub fn init_ca(dir: &Path, org: &str, days: i64) -> Result<String, TransferError> {
    check_name("--org", org)?;
    fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let paths = CaPaths::in_dir(dir);
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(cert_err)?;
    params.distinguished_name = dn(org, "ca", &format!("{org} CA"));
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let v = Validity::days(days);
    params.not_before = v.not_before;
    params.not_after = v.not_after;
    let key = KeyPair::generate().map_err(cert_err)?;
    let cert = params.self_signed(&key).map_err(cert_err)?;
    write_new(&paths.key, &key.serialize_pem(), 0o600)?;
    write_new(&paths.cert, &cert.pem(), 0o644)?;
    Ok(format!("/O={org}/OU=ca/CN={org} CA"))
}

/// Issues a certificate signed by the CA in `ca_dir`, writing `<out>.pem` (certificate) and
/// `<out>.key`. Returns the subject as the mapfile spells it and the certificate's fingerprint.
pub fn issue(
    ca_dir: &Path,
    out: &Path,
    subject: &Subject,
    org: &str,
    validity: &Validity,
) -> Result<Issued, TransferError> {
    check_name("--org", org)?;
    match subject {
        Subject::Host { names } => names.iter().try_for_each(|n| check_host(n))?,
        Subject::User { name } => check_name("--user", name)?,
    }
    let paths = CaPaths::in_dir(ca_dir);
    let ca_pem = fs::read_to_string(&paths.cert).map_err(|e| {
        TransferError::local(format!(
            "cannot read CA certificate {}: {e} (create one with `haul ca init --dir {}`)",
            paths.cert.display(),
            ca_dir.display()
        ))
    })?;
    let ca_key_pem = fs::read_to_string(&paths.key).map_err(|e| io_err(&paths.key, e))?;
    let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(cert_err)?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(cert_err)?;

    let (mut params, unit, cn) = match subject {
        Subject::Host { names } => {
            let Some(first) = names.first() else {
                return Err(TransferError::usage(
                    "a host certificate needs at least one --host name",
                ));
            };
            let mut p = CertificateParams::new(names.clone()).map_err(cert_err)?;
            p.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            (p, "hosts", first.clone())
        }
        Subject::User { name } => {
            let mut p = CertificateParams::new(Vec::<String>::new()).map_err(cert_err)?;
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            (p, "users", name.clone())
        }
    };
    params.distinguished_name = dn(org, unit, &cn);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.not_before = validity.not_before;
    params.not_after = validity.not_after;
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().map_err(cert_err)?;
    let cert = params.signed_by(&key, &issuer).map_err(cert_err)?;
    let key_path = out.with_extension("key");
    let cert_path = out.with_extension("pem");
    write_new(&key_path, &key.serialize_pem(), 0o600)?;
    write_new(&cert_path, &cert.pem(), 0o644)?;
    Ok(Issued {
        subject: format!("/O={org}/OU={unit}/CN={cn}"),
        fingerprint: crate::certid::Fingerprint::of(cert.der()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;

    #[test]
    fn ca_and_certificates_are_written_once_with_private_keys() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca");
        assert_eq!(
            init_ca(&ca, "longhaul", 30).unwrap(),
            "/O=longhaul/OU=ca/CN=longhaul CA"
        );
        let err = init_ca(&ca, "longhaul", 30).unwrap_err().to_string();
        assert!(err.contains("already exists"), "{err}");
        let subj = issue(
            &ca,
            &dir.path().join("host"),
            &Subject::Host {
                names: vec!["localhost".into(), "127.0.0.1".into()],
            },
            "longhaul",
            &Validity::days(1),
        )
        .unwrap();
        assert_eq!(subj.subject, "/O=longhaul/OU=hosts/CN=localhost");
        let pem = fs::read(dir.path().join("host.pem")).unwrap();
        let der = rustls::pki_types::CertificateDer::from_pem_slice(&pem).unwrap();
        assert_eq!(
            subj.fingerprint,
            crate::certid::Fingerprint::of(der.as_ref())
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(dir.path().join("host.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let missing = issue(
            &dir.path().join("nope"),
            &dir.path().join("u"),
            &Subject::User { name: "a".into() },
            "x",
            &Validity::days(1),
        );
        assert!(missing.unwrap_err().to_string().contains("haul ca init"));
    }

    /// Issue 11 C2: names that would make a subject read another way are refused before
    /// anything is signed (`haul cert issue` exits 2).
    #[test]
    fn names_that_would_forge_a_subject_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca");
        init_ca(&ca, "longhaul", 30).unwrap();
        let user = |name: &str, org: &str| {
            issue(
                &ca,
                &dir.path().join("u"),
                &Subject::User { name: name.into() },
                org,
                &Validity::days(1),
            )
        };
        for bad in [
            "eve/OU=hosts/CN=node3",
            "a=b",
            "a,b",
            "a\"b",
            "a\\b",
            "a\nb",
            "a\u{7f}",
            "",
            "  ",
        ] {
            let e = user(bad, "longhaul").unwrap_err();
            assert_eq!(e.kind(), wire::error::ErrorKind::Invalid, "{bad:?}: {e}");
        }
        let e = user("alice", "x/OU=hosts").unwrap_err();
        assert!(e.to_string().contains("--org"), "{e}");
        assert!(init_ca(&dir.path().join("ca2"), "a,b", 1).is_err());
        for bad in ["node/3", "node 3", "*.example.org", "a_b,c", ""] {
            let e = issue(
                &ca,
                &dir.path().join("h"),
                &Subject::Host {
                    names: vec!["ok.example.org".into(), bad.into()],
                },
                "longhaul",
                &Validity::days(1),
            )
            .unwrap_err();
            assert_eq!(e.kind(), wire::error::ErrorKind::Invalid, "{bad:?}: {e}");
        }
        // Nothing was written for the refused ones.
        assert!(!dir.path().join("u.pem").exists());
        assert!(!dir.path().join("h.pem").exists());
        assert!(user("Alice Smith-Jones", "longhaul").is_ok());
    }
}
