//! `haul cp`.

use crate::args::{CpArgs, ProtectArg};
use crate::creds;
use crate::progress::{self, Progress};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use transfer::TransferError;
use transfer::client::{self, CopyOptions, CopyReport, Location};
use transfer::conn::ClientTls;
use transfer::progress::Counters;
use transfer::translog::{self, Recorder, Role, SessionFacts};
use wire::control::{Protect, SessionOptions};
use wire::error::ErrorKind;
use wire::retry::RetryPolicy;

fn options(a: &CpArgs, tls: Option<ClientTls>) -> Result<CopyOptions, TransferError> {
    let checksums = wire::checksum::parse_algorithms(&a.checksum).map_err(TransferError::usage)?;
    if a.block_size < 4096 || a.block_size > wire::codec::MAX_BLOCK_LEN as u64 {
        return Err(TransferError::usage(
            "--block-size must be between 4K and 16M",
        ));
    }
    if a.stall_timeout.is_zero() {
        return Err(TransferError::usage("--stall-timeout must be positive"));
    }
    let range = match (a.offset, a.length) {
        (Some(o), Some(l)) => Some((o, l)),
        (None, Some(l)) => Some((0, l)),
        (Some(_), None) => unreachable!("clap requires --length with --offset"),
        (None, None) => None,
    };
    let session = SessionOptions {
        checksums,
        block_size: a.block_size as u32,
        protect: match a.protect {
            ProtectArg::Clear => Protect::Clear,
            ProtectArg::Private => Protect::Private,
        },
        congestion: a.cc.clone(),
        congestion_required: a.cc.is_some(),
        rate_bps: a.rate,
        tcp_buffer: a.tcp_buffer,
        streams: a.parallel,
        resume: a.resume,
        concurrency: a.concurrency,
        fsync: !a.no_fsync,
        stall_timeout_ms: a.stall_timeout.as_millis() as u64,
        file_attempts: 3,
        shared_path: false,
    };
    Ok(CopyOptions {
        recursive: a.recursive,
        range,
        session,
        retry: RetryPolicy {
            max_attempts: a.retries + 1,
            ..Default::default()
        },
        tls,
        link_bps: a.link_rate,
        checkpoint_interval: a.checkpoint_interval,
        control_pool: None,
        peer_tls: Vec::new(),
        zero_copy: !a.no_zero_copy,
        trace: None,
        // The destination's evidence for the bottleneck report (--explain, --json).
        receiver_evidence: true,
    })
}

pub async fn run(a: CpArgs) -> Result<u8, TransferError> {
    let src = Location::parse(&crate::grid_cmd::expand_default_meta(&a.src)?)?;
    let dst = Location::parse(&crate::grid_cmd::expand_default_meta(&a.dst)?)?;
    if let Location::Local(p) = &src
        && p.is_absolute()
        && p.symlink_metadata().is_err()
        && std::env::var_os("HAUL_META").is_some_and(|m| !m.is_empty())
    {
        // `/path` is local in `cp`; with HAUL_META set the user may have meant the grid.
        return Err(TransferError::not_found(format!(
            "{}: no such local file or directory; for that path on the grid HAUL_META names, write haul://{}",
            p.display(),
            p.display()
        )));
    }
    if a.protect == ProtectArg::Private && a.creds.insecure {
        return Err(TransferError::usage(
            "--protect private needs TLS and cannot be combined with --insecure",
        ));
    }
    // Refused before anything moves when it cannot be written.
    let log = a.log.open(a.site.clone())?;
    let trace = match &a.trace {
        Some(_) if !matches!((&src, &dst), (Location::Local(_), Location::Remote { .. })) => {
            return Err(TransferError::usage(
                "--trace traces the sending side, and this copy does not send from here: trace a download on its endpoint (haul serve --trace-dir DIR)",
            ));
        }
        Some(path) => Some(Arc::new(transfer::trace::TraceFile::open(path)?)),
        None => None,
    };
    let creds = creds::load(&a.creds)?;
    let subject = creds
        .as_ref()
        .and_then(|c| c.chain.first())
        .and_then(transfer::tls::subject_of);
    let tls = match creds {
        Some(c) if src.is_remote() || dst.is_remote() => Some(ClientTls {
            config: transfer::tls::client_config(&c)?,
        }),
        _ => None,
    };
    let mut opts = options(&a, tls)?;
    opts.trace = trace;
    let recorder = log.map(|log| Recorder::new(log, facts(&a, &src, &dst, &opts, subject)));
    let counters = Arc::new(Counters::default());
    let (etx, erx) = mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            c2.cancel();
        }
    });
    let bar = Progress::start(
        progress::display(&a.progress),
        counters.clone(),
        erx,
        recorder,
    );
    let ctx = client::AttemptContext {
        counters,
        events: etx,
        cancel,
    };
    let mut result = client::copy(&src, &dst, &opts, ctx.clone()).await;
    if let Err(e) = &result
        && e.kind() == ErrorKind::IsMetadataServer
    {
        // haul://META/path: the grid.
        result = grid_copy(&a, &src, &dst, opts, ctx).await;
    }
    let recorder = bar.finish().await;
    if let Some(r) = &recorder {
        r.finish(match &result {
            Ok(report) => Ok(report.into()),
            Err(e) => Err(e.to_info()),
        });
    }
    match result {
        Ok(report) => {
            let code = exit_code(&report);
            // The summary goes to stderr on a terminal and off it (for logs); stdout is for
            // --json and --explain.
            if a.json {
                print_json(&report, code);
            } else {
                eprintln!("{}", summary_line(&report));
            }
            if a.explain && !a.json {
                explain(&report);
            }
            if let Some(first) = &report.first_failure {
                // Each failure was printed as it happened; one line sums them up.
                eprintln!(
                    "haul: error: {} of {} files failed; first: {}",
                    report.files_failed, report.files, first.message
                );
            }
            Ok(code)
        }
        // `main` prints it, with `--json` as {"kind", "exit_code", "message"}.
        Err(e) => Err(e),
    }
}

/// What the transfer log records of this copy: who, between where, how.
fn facts(
    a: &CpArgs,
    src: &Location,
    dst: &Location,
    opts: &CopyOptions,
    subject: Option<String>,
) -> SessionFacts {
    let role = match (src, dst) {
        (Location::Local(_), _) => Role::Send,
        (_, Location::Local(_)) => Role::Receive,
        _ => Role::ThirdParty,
    };
    let mut f = SessionFacts::new(translog::new_guid(), role, &opts.session);
    f.user = transfer::sys::user_name(transfer::sys::effective_uid());
    f.subject = subject;
    // The endpoint data goes to (or comes from); for a third-party copy, the destination.
    let remote = match (src, dst) {
        (_, Location::Remote { host, port, .. }) | (Location::Remote { host, port, .. }, _) => {
            transfer::conn::format_addr(host, *port)
        }
        _ => String::new(),
    };
    f.peer = remote;
    f.source = Some(a.src.clone());
    f.destination = Some(a.dst.clone());
    f.range = opts.range;
    if role == Role::Send {
        f.zero_copy = Some(opts.zero_copy && opts.session.protect == Protect::Clear);
    }
    f
}

async fn grid_copy(
    a: &CpArgs,
    src: &Location,
    dst: &Location,
    opts: CopyOptions,
    ctx: client::AttemptContext,
) -> Result<CopyReport, TransferError> {
    if opts.range.is_some() {
        return Err(TransferError::usage(
            "--offset/--length are for standalone endpoints, not the grid",
        ));
    }
    // --trace (an upload: this side sends) traces each session to the grid's nodes; the
    // transfer history keeps its throughput over time (grid::copy).
    let Some(tls) = opts.tls.as_ref().map(|t| t.config.clone()) else {
        return Err(TransferError::usage(
            "the grid needs certificates, not --insecure",
        ));
    };
    let peer = match (src, dst) {
        (Location::Remote { host, port, .. }, _) | (_, Location::Remote { host, port, .. }) => {
            client::Peer::new(host.clone(), *port)
        }
        _ => unreachable!("a remote side exists"),
    };
    let meta = match grid::MetaClient::connect(&peer, tls.clone()).await {
        Ok(m) => m,
        Err(e) => {
            // The source is a standalone endpoint and the destination the grid: the copy is
            // the grid's (third party, the endpoint pushing to the nodes).
            match (src, dst) {
                (Location::Remote { .. }, Location::Remote { host, port, .. }) => {
                    match grid::MetaClient::connect(&client::Peer::new(host.clone(), *port), tls)
                        .await
                    {
                        Ok(m) => m,
                        Err(_) => return Err(e),
                    }
                }
                _ => return Err(e),
            }
        }
    };
    let gopts = grid::copy::GridOptions {
        copy: opts,
        site: a.site.clone(),
        overwrite: true,
        max_sessions: a.node_sessions.max(1),
        dest_is_name: false,
        source_crcs: None,
    };
    grid::copy::copy(&meta, src, dst, &gopts, ctx).await
}

fn exit_code(r: &CopyReport) -> u8 {
    match &r.first_failure {
        None => 0,
        Some(e) => {
            let code = TransferError::from(e.clone()).exit_code();
            if code == 1 { 1 } else { code as u8 }
        }
    }
}

fn print_json(r: &CopyReport, code: u8) {
    let mut v = serde_json::to_value(r).unwrap_or_default();
    if let Some(obj) = v.as_object_mut() {
        obj.insert("exit_code".into(), code.into());
    }
    crate::jsondoc::print(v);
}

/// `--explain`: the bottleneck report in words, on stdout.
fn explain(r: &CopyReport) {
    let Some(v) = &r.bottleneck else {
        out!("limited by: unknown (grid copies are not diagnosed yet)");
        return;
    };
    out!("limited by: {}", v.reason);
    let s = &v.shares;
    out!(
        "time: data in flight {:.0}% of the streams' time; of that, held by the receiver's window {:.0}%, by the send buffer {:.0}%, by the network {:.0}%; {:.2}% of segments sent again",
        s.busy * 100.0,
        s.rwnd_limited * 100.0,
        s.sndbuf_limited * 100.0,
        s.network * 100.0,
        v.retransmitted * 100.0
    );
    out!(
        "storage: source readers busy {:.0}%, destination writers busy {:.0}%",
        s.source_read * 100.0,
        s.destination_write.min(1.0) * 100.0
    );
    for a in &v.advice {
        out!("to fix: {a}");
    }
}

fn summary_line(r: &CopyReport) -> String {
    let skipped = if r.bytes_skipped > 0 {
        format!(
            ", {} already there",
            wire::units::format_bytes(r.bytes_skipped)
        )
    } else {
        String::new()
    };
    format!(
        "{} in {}, {:.1} s, {} ({}, {}{}{})",
        wire::units::format_bytes(r.bytes_total),
        wire::units::count(r.files, "file", "files"),
        r.seconds,
        wire::units::format_rate(r.mbit_per_s * 1e6),
        wire::units::count(r.streams as u64, "stream", "streams"),
        if r.congestion.is_empty() {
            "default cc".to_string()
        } else {
            r.congestion.clone()
        },
        skipped,
        if r.retries > 0 {
            format!(", {} retries", r.retries)
        } else {
            String::new()
        },
    )
}
