//! `haul node serve`: a grid storage node.

use crate::args::NodeServeArgs;
use crate::creds;
use crate::serve::shutdown_signal;
use transfer::TransferError;
use transfer::endpoint::EndpointTls;
use transfer::tls;

pub async fn run(a: NodeServeArgs) -> Result<(), TransferError> {
    let c = creds::load_tls(&a.creds)?;
    // The host a host certificate is for, from the parsed certificate.
    let cn = c
        .chain
        .first()
        .and_then(|d| transfer::certid::CertIdentity::from_der(d.as_ref()).ok())
        .and_then(|id| id.host);
    let name = match (&a.name, &cn) {
        (Some(n), Some(cn)) if n != cn => {
            return Err(TransferError::usage(format!(
                "--name {n} does not match the host certificate, which is for {cn}; the metadata server knows a node by its certificate"
            )));
        }
        (Some(n), _) => n.clone(),
        (None, Some(cn)) => cn.clone(),
        (None, None) => {
            return Err(TransferError::usage(
                "the certificate is not a host certificate (OU=hosts, serverAuth, a host name as CN); issue one with `haul cert issue --host NAME`",
            ));
        }
    };
    let (meta_peer, _) = crate::grid_cmd::target(&a.meta)?;
    let log = a.log.open(Some(a.site.clone()))?;
    std::fs::create_dir_all(&a.root)
        .map_err(|e| TransferError::usage(format!("--root {}: {e}", a.root.display())))?;
    let (listener, addr) = crate::serve::listen(&a.listen).await?;
    let advertise = match &a.advertise {
        Some(adv) => adv.clone(),
        None if addr.ip().is_unspecified() => format!("{}:{}", name, addr.port()),
        None => addr.to_string(),
    };
    let metrics = crate::serve::metrics_listener(&a.metrics).await?;
    tracing::info!(%addr, %advertise, node = %name, site = %a.site, "storage node up");
    crate::serve::print_addrs(a.print_addr, addr, metrics.as_ref().map(|m| m.1));
    crate::serve::notify_ready(&format!("storage node {name} of site {} on {addr}", a.site));
    let cfg = node::NodeConfig {
        name,
        site: a.site.clone(),
        root: a.root.clone(),
        meta: meta_peer,
        advertise,
        tls: EndpointTls {
            server: tls::server_config(&c)?,
            client: tls::client_config(&c)?,
            delegation_hosts: Vec::new(),
        },
        limits: transfer::limits::Limits {
            perf_max: std::time::Duration::from_secs(a.perf_max_seconds),
            ..a.limits.limits().map_err(TransferError::usage)?
        },
        link_bps: a.link_rate,
        capacity: a.capacity,
        log,
        trace_dir: a.trace.dir()?,
        metrics: metrics.map(|m| m.0),
    };
    node::run(cfg, listener, shutdown_signal())
        .await
        .map_err(|e| TransferError::local(e.to_string()))
}
