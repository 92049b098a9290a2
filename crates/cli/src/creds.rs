//! Resolving TLS credentials from flags, environment and `~/.haul/`.

use crate::args::CredArgs;
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

/// Loads credentials unless `--insecure`, which is announced loudly.
pub fn load(a: &CredArgs) -> Result<Option<Credentials>, TransferError> {
    if a.insecure {
        tracing::warn!("--insecure: no TLS and no authentication; for local tests only");
        return Ok(None);
    }
    Credentials::load(&paths(a)).map(Some)
}

pub fn default_mapfile() -> PathBuf {
    home_file("mapfile")
}
