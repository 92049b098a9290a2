//! Resolving TLS credentials from flags, environment and `~/.haul/`, and the endpoint a
//! command that talks to one (`haul doctor`, `haul perf`) names.

use crate::args::{CredArgs, EndpointCredArgs};
use std::path::PathBuf;
use transfer::TransferError;
use transfer::tls::{CredentialPaths, Credentials};

fn home_file(name: &str) -> PathBuf {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"));
    home.join(".haul").join(name)
}

/// Credential paths, defaulting to `~/.haul/{cert,key,ca}.pem`.
pub fn paths(a: &CredArgs) -> CredentialPaths {
    CredentialPaths {
        cert: a.cert.clone().unwrap_or_else(|| home_file("cert.pem")),
        key: a.key.clone().unwrap_or_else(|| home_file("key.pem")),
        ca: a.ca.clone().unwrap_or_else(|| home_file("ca.pem")),
    }
}

/// Loads the credentials (the grid's commands and daemons: no `--insecure` there).
pub fn load_tls(a: &CredArgs) -> Result<Credentials, TransferError> {
    Credentials::load(&paths(a))
}

/// Loads credentials unless `--insecure`, which is announced loudly.
pub fn load(a: &EndpointCredArgs) -> Result<Option<Credentials>, TransferError> {
    if a.insecure {
        tracing::warn!("--insecure: no TLS and no authentication; for local tests only");
        return Ok(None);
    }
    load_tls(&a.tls).map(Some)
}

/// The client TLS settings of these credentials (`None` with `--insecure`).
pub fn client_tls(
    a: &EndpointCredArgs,
) -> Result<Option<transfer::conn::ClientTls>, TransferError> {
    match load(a)? {
        Some(c) => Ok(Some(transfer::conn::ClientTls {
            config: transfer::tls::client_config(&c)?,
        })),
        None => Ok(None),
    }
}

/// The host and port of an endpoint named as `haul://host[:port]`.
pub fn endpoint(target: &str) -> Result<(String, u16), TransferError> {
    match transfer::client::Location::parse(target)? {
        transfer::client::Location::Remote { host, port, .. } => Ok((host, port)),
        _ => Err(TransferError::usage(format!(
            "{target}: name an endpoint as haul://host[:port]"
        ))),
    }
}

pub fn default_mapfile() -> PathBuf {
    home_file("mapfile")
}
