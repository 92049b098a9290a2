//! `haul ca init` and `haul cert issue`.

use crate::args::{CaInitArgs, CertIssueArgs};
use transfer::TransferError;
use transfer::pki::{self, Subject, Validity};

pub fn ca_init(a: CaInitArgs) -> Result<(), TransferError> {
    if a.days <= 0 {
        return Err(TransferError::usage("--days must be positive"));
    }
    let subject = pki::init_ca(&a.dir, &a.org, a.days)?;
    println!("created CA {subject}");
    println!("  certificate: {}", a.dir.join("ca.pem").display());
    println!(
        "  key:         {} (keep it private)",
        a.dir.join("ca.key").display()
    );
    Ok(())
}

fn parse_time(s: &str) -> Result<time::OffsetDateTime, TransferError> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).map_err(|e| {
        TransferError::usage(format!(
            "{s:?} is not an RFC 3339 time like 2026-01-31T00:00:00Z: {e}"
        ))
    })
}

/// Reads the user's certificate and key (`--cert`/`--key` or their defaults) and delegates
/// `scope` for `life`.
pub fn delegate(
    creds: &crate::args::CredArgs,
    scope: &transfer::delegation::Scope,
    life: std::time::Duration,
) -> Result<transfer::delegation::Issued, TransferError> {
    let p = crate::creds::paths(creds);
    let read = |f: &std::path::Path, what: &str| {
        std::fs::read_to_string(f).map_err(|e| {
            TransferError::unauthenticated(format!(
                "cannot read your {what} {}: {e} (pass --cert/--key)",
                f.display()
            ))
        })
    };
    let (cert, key) = (read(&p.cert, "certificate")?, read(&p.key, "key")?);
    transfer::delegation::issue(&cert, &key, scope, life)
        .map_err(|e| TransferError::unauthenticated(format!("cannot delegate: {e}")))
}

/// `haul cert delegate`.
pub fn cert_delegate(a: crate::args::CertDelegateArgs) -> Result<(), TransferError> {
    use transfer::delegation::{Grant, Scope};
    if a.hours == 0 || a.hours > 720 {
        return Err(TransferError::usage("--hours: 1 to 720"));
    }
    let grants = a
        .grants
        .iter()
        .map(|g| Grant::parse(g).map_err(TransferError::usage))
        .collect::<Result<Vec<_>, _>>()?;
    let scope = Scope { grants };
    let d = delegate(
        &a.creds,
        &scope,
        std::time::Duration::from_secs(a.hours * 3600),
    )?;
    let (pem, key) = (a.out.with_extension("pem"), a.out.with_extension("key"));
    transfer::pki::write_new(&key, &d.key_pem, 0o600)?;
    if let Err(e) = transfer::pki::write_new(&pem, &d.chain_pem, 0o600) {
        let _ = std::fs::remove_file(&key);
        return Err(e);
    }
    let until = d
        .not_after
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.as_millis() as i64)
        .unwrap_or(0);
    println!("delegated until {}", crate::grid_cmd::rfc3339_ms(until));
    for g in &scope.grants {
        let access = match g.access {
            transfer::delegation::Access::Read => "read",
            transfer::delegation::Access::Write => "read and write",
        };
        println!("  {access} {} at {}", g.path, g.host);
    }
    println!("  credential: {} and {}", pem.display(), key.display());
    Ok(())
}

pub fn cert_issue(a: CertIssueArgs) -> Result<(), TransferError> {
    let subject = match (&a.user, a.hosts.is_empty()) {
        (Some(u), true) => Subject::User { name: u.clone() },
        (None, false) => Subject::Host {
            names: a.hosts.clone(),
        },
        _ => {
            return Err(TransferError::usage(
                "give either --host NAME... or --user NAME",
            ));
        }
    };
    let validity = match (&a.not_before, &a.not_after) {
        (Some(nb), Some(na)) => Validity {
            not_before: parse_time(nb)?,
            not_after: parse_time(na)?,
        },
        _ if a.days <= 0 => return Err(TransferError::usage("--days must be positive")),
        _ => Validity::days(a.days),
    };
    let issued = pki::issue(&a.ca, &a.out, &subject, &a.org, &validity)?;
    let subj = &issued.subject;
    println!("issued {subj}");
    println!("  certificate: {}", a.out.with_extension("pem").display());
    println!("  key:         {}", a.out.with_extension("key").display());
    println!("  fingerprint: {}", issued.fingerprint);
    match &subject {
        Subject::Host { names } => println!(
            "enrolment line (haul meta serve --nodes FILE): {} {}",
            names[0], issued.fingerprint
        ),
        Subject::User { .. } => println!("mapfile line:  \"{subj}\" <local-user>"),
    }
    Ok(())
}
