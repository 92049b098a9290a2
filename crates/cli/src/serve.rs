//! `haul serve`: a standalone endpoint.

use crate::args::ServeArgs;
use crate::creds;
use std::sync::Arc;
use transfer::TransferError;
use transfer::endpoint::{EndpointConfig, EndpointTls};
use transfer::tls::{self, Mapfile};
use transfer::tree::TreeService;

pub async fn run(a: ServeArgs) -> Result<(), TransferError> {
    let (tls, mapfile) = match creds::load(&a.creds)? {
        None => (None, Mapfile::default()),
        Some(c) => {
            let path = a.mapfile.clone().unwrap_or_else(creds::default_mapfile);
            let mapfile = Mapfile::load(&path).map_err(|e| {
                TransferError::usage(format!(
                    "{e}; an endpoint with TLS needs a mapfile of allowed subjects (--mapfile)"
                ))
            })?;
            if mapfile.is_empty() {
                tracing::warn!(path = %path.display(), "the mapfile maps nobody: every client will be refused");
            }
            if transfer::sys::effective_uid() == 0 {
                let missing: Vec<&str> = mapfile
                    .accounts()
                    .into_iter()
                    .filter(|a| matches!(transfer::identity::FsIdentity::lookup(a), Ok(None)))
                    .collect();
                tracing::info!(
                    "running as root: each session reads and writes as the local account its certificate is mapped to"
                );
                if !missing.is_empty() {
                    tracing::warn!(
                        accounts = %missing.join(", "),
                        "the mapfile names accounts this host does not have: their subjects will be refused"
                    );
                }
            }
            (
                Some(EndpointTls {
                    // Users may delegate to services (a metadata server running their
                    // jobs) the right to act for them here, on the paths they name.
                    server: tls::server_config_accepting_delegations(&c)?,
                    client: tls::client_config(&c)?,
                    delegation_hosts: tls::host_names(&c.chain[0]),
                }),
                mapfile,
            )
        }
    };
    let log = a.log.open(None)?;
    let trace_dir = a.trace.dir()?;
    let meta = std::fs::metadata(&a.root)
        .map_err(|e| TransferError::usage(format!("--root {}: {e}", a.root.display())))?;
    if !meta.is_dir() {
        return Err(TransferError::usage(format!(
            "--root {} is not a directory",
            a.root.display()
        )));
    }
    let (listener, addr) = listen(&a.listen).await?;
    let metrics = metrics_listener(&a.metrics).await?;
    tracing::info!(%addr, root = %a.root.display(), tls = tls.is_some(), "serving");
    print_addrs(a.print_addr, addr, metrics.as_ref().map(|m| m.1));
    notify_ready(&format!("serving {} on {addr}", a.root.display()));
    let stats = Arc::new(transfer::endpoint::EndpointStats::default());
    let stop_metrics = tokio_util::sync::CancellationToken::new();
    let _stop_metrics = stop_metrics.clone().drop_guard();
    if let Some((listener, _)) = metrics {
        let mut registry = prometheus_client::registry::Registry::default();
        stats.metrics.register(&mut registry);
        transfer::metrics::register_build_info(&mut registry);
        tokio::spawn(transfer::metrics::serve(
            listener,
            Arc::new(registry),
            stop_metrics,
        ));
    }
    // As root with TLS, every session acts as the local account its certificate maps to.
    let switch_users = tls.is_some() && transfer::sys::effective_uid() == 0;
    let cfg = EndpointConfig {
        root: a.root,
        tls,
        service: Arc::new(TreeService::new(mapfile, a.read_only, switch_users)),
        limits: transfer::limits::Limits {
            perf_max: std::time::Duration::from_secs(a.perf_max_seconds),
            ..a.limits.limits().map_err(TransferError::usage)?
        },
        link_bps: a.link_rate,
        checkpoint_interval: a.checkpoint_interval,
        stats,
        log,
        trace_dir,
    };
    transfer::endpoint::run(cfg, listener, shutdown_signal()).await
}

/// The listener of `--metrics`, when given, and the address it got.
pub async fn metrics_listener(
    a: &crate::args::MetricsArgs,
) -> Result<Option<(tokio::net::TcpListener, std::net::SocketAddr)>, TransferError> {
    match &a.addr {
        None => Ok(None),
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                TransferError::usage(format!("--metrics: cannot listen on {addr}: {e}"))
            })?;
            let local = listener
                .local_addr()
                .map_err(|e| TransferError::local(e.to_string()))?;
            tracing::info!(metrics = %format!("http://{local}/metrics"), "serving metrics");
            Ok(Some((listener, local)))
        }
    }
}

/// `--print-addr`: the service's address on stdout, followed on the same line by the metrics
/// URL when there is one (`127.0.0.1:5811 http://127.0.0.1:9812/metrics`, as `haul meta
/// serve` prints its dashboard's).
pub fn print_addrs(print: bool, addr: std::net::SocketAddr, metrics: Option<std::net::SocketAddr>) {
    if !print {
        return;
    }
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = match metrics {
        Some(m) => writeln!(out, "{addr} http://{m}/metrics"),
        None => writeln!(out, "{addr}"),
    };
    let _ = out.flush();
}

/// Tells the service manager (systemd's `Type=notify`, through `$NOTIFY_SOCKET`) that the
/// daemon is listening, with a status line; nothing without `$NOTIFY_SOCKET`. Called once the
/// listeners are bound, so a unit ordered after this one starts when it can be reached.
pub fn notify_ready(status: &str) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let states = [
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(status),
    ];
    if let Err(e) = sd_notify::notify(false, &states) {
        tracing::warn!(error = %e, "cannot tell the service manager that this daemon is ready (NOTIFY_SOCKET)");
    }
}

/// Listens on `addr` (`host:port`, port 0 for any): the listener and the address it got.
pub async fn listen(
    addr: &str,
) -> Result<(tokio::net::TcpListener, std::net::SocketAddr), TransferError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| TransferError::usage(format!("cannot listen on {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| TransferError::local(e.to_string()))?;
    Ok((listener, local))
}

pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
    tracing::info!("shutting down");
}
