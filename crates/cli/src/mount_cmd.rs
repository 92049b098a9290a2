//! `haul mount`: the command line of the `mount` crate (a grid directory as a FUSE file
//! system), with the user's certificate.

use crate::args::MountArgs;
use crate::creds;
use transfer::TransferError;
use transfer::client::CopyOptions;
use transfer::conn::ClientTls;
use wire::control::SessionOptions;
use wire::retry::RetryPolicy;

pub async fn run(a: MountArgs) -> Result<u8, TransferError> {
    if a.stall_timeout.is_zero() || a.meta_timeout.is_zero() {
        return Err(TransferError::usage(
            "--stall-timeout and --meta-timeout must be positive",
        ));
    }
    let cache_size = a.cache_size.unwrap_or(match a.cache {
        Some(_) => 4 << 30,
        None => 2 << 30,
    });
    if cache_size < a.read_ahead {
        return Err(TransferError::usage(format!(
            "--cache-size ({cache_size}) must hold at least the read-ahead ({})",
            a.read_ahead
        )));
    }
    let (peer, path) = crate::grid_cmd::target(&a.path)?;
    let creds = creds::load_tls(&a.creds)?;
    let config = transfer::tls::client_config(&creds)?;
    let meta = grid::MetaClient::connect(&peer, config.clone()).await?;
    let session = SessionOptions {
        stall_timeout_ms: a.stall_timeout.as_millis() as u64,
        ..SessionOptions::default()
    };
    let copy = CopyOptions {
        recursive: false,
        range: None,
        session,
        retry: RetryPolicy::default(),
        tls: Some(ClientTls { config }),
        link_bps: a.link_rate,
        checkpoint_interval: std::time::Duration::from_secs(5),
        // Each extent is a data session with a storage node: reusing the control connection
        // of one that ended saves three round trips of its start.
        control_pool: Some(Default::default()),
        peer_tls: Vec::new(),
        zero_copy: true,
        trace: None,
        receiver_evidence: false,
    };
    let opts = mount::MountOptions {
        root: if path.is_empty() { "/".into() } else { path },
        mountpoint: a.mountpoint,
        site: a.site,
        cache_dir: a.cache,
        cache_size,
        read_ahead: a.read_ahead,
        attr_ttl: a.attr_ttl,
        meta_timeout: a.meta_timeout,
        fetch_sessions: a.fetch_sessions,
        copy,
        threads: a.threads,
        page_cache: a.page_cache,
        passthrough: !a.no_passthrough,
    };
    mount::serve(meta, opts, crate::serve::shutdown_signal()).await?;
    Ok(0)
}
