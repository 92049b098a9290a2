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
