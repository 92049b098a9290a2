//! `haul perf`: runs `transfer::perf` tests against an endpoint and prints them per interval
//! and in total, like iperf3 (or as JSON).

use crate::args::{PerfArgs, PerfDirectionArg};
use crate::creds;
use serde::Serialize;
use std::time::Duration;
use transfer::TransferError;
use transfer::conn;
use transfer::perf::{self, PerfOptions, PerfReport};
use wire::perf::{Direction, PerfInterval, PerfRequest, PerfSpec};
use wire::units::{format_bytes, format_rate};

#[derive(Serialize)]
struct Output<'a> {
    endpoint: String,
    rtt_ms: f64,
    plan: String,
    tests: &'a [PerfReport],
}

pub async fn run(a: PerfArgs) -> Result<u8, TransferError> {
    let (host, port) = creds::endpoint(&a.endpoint)?;
    if a.time.is_zero() || a.interval < Duration::from_millis(10) {
        return Err(TransferError::usage(
            "--time must be above zero and --interval at least 10ms",
        ));
    }
    if a.udp && (a.private || a.congestion.is_some() || a.buffer.is_some() || a.streams.is_some()) {
        return Err(TransferError::usage(
            "--streams, --buffer, --congestion and --private are for TCP tests, not --udp",
        ));
    }
    let tls = creds::client_tls(&a.creds)?;
    if a.private && tls.is_none() {
        return Err(TransferError::usage("--private needs TLS: drop --insecure"));
    }
    let ours = transfer::sys::host_limits();
    let mut session = conn::connect_control(&host, port, tls.as_ref(), &ours).await?;
    let (rtt, _, _) = session.path();
    let rtt = rtt.unwrap_or(session.rtt);
    let directions: &[Direction] = match a.direction {
        PerfDirectionArg::Send => &[Direction::Send],
        PerfDirectionArg::Receive => &[Direction::Receive],
        PerfDirectionArg::Both => &[Direction::Send, Direction::Receive],
    };
    let endpoint = conn::format_addr(&host, port);
    let mut reports = Vec::new();
    let mut plan_words = String::new();
    for &direction in directions {
        let spec = if a.udp {
            PerfSpec::Udp {
                rate_bps: a.rate,
                length: a.length,
            }
        } else {
            // Streams and buffers as a copy of this duration's worth of data would plan them.
            let (sender, receiver) = match direction {
                Direction::Send => (ours.clone(), session.limits.clone()),
                Direction::Receive => (session.limits.clone(), ours.clone()),
            };
            let plan = wire::plan::plan(
                &wire::plan::PathFacts {
                    rtt,
                    sender,
                    receiver,
                    total_bytes: (a.link_rate / 8).saturating_mul(a.time.as_secs().max(1)),
                    files: 1,
                },
                &wire::plan::Choices {
                    streams: a.streams,
                    tcp_buffer: a.buffer,
                    link_bps: a.link_rate,
                    ..Default::default()
                },
            );
            plan_words = plan.explanation.clone();
            PerfSpec::Tcp {
                streams: plan.streams,
                buffer: a.buffer.or(plan.socket_buffer),
                congestion: a.congestion.clone(),
                private: a.private,
            }
        };
        let opts = PerfOptions {
            test: PerfRequest {
                spec,
                direction,
                duration_ms: a.time.as_millis() as u64,
                interval_ms: a.interval.as_millis() as u64,
            },
            stream_tls: if a.private { tls.clone() } else { None },
        };
        if !a.json {
            out!("{}", heading(&endpoint, rtt, &opts.test));
        }
        let json = a.json;
        let report = perf::run(&mut session, &opts, |iv| {
            if !json {
                out!("{}", interval_line(iv, a.udp));
            }
        })
        .await?;
        if !a.json {
            for line in totals(&report) {
                out!("{line}");
            }
        }
        reports.push(report);
    }
    session.writer.shutdown().await;
    if a.json {
        let o = Output {
            endpoint,
            rtt_ms: rtt.as_secs_f64() * 1e3,
            plan: plan_words,
            tests: &reports,
        };
        crate::jsondoc::print_report(&o);
    }
    Ok(0)
}

fn heading(endpoint: &str, rtt: Duration, t: &PerfRequest) -> String {
    let way = match t.direction {
        Direction::Send => "this host sends to the endpoint",
        Direction::Receive => "the endpoint sends to this host",
    };
    let what = match &t.spec {
        PerfSpec::Tcp {
            streams,
            buffer,
            congestion,
            private,
        } => format!(
            "TCP, {streams} stream{}, {}{}{}",
            if *streams == 1 { "" } else { "s" },
            buffer
                .map(|b| format!("{} buffers", format_bytes(b)))
                .unwrap_or_else(|| "autotuned buffers".into()),
            congestion
                .as_ref()
                .map(|c| format!(", {c}"))
                .unwrap_or_default(),
            if *private { ", TLS" } else { "" }
        ),
        PerfSpec::Udp { rate_bps, length } => {
            format!(
                "UDP at {}, {length}-byte datagrams",
                format_rate(*rate_bps as f64)
            )
        }
    };
    format!(
        "haul perf {endpoint} ({:.1} ms round trip): {what}; {way} for {:.1} s",
        rtt.as_secs_f64() * 1e3,
        t.duration_ms as f64 / 1e3
    )
}

fn interval_line(iv: &PerfInterval, udp: bool) -> String {
    let secs = (iv.end_ms.saturating_sub(iv.start_ms)) as f64 / 1e3;
    let rate = if secs > 0.0 {
        iv.bytes() as f64 * 8.0 / secs
    } else {
        0.0
    };
    let when = format!(
        "{:6.2}-{:6.2} s",
        iv.start_ms as f64 / 1e3,
        iv.end_ms as f64 / 1e3
    );
    if udp {
        let u = iv.udp.clone().unwrap_or_default();
        let expected = u.packets + u.lost;
        return format!(
            "  {when}  {:>10}  {:>13}  lost {}/{} ({:.2}%)  jitter {:.3} ms  out of order {}",
            format_bytes(iv.bytes()),
            format_rate(rate),
            u.lost,
            expected,
            if expected > 0 {
                u.lost as f64 * 100.0 / expected as f64
            } else {
                0.0
            },
            u.jitter_ns as f64 / 1e6,
            u.out_of_order
        );
    }
    let n = iv.streams.len().max(1) as f64;
    let rtt_ms = iv.streams.iter().map(|s| s.rtt_us as f64).sum::<f64>() / n / 1e3;
    let cwnd: u64 = iv.streams.iter().map(|s| s.cwnd_bytes).sum();
    format!(
        "  {when}  {:>10}  {:>13}  retr {:>5}  rtt {:7.2} ms  cwnd {:>10}",
        format_bytes(iv.bytes()),
        format_rate(rate),
        iv.retransmits(),
        rtt_ms,
        format_bytes(cwnd)
    )
}

fn totals(r: &PerfReport) -> Vec<String> {
    let side = |name: &str, s: &perf::SideTotals| {
        format!(
            "  {name:<8} {:6.2} s  {:>10}  {:>13}",
            s.seconds,
            format_bytes(s.bytes),
            format_rate(s.bits_per_second)
        )
    };
    let mut sender = side("sender", &r.sender);
    let mut receiver = side("receiver", &r.receiver);
    if r.protocol == "tcp" {
        sender.push_str(&format!(
            "  {} retransmits{}",
            r.sender.retransmits,
            if r.congestion.is_empty() {
                String::new()
            } else {
                format!(" ({})", r.congestion)
            }
        ));
    }
    if let Some(u) = &r.udp {
        receiver.push_str(&format!(
            "  lost {}/{} ({:.3}%)  jitter {:.3} ms  out of order {}  duplicates {}",
            u.lost, u.sent, u.loss_percent, u.jitter_ms, u.out_of_order, u.duplicates
        ));
    }
    vec![sender, receiver]
}
