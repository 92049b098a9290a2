use super::summary::{Percentiles, parse_throughput_points, series, summarize, throughput_points};
use super::*;

fn sample(t_ms: u64, stream: u32, acked: u64, retrans: u32, busy_ms: u64, rwnd_ms: u64) -> Line {
    Line::Stream(StreamSample {
        t_us: t_ms * 1000,
        stream,
        bytes_acked: acked,
        bytes_sent: acked,
        retrans_segs: retrans,
        cwnd_bytes: 1_000_000 + stream as u64,
        rtt_us: 100_000,
        busy_us: busy_ms * 1000,
        rwnd_limited_us: rwnd_ms * 1000,
        ..Default::default()
    })
}

fn header() -> Line {
    Line::Header(Header {
        format: "haul-trace".into(),
        version: 1,
        interval_us: 10_000,
        start: "2026-11-26T00:00:00.000000Z".into(),
    })
}

fn session() -> Line {
    Line::Session(SessionBegin {
        t_us: 0,
        guid: "g".into(),
        peer: "p".into(),
        streams: 2,
    })
}

/// Two streams, 10 ms apart: stream 0 at 1.25 MB per 10 ms (1 Gbit/s), stream 1 at half;
/// the tracer spent 1 ms of CPU.
fn two_streams() -> Vec<Line> {
    let mut v = vec![header(), session()];
    for i in 0..=10u64 {
        v.push(sample(i * 10, 0, i * 1_250_000, i as u32, i * 10, i * 5));
        v.push(sample(i * 10, 1, i * 625_000, 0, i * 10, 0));
    }
    v.push(Line::End(EndSample {
        t_us: 100_000,
        ticks: 11,
        sampling_cpu_us: 1000,
    }));
    v
}

#[test]
fn rates_per_stream_and_in_total_come_from_differences_between_samples() {
    let s = series(&two_streams());
    assert_eq!(s.streams.len(), 2);
    let s0 = &s.streams[&(1, 0)];
    assert_eq!(s0.t_s.len(), 10, "one point per sample after the first");
    assert!(
        s0.rate_bps.iter().all(|r| (r - 1e9).abs() < 1.0),
        "{:?}",
        s0.rate_bps
    );
    assert!(
        s.streams[&(1, 1)]
            .rate_bps
            .iter()
            .all(|r| (r - 5e8).abs() < 1.0)
    );
    assert_eq!(s.total_bps.len(), 10);
    assert!(s.total_bps.iter().all(|r| (r - 1.5e9).abs() < 1.0));
    assert!(s0.retrans.iter().all(|r| *r == 1.0));
    assert_eq!(s0.rtt_ms[0], 100.0);
}

#[test]
fn a_summary_has_percentiles_and_where_the_time_went() {
    let sum = summarize(&two_streams());
    assert_eq!(sum.streams, 2);
    assert_eq!(sum.sessions, 1);
    assert_eq!(sum.samples, 22);
    assert!((sum.seconds - 0.1).abs() < 1e-9);
    assert_eq!(sum.bytes_acked, 12_500_000 + 6_250_000);
    assert_eq!(sum.retrans_segs, 10);
    let t = sum.total_mbps.unwrap();
    assert!((t.p50 - 1500.0).abs() < 0.01 && (t.max - 1500.0).abs() < 0.01);
    let st = sum.stream_mbps.unwrap();
    assert!((st.p5 - 500.0).abs() < 0.01 && (st.max - 1000.0).abs() < 0.01);
    // Busy all the time; stream 0 rwnd-limited half of it: a quarter of all busy time.
    assert!((sum.busy_share - 1.0).abs() < 1e-9);
    assert!((sum.rwnd_limited_share - 0.25).abs() < 1e-9);
    assert_eq!(sum.sndbuf_limited_share, 0.0);
    assert_eq!(sum.sampling_cpu_ms, Some(1.0));
    assert!((sum.sampling_share.unwrap() - 0.01).abs() < 1e-9);
    let text = sum.to_string();
    assert!(
        text.contains("tracing itself: 1.0 ms of CPU, 1.00%"),
        "{text}"
    );
    assert!(
        text.contains("total Mbit/s") && text.contains("receiver's window 25%"),
        "{text}"
    );
}

#[test]
fn a_retry_starts_new_streams_and_counters_that_go_back_are_not_rates() {
    let mut v = two_streams();
    v.push(session());
    // The retry's stream 0 is a new socket: its counters start again.
    v.push(sample(200, 0, 0, 0, 0, 0));
    v.push(sample(210, 0, 1_250_000, 0, 10, 0));
    let s = series(&v);
    assert_eq!(s.streams.len(), 3);
    assert_eq!(s.streams[&(2, 0)].rate_bps.len(), 1);
    assert!(s.total_bps.iter().all(|r| *r >= 0.0));
    assert_eq!(summarize(&v).sessions, 2);
}

#[test]
fn percentiles_by_nearest_rank() {
    let v: Vec<f64> = (1..=100).map(f64::from).collect();
    let p = Percentiles::of(&v).unwrap();
    assert_eq!((p.p5, p.p50, p.p95, p.max), (5.0, 50.0, 95.0, 100.0));
    assert_eq!(Percentiles::of(&[]), None);
    let one = Percentiles::of(&[7.0]).unwrap();
    assert_eq!((one.p5, one.max), (7.0, 7.0));
}

#[test]
fn traces_are_written_and_read_back_and_bad_ones_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    {
        let t = TraceFile::open(&path).unwrap();
        for l in &two_streams()[1..] {
            t.write(l);
        }
    }
    let lines = read(&path).unwrap();
    assert_eq!(lines.len(), two_streams().len());
    assert_eq!(lines[2], two_streams()[2]);
    // A last line cut short (a crash) is dropped; garbage elsewhere is an error naming it.
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("{\"kind\":\"stream\",\"t_us\":12");
    std::fs::write(&path, &text).unwrap();
    assert_eq!(read(&path).unwrap().len(), two_streams().len());
    std::fs::write(&path, "{\"kind\":\"stream\"}\nnot json\n").unwrap();
    let e = read(&path).unwrap_err();
    assert!(e.message().contains(":1:"), "{}", e.message());
    std::fs::write(&path, "").unwrap();
    assert!(read(&path).unwrap_err().message().contains("no header"));
    assert_eq!(read(&dir.path().join("none")).unwrap_err().exit_code(), 3);
    // Opening refuses a planted link like the transfer log does.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    assert_eq!(TraceFile::open(&link).err().unwrap().exit_code(), 6);
}

#[test]
fn a_sample_reads_the_kernels_fields_in_their_units() {
    let info = crate::sys::TcpInfo {
        snd_cwnd: 10,
        snd_mss: 1448,
        rtt: 2500,
        flags: 1,
        bytes_acked: 99,
        busy_time: 7,
        ..Default::default()
    };
    let s = StreamSample::of(5, 3, &info);
    assert_eq!(s.cwnd_bytes, 14_480);
    assert_eq!(s.rtt_us, 2500);
    assert!(s.app_limited);
    assert_eq!((s.bytes_acked, s.busy_us, s.stream, s.t_us), (99, 7, 3, 5));
}

#[test]
fn the_history_keeps_a_bounded_throughput_series() {
    // Ten ticks at 1.5 Gbit/s: all of them fit in 600 points; in 4, means of 2 or 3.
    let all = throughput_points(&two_streams(), 600);
    let points = parse_throughput_points(&all).expect("reads back");
    assert_eq!(points.len(), 10, "{all}");
    assert_eq!(points[0], (0.01, 1.5e9));
    assert!(points.windows(2).all(|w| w[0].0 < w[1].0), "{all}");
    let few = throughput_points(&two_streams(), 4);
    assert_eq!(few.split(' ').count(), 4, "{few}");
    assert!(few.split(' ').all(|p| p.ends_with(":1500000000")), "{few}");
    assert_eq!(throughput_points(&[header()], 600), "");
}

#[test]
fn a_copy_reads_back_only_its_own_part_of_a_trace_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.trace");
    let earlier = two_streams()
        .iter()
        .map(|l| serde_json::to_string(l).unwrap() + "\n")
        .collect::<String>();
    std::fs::write(&path, &earlier).unwrap();
    let offset = earlier.len() as u64;
    let mut more = serde_json::to_string(&session()).unwrap() + "\n";
    more += &(serde_json::to_string(&sample(5, 0, 7, 0, 5, 0)).unwrap() + "\n");
    more += "not json\n";
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(more.as_bytes())
        .unwrap();
    let lines = read_since(&path, offset);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(read_since(&dir.path().join("missing"), 0).is_empty());
}
