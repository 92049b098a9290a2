//! `haul meta serve`: the grid's metadata server.

use crate::args::MetaServeArgs;
use crate::creds;
use crate::serve::shutdown_signal;
use meta::auth::{Groups, Identities};
use meta::{Meta, Settings};
use std::sync::Arc;
use transfer::TransferError;
use transfer::tls::{self, Mapfile};

pub async fn run(a: MetaServeArgs) -> Result<(), TransferError> {
    let c = creds::load_tls(&a.creds)?;
    let mapfile_path = a.mapfile.clone().unwrap_or_else(creds::default_mapfile);
    let mapfile = Mapfile::load(&mapfile_path).map_err(|e| {
        TransferError::usage(format!(
            "{e}; the metadata server maps user certificates with a mapfile (--mapfile)"
        ))
    })?;
    let groups = match &a.groups {
        Some(p) => Groups::load(p).map_err(TransferError::usage)?,
        None => Groups::default(),
    };
    let nodes = match &a.nodes {
        Some(p) => meta::enrol::Enrolment::load(p).map_err(TransferError::usage)?,
        None => {
            tracing::warn!(
                "no --nodes file: no storage node may join until one lists it (`haul cert issue --host` prints its line)"
            );
            meta::enrol::Enrolment::none()
        }
    };
    // SQLite in the data directory unless a database URL is given.
    let (url, _lock) = match &a.db {
        Some(u) => (u.clone(), None),
        None => {
            let dir = a.data.clone().unwrap_or_else(|| {
                std::env::var_os("HOME")
                    .map(std::path::PathBuf::from)
                    .unwrap_or_else(|| "/".into())
                    .join(".haul/meta")
            });
            let lock =
                meta::lock_data_dir(&dir).map_err(|e| TransferError::usage(e.to_string()))?;
            (
                format!("sqlite:{}", dir.join("catalog.db").display()),
                Some(lock),
            )
        }
    };
    let catalog = meta::open_catalog(&url)
        .await
        .map_err(|e| TransferError::connect(format!("catalog database unavailable: {e}")))?;
    let mut weights = meta::fairshare::Weights::default();
    for s in &a.shares {
        weights
            .add(s)
            .map_err(|e| TransferError::usage(format!("--share {e}")))?;
    }
    let settings = Settings {
        heartbeat: a.heartbeat,
        node_timeout: a.node_timeout,
        orphan_grace: a.orphan_grace,
        pending_grace: a.pending_grace,
        reconcile_every: a.reconcile_every,
        scrub_every: a.scrub_every,
        listen: a.limits.limits().map_err(TransferError::usage)?,
        grant_ttl: a.grant_ttl,
        writing_lease: a.writing_lease,
        transfer_log: a.log.open(None)?,
        history: meta::state::Retention {
            max_age: a.history_keep,
            max_records: a.history_max,
        },
        jobs: meta::jobspec::JobSettings {
            sessions: a.job_sessions,
            link_sessions: a.job_link_sessions,
            max_link_sessions: a.job_max_link_sessions,
            batch_files: a.job_batch_files,
            endpoint_sessions: a.job_endpoint_sessions,
            link_streams: a.job_link_streams,
            retry_delay: a.job_retry_delay,
            weights,
            webhooks_to_private: a.job_webhooks_to_private,
        },
    };
    let m = Arc::new(Meta::new(
        catalog,
        Identities {
            mapfile,
            groups,
            admins: a.admins.clone(),
            nodes,
        },
        settings,
    ));
    // The server's own certificate drives node-to-node copies (replication, repairs).
    m.set_credentials(&c)?;
    let (listener, addr) = crate::serve::listen(&a.listen).await?;
    let http = if a.http == "off" {
        None
    } else {
        Some(tokio::net::TcpListener::bind(&a.http).await.map_err(|e| {
            TransferError::usage(format!("cannot listen on {} (--http): {e}", a.http))
        })?)
    };
    let http_addr = http.as_ref().and_then(|h| h.local_addr().ok());
    tracing::info!(%addr, db = %meta::redact_db_url(&url), dashboard = ?http_addr, "metadata server up");
    if a.print_addr {
        match http_addr {
            Some(h) => println!("{addr} http://{h}/"),
            None => println!("{addr}"),
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
    }
    crate::serve::notify_ready(&format!("metadata server on {addr}"));
    meta::run(
        m,
        tls::server_config(&c)?,
        listener,
        http,
        shutdown_signal(),
    )
    .await
    .map_err(|e| TransferError::local(e.to_string()))
}
