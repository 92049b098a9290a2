//! The command lines of longhaul's daemons over a [`Pki`]: `haul meta serve` with the
//! server's certificate, the CA, the mapfile, the groups (when present) and the enrolment
//! file; `haul node serve` with a node's certificate. Both print their address first
//! (`--print-addr`), for [`crate::process::Proc::start`]. The caller adds what its grid
//! needs beyond that (timers, dashboards, databases).

use crate::pki::Pki;
use std::path::Path;
use std::process::Command;

/// Adds `meta serve` and its arguments to `cmd` (a command that runs `haul`): API on
/// `listen`, catalog and state in `data`.
pub fn meta_serve(cmd: &mut Command, pki: &Pki, listen: &str, data: &Path) {
    cmd.args([
        "meta",
        "serve",
        "--listen",
        listen,
        "--print-addr",
        "--data",
    ])
    .arg(data)
    .arg("--cert")
    .arg(pki.cert("meta"))
    .arg("--key")
    .arg(pki.key("meta"))
    .arg("--ca")
    .arg(pki.ca())
    .arg("--mapfile")
    .arg(pki.mapfile())
    .arg("--nodes")
    .arg(pki.enrolment());
    if pki.groups().exists() {
        cmd.arg("--groups").arg(pki.groups());
    }
}

/// Adds `node serve` and its arguments to `cmd`: a node of `site` with the certificate
/// `cert` (whose CN is the node's name), registering with the metadata server at `meta_url`
/// (`haul://HOST:PORT`), storing below `root`, listening on `listen`.
pub fn node_serve(
    cmd: &mut Command,
    pki: &Pki,
    (cert, site): (&str, &str),
    meta_url: &str,
    root: &Path,
    listen: &str,
) {
    cmd.args([
        "node",
        "serve",
        "--print-addr",
        "--meta",
        meta_url,
        "--site",
        site,
    ])
    .arg("--root")
    .arg(root)
    .args(["--listen", listen])
    .arg("--cert")
    .arg(pki.cert(cert))
    .arg("--key")
    .arg(pki.key(cert))
    .arg("--ca")
    .arg(pki.ca());
}
