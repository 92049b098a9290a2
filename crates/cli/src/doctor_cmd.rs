//! `haul doctor`: prints `transfer::doctor`'s findings for this host and, with an endpoint,
//! for the path to it and its limits.

use crate::args::DoctorArgs;
use crate::creds;
use serde::Serialize;
use transfer::TransferError;
use transfer::client::{self, Peer};
use transfer::doctor::{self, Finding, HostFacts, PathFacts, Status};

#[derive(Serialize)]
struct Report<'a> {
    path: &'a PathFacts,
    bdp_bytes: u64,
    host: &'a HostFacts,
    findings: &'a [Finding],
    failing: usize,
    warnings: usize,
}

pub async fn run(a: DoctorArgs) -> Result<u8, TransferError> {
    let mut path = PathFacts {
        rtt: a.rtt,
        measured: false,
        rate_bps: a.link_rate,
        ..Default::default()
    };
    let mut toward = None;
    if let Some(target) = &a.endpoint {
        let (host, port) = creds::endpoint(target)?;
        let tls = creds::client_tls(&a.creds)?;
        let p = client::probe(&Peer::new(host.clone(), port), tls.as_ref()).await?;
        path.rtt = p.rtt;
        path.measured = true;
        path.peer = Some(p.limits);
        path.peer_name = Some(host);
        path.path_mtu = p.path_mtu;
        toward = p.ip;
    }
    let host = HostFacts::read(toward);
    let findings = doctor::findings(&host, &path);
    let count = |s: Status| findings.iter().filter(|f| f.status == s).count();
    let (failing, warnings) = (count(Status::Fail), count(Status::Warn));
    if a.json {
        let report = Report {
            path: &path,
            bdp_bytes: path.bdp(),
            host: &host,
            findings: &findings,
            failing,
            warnings,
        };
        crate::jsondoc::print_report(&report);
    } else {
        out!(
            "haul doctor: {} at {} {:.1} ms round trip{}: {} in flight",
            wire::units::format_rate(path.rate_bps as f64),
            if path.measured {
                "a measured"
            } else {
                "an assumed"
            },
            path.rtt.as_secs_f64() * 1e3,
            path.peer_name
                .as_ref()
                .map(|n| format!(" to {n}"))
                .unwrap_or_default(),
            wire::units::format_bytes(path.bdp())
        );
        for f in &findings {
            let tag = match f.status {
                Status::Ok => "ok",
                Status::Info => "info",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            out!("{tag:<5} {:<22} {}", f.check, f.detail);
            for line in &f.fix {
                out!("      {line}");
            }
        }
        out!(
            "{failing} failing, {warnings} warnings.{}",
            if failing + warnings > 0 {
                " Persist sysctl settings in /etc/sysctl.d/90-haul.conf (the lines above without \"sysctl -w\")."
            } else {
                ""
            }
        );
    }
    Ok(if failing > 0 { 1 } else { 0 })
}
