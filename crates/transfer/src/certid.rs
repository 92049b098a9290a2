//! Who a certificate names, read from the parsed certificate, never from a subject string: the
//! subject as mapfiles spell it (each value escaped, so that no value can pose as further
//! attributes), whether it is a host certificate and for which host, and its SHA-256
//! fingerprint (what enrolment lists and capabilities are bound to).
//!
//! A *host certificate* has exactly one organizational unit, `hosts`; exactly one common name,
//! which is a DNS name or an IP address; and the serverAuth extended key usage (`haul cert issue
//! --host` makes them so; user certificates have clientAuth only).

use std::fmt;

/// SHA-256 of a certificate's DER encoding.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint of a DER-encoded certificate.
    pub fn of(der: &[u8]) -> Self {
        use sha2::Digest;
        Self(sha2::Sha256::digest(der).into())
    }

    /// Parses `sha256:<64 hex digits>` (the way [`fmt::Display`] writes it; case-insensitive,
    /// colons between bytes allowed, as `openssl x509 -fingerprint -sha256` prints them).
    pub fn parse(s: &str) -> Result<Self, String> {
        let rest = s
            .strip_prefix("sha256:")
            .or_else(|| s.strip_prefix("SHA256:"))
            .ok_or_else(|| format!("{s:?}: expected sha256:<64 hex digits>"))?;
        let hex_digits: String = rest.chars().filter(|c| *c != ':').collect();
        let bytes = hex::decode(&hex_digits)
            .map_err(|_| format!("{s:?}: expected sha256:<64 hex digits>"))?;
        let arr: [u8; 32] = bytes
            .try_into()
            .map_err(|_| format!("{s:?}: a SHA-256 fingerprint has 64 hex digits"))?;
        Ok(Self(arr))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// What a certificate says about its holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertIdentity {
    /// `/O=.../OU=.../CN=...`, values escaped (see [`escape_value`]).
    pub subject: String,
    /// The host a host certificate is for (see the module documentation), else `None`.
    pub host: Option<String>,
    pub fingerprint: Fingerprint,
}

impl CertIdentity {
    /// Parses a DER-encoded certificate (already verified against the CA by TLS).
    pub fn from_der(der: &[u8]) -> Result<Self, String> {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| format!("certificate does not parse: {e}"))?;
        let subject = subject_string(cert.subject())?;
        let host = host_of(&cert);
        Ok(Self {
            subject,
            host,
            fingerprint: Fingerprint::of(der),
        })
    }

    /// The identity of a TLS peer's end-entity certificate, if it presented one that parses.
    pub fn of_peer(conn: &rustls::CommonState) -> Option<Self> {
        let der = conn.peer_certificates()?.first()?;
        Self::from_der(der.as_ref()).ok()
    }
}

/// The fingerprint of a TLS peer's end-entity certificate.
pub fn peer_fingerprint(conn: &rustls::CommonState) -> Option<Fingerprint> {
    conn.peer_certificates()?
        .first()
        .map(|c| Fingerprint::of(c.as_ref()))
}

/// One attribute value as it appears in a subject string: `\`, `/`, `"` and control
/// characters become `\XX` (hex of each UTF-8 byte), so a value can never read as an attribute
/// separator, and a subject always fits between the quotes of a mapfile line.
pub fn escape_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if c == '\\' || c == '/' || c == '"' || c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("\\{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn subject_string(name: &x509_parser::x509::X509Name<'_>) -> Result<String, String> {
    let mut out = String::new();
    for rdn in name.iter() {
        for atv in rdn.iter() {
            let key = x509_parser::objects::oid2abbrev(
                atv.attr_type(),
                x509_parser::objects::oid_registry(),
            )
            .map(str::to_string)
            .unwrap_or_else(|_| atv.attr_type().to_id_string());
            let value = atv
                .as_str()
                .map_err(|_| format!("subject attribute {key} is not a string"))?;
            out.push('/');
            out.push_str(&key);
            out.push('=');
            out.push_str(&escape_value(value));
        }
    }
    Ok(out)
}

/// The host of a host certificate: exactly one OU, `hosts`; exactly one CN, a DNS name or an
/// IP address; serverAuth usage.
fn host_of(cert: &x509_parser::certificate::X509Certificate<'_>) -> Option<String> {
    let subject = cert.subject();
    let units: Vec<_> = subject.iter_organizational_unit().collect();
    if units.len() != 1 || units[0].as_str().ok()? != "hosts" {
        return None;
    }
    let names: Vec<_> = subject.iter_common_name().collect();
    if names.len() != 1 {
        return None;
    }
    let cn = names[0].as_str().ok()?;
    if !is_host_name(cn) {
        return None;
    }
    let eku = cert.extended_key_usage().ok()??;
    eku.value.server_auth.then(|| cn.to_string())
}

/// Whether `s` is a DNS name or an IP address (what a host certificate may be issued for).
pub fn is_host_name(s: &str) -> bool {
    !s.is_empty()
        && !s.ends_with('.')
        && rustls::pki_types::ServerName::try_from(s.to_string()).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair};

    fn cert(dn: &[(DnType, &str)], eku: &[ExtendedKeyUsagePurpose]) -> Vec<u8> {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        let mut d = rcgen::DistinguishedName::new();
        for (t, v) in dn {
            d.push(t.clone(), *v);
        }
        p.distinguished_name = d;
        p.extended_key_usages = eku.to_vec();
        let key = KeyPair::generate().unwrap();
        p.self_signed(&key).unwrap().der().to_vec()
    }

    const SERVER: &[ExtendedKeyUsagePurpose] = &[
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];

    #[test]
    fn a_host_certificate_names_its_host() {
        let der = cert(
            &[
                (DnType::OrganizationName, "longhaul"),
                (DnType::OrganizationalUnitName, "hosts"),
                (DnType::CommonName, "node1.example.org"),
            ],
            SERVER,
        );
        let id = CertIdentity::from_der(&der).unwrap();
        assert_eq!(id.host.as_deref(), Some("node1.example.org"));
        assert_eq!(id.subject, "/O=longhaul/OU=hosts/CN=node1.example.org");
        assert_eq!(id.fingerprint, Fingerprint::of(&der));
        let ip = cert(
            &[
                (DnType::OrganizationalUnitName, "hosts"),
                (DnType::CommonName, "127.0.0.1"),
            ],
            SERVER,
        );
        assert_eq!(
            CertIdentity::from_der(&ip).unwrap().host.as_deref(),
            Some("127.0.0.1")
        );
    }

    /// The attack of issue 11 C2: a user certificate whose CN spells `/OU=hosts/CN=node3` was
    /// taken for node3 when identities were parsed from the subject string.
    #[test]
    fn a_user_name_spelling_a_host_subject_is_no_host() {
        let der = cert(
            &[
                (DnType::OrganizationName, "longhaul"),
                (DnType::OrganizationalUnitName, "users"),
                (DnType::CommonName, "eve/OU=hosts/CN=node3"),
            ],
            &[ExtendedKeyUsagePurpose::ClientAuth],
        );
        let id = CertIdentity::from_der(&der).unwrap();
        assert_eq!(id.host, None);
        assert_eq!(
            id.subject,
            "/O=longhaul/OU=users/CN=eve\\2FOU=hosts\\2FCN=node3"
        );
        // Not even with the server usage and OU=hosts: the CN is no host name.
        let der = cert(
            &[
                (DnType::OrganizationalUnitName, "hosts"),
                (DnType::CommonName, "eve/OU=hosts/CN=node3"),
            ],
            SERVER,
        );
        assert_eq!(CertIdentity::from_der(&der).unwrap().host, None);
    }

    #[test]
    fn host_rules_are_strict() {
        // rcgen keeps one value per attribute type: a second OU or CN is pushed under its
        // numeric OID, which encodes the same.
        let ou_cn = |ous: &[&str], cns: &[&str], eku: &[ExtendedKeyUsagePurpose]| {
            let mut dn = vec![(DnType::OrganizationName, "longhaul")];
            for (i, o) in ous.iter().enumerate() {
                let t = match i {
                    0 => DnType::OrganizationalUnitName,
                    _ => DnType::CustomDnType(vec![2, 5, 4, 11]),
                };
                dn.push((t, *o));
            }
            for (i, c) in cns.iter().enumerate() {
                let t = match i {
                    0 => DnType::CommonName,
                    _ => DnType::CustomDnType(vec![2, 5, 4, 3]),
                };
                dn.push((t, *c));
            }
            CertIdentity::from_der(&cert(&dn, eku)).unwrap().host
        };
        assert_eq!(ou_cn(&["hosts"], &["n1"], SERVER).as_deref(), Some("n1"));
        // Client usage only (a user certificate with OU=hosts).
        assert_eq!(
            ou_cn(&["hosts"], &["n1"], &[ExtendedKeyUsagePurpose::ClientAuth]),
            None
        );
        assert_eq!(ou_cn(&["hosts"], &["n1"], &[]), None);
        // Two units, two names, another unit, no name.
        assert_eq!(ou_cn(&["users", "hosts"], &["n1"], SERVER), None);
        assert_eq!(ou_cn(&["hosts", "hosts"], &["n1"], SERVER), None);
        assert_eq!(ou_cn(&["hosts"], &["n1", "n2"], SERVER), None);
        assert_eq!(ou_cn(&["users"], &["n1"], SERVER), None);
        assert_eq!(ou_cn(&["hosts"], &[], SERVER), None);
        assert_eq!(ou_cn(&["hosts"], &["n 1"], SERVER), None);
        assert_eq!(ou_cn(&["hosts"], &["*.example.org"], SERVER), None);
    }

    #[test]
    fn values_are_escaped_and_fingerprints_round_trip() {
        assert_eq!(escape_value("a/b\\c\"d\ne"), "a\\2Fb\\5Cc\\22d\\0Ae");
        assert_eq!(escape_value("Alice Smith (é)"), "Alice Smith (é)");
        let f = Fingerprint::of(b"x");
        assert_eq!(Fingerprint::parse(&f.to_string()).unwrap(), f);
        let colons: Vec<String> = f.0.iter().map(|b| format!("{b:02X}")).collect();
        assert_eq!(
            Fingerprint::parse(&format!("SHA256:{}", colons.join(":"))).unwrap(),
            f
        );
        assert!(Fingerprint::parse("sha256:abcd").is_err());
        assert!(Fingerprint::parse("md5:00").is_err());
        assert!(is_host_name("node1.example.org"));
        assert!(is_host_name("::1"));
        assert!(!is_host_name(""));
        assert!(!is_host_name("a,b"));
        assert!(!is_host_name("node1."));
    }
}
