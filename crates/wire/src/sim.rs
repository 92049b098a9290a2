//! A simulated pair of endpoints: a [`Source`] and a [`Sink`] joined by K streams with their
//! own latency and rate, in virtual time. Whole transfers run in milliseconds, with streams
//! that stall, blocks corrupted on the way, and sessions cut off and resumed from the sink's
//! restart ledger.

use crate::checksum::{Algorithm, InOrderDigest, block_crc, digest_bytes};
use crate::data::{BlockHeader, DataFrame, EntryKind, Timestamp};
use crate::ranges::RangeSet;
use crate::sink::{BlockVerdict, Sink, SinkAction, SinkConfig, SinkEvent};
use crate::source::{FileSpec, Source, SourceConfig, SourceEvent, Transmit};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

enum Msg {
    Frame(DataFrame),
    Block(BlockHeader, Vec<u8>),
}

/// One direction of one stream: FIFO, serialization at `rate`, then `latency`.
struct Pipe {
    rate: f64,
    latency: Duration,
    busy_until: Instant,
    in_flight: VecDeque<(Instant, Msg)>,
    /// From this time on, nothing is delivered (a hung connection).
    stall_at: Option<Instant>,
    alive: bool,
}

impl Pipe {
    fn new(t0: Instant, rate: f64, latency_ms: u64) -> Self {
        Self {
            rate,
            latency: Duration::from_millis(latency_ms),
            busy_until: t0,
            in_flight: VecDeque::new(),
            stall_at: None,
            alive: true,
        }
    }
    fn send(&mut self, now: Instant, size: usize, msg: Msg) {
        let start = self.busy_until.max(now);
        self.busy_until = start + Duration::from_secs_f64(size as f64 / self.rate);
        self.in_flight
            .push_back((self.busy_until + self.latency, msg));
    }
    fn can_send(&self, now: Instant) -> bool {
        self.alive && self.busy_until <= now
    }
    fn deliverable(&mut self, now: Instant) -> Option<Msg> {
        if !self.alive || self.stall_at.is_some_and(|s| now >= s) {
            return None;
        }
        if self.in_flight.front().is_some_and(|(t, _)| *t <= now) {
            return self.in_flight.pop_front().map(|(_, m)| m);
        }
        None
    }
    fn next_time(&self) -> Option<Instant> {
        if !self.alive {
            return None;
        }
        let arrival = self.in_flight.front().map(|(t, _)| *t);
        match (arrival, self.stall_at) {
            (Some(t), Some(s)) if t >= s => None,
            (a, _) => a,
        }
    }
}

/// The sink side's per-file resources, as a driver keeps them.
struct SinkFileData {
    data: Vec<u8>,
    digest: InOrderDigest<Vec<u8>>,
}

struct Scenario {
    streams: usize,
    rates: Vec<f64>,
    latency_ms: u64,
    stall: Option<(usize, Duration)>,
    /// Corrupt every n-th block sent on this stream.
    corrupt: Option<(usize, u64)>,
    /// Cut the session off after this much virtual time.
    cut_at: Option<Duration>,
    resume: bool,
    algos: Vec<Algorithm>,
    block: u32,
    /// `SourceConfig::shared_path`.
    shared_path: bool,
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            streams: 4,
            rates: vec![100e6],
            latency_ms: 50,
            stall: None,
            corrupt: None,
            cut_at: None,
            resume: false,
            algos: vec![Algorithm::Crc32c],
            block: 64 << 10,
            shared_path: false,
        }
    }
}

struct Outcome {
    /// Destination files that were committed, by path.
    committed: HashMap<String, Vec<u8>>,
    /// Restart ledger per path (ranges the sink checkpointed) and the partial data.
    partials: HashMap<String, (RangeSet, Vec<u8>)>,
    bytes_sent: u64,
    streams_lost: u32,
    blocks_resent: u64,
    blocks_hedged: u64,
    finished: bool,
    elapsed: Duration,
    failed: Vec<String>,
}

fn file_bytes(seed: u64, size: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Runs one session over simulated streams. `partials` are restart ledgers left by an earlier
/// session (used when `resume`).
fn run(
    sc: &Scenario,
    files: &[(String, Vec<u8>)],
    partials: HashMap<String, (RangeSet, Vec<u8>)>,
) -> Outcome {
    let t0 = Instant::now();
    let mut now = t0;
    let mut src: Source<Vec<u8>> = Source::new(SourceConfig {
        resume: sc.resume,
        stream_timeout: Duration::from_secs(2),
        block_size: sc.block,
        shared_path: sc.shared_path,
        ..Default::default()
    });
    let mut sink: Sink<Vec<u8>> = Sink::new(SinkConfig {
        checkpoint_bytes: 256 << 10,
        checkpoint_interval: Duration::from_millis(100),
        ..Default::default()
    });
    let rate = |i: usize| sc.rates[i % sc.rates.len()];
    let mut fwd: Vec<Pipe> = (0..sc.streams)
        .map(|i| Pipe::new(t0, rate(i), sc.latency_ms))
        .collect();
    let mut rev: Vec<Pipe> = (0..sc.streams)
        .map(|_| Pipe::new(t0, 1e9, sc.latency_ms))
        .collect();
    if let Some((s, at)) = sc.stall {
        fwd[s].stall_at = Some(t0 + at);
        rev[s].stall_at = Some(t0 + at);
    }
    for s in 0..sc.streams {
        src.add_stream(s as u32, now);
        sink.add_stream(s as u32);
    }
    for (path, data) in files {
        src.add_file(FileSpec {
            kind: EntryKind::File,
            path: path.clone(),
            size: data.len() as u64,
            mode: 0o644,
            mtime: Timestamp::default(),
        });
    }
    src.finish_adding();

    let mut sent_blocks = vec![0u64; sc.streams];
    let mut acked = vec![0u64; sc.streams];
    let mut sink_files: HashMap<(u64, u32), SinkFileData> = HashMap::new();
    let mut ledgers: HashMap<String, (RangeSet, Vec<u8>)> = partials;
    let mut committed = HashMap::new();
    let mut failed = Vec::new();
    let limit = t0 + Duration::from_secs(600);
    let cut = sc.cut_at.map(|c| t0 + c);

    while !src.is_finished() && now < limit && cut.is_none_or(|c| now < c) {
        // Readers: claim files and read them whole (bounded read-ahead).
        while src.queued() < 64 {
            let Some(job) = src.claim() else { break };
            let data = &files[job.file as usize].1;
            for seg in &job.segments {
                if !seg.send {
                    continue;
                }
                let mut off = seg.offset;
                while off < seg.offset + seg.len {
                    let len = (sc.block as u64).min(seg.offset + seg.len - off);
                    let chunk = data[off as usize..(off + len) as usize].to_vec();
                    src.push_block(
                        job.file,
                        job.attempt,
                        off,
                        len as u32,
                        block_crc(&chunk),
                        chunk,
                    );
                    off += len;
                }
            }
            src.read_done(job.file, job.attempt, digest_bytes(&sc.algos, data));
        }
        while let Some(d) = src.poll_reread() {
            let data = &files[d.file as usize].1;
            let chunk = data[d.offset as usize..(d.offset + d.len as u64) as usize].to_vec();
            src.push_resend(d, block_crc(&chunk), chunk);
        }
        // Streams take frames while their pipe is free.
        for s in 0..sc.streams {
            while fwd[s].can_send(now) {
                let Some(tx) = src.poll_transmit(s as u32, now) else {
                    break;
                };
                match tx {
                    Transmit::Frame(f) => fwd[s].send(now, 64, Msg::Frame(f)),
                    Transmit::Block {
                        header,
                        len,
                        mut payload,
                    } => {
                        sent_blocks[s] += 1;
                        if let Some((cs, every)) = sc.corrupt
                            && cs == s
                            && sent_blocks[s].is_multiple_of(every)
                        {
                            payload[0] ^= 0xff;
                        }
                        fwd[s].send(now, len as usize + 25, Msg::Block(header, payload));
                    }
                }
            }
        }
        // Deliver to the sink.
        for s in 0..sc.streams {
            let mut processed = false;
            while let Some(msg) = fwd[s].deliverable(now) {
                processed = true;
                acked[s] += 1;
                match msg {
                    Msg::Frame(f) => sink.on_frame(s as u32, f, now).unwrap(),
                    Msg::Block(h, payload) => {
                        let ok = block_crc(&payload) == h.crc;
                        let v = sink.on_block(s as u32, h, payload.len() as u32, ok, payload, now);
                        sink_write(&mut sink, &mut sink_files, v, now);
                    }
                }
                // Actions may open files and replay stashed blocks.
                sink_actions(
                    &mut sink,
                    &mut sink_files,
                    &mut ledgers,
                    &mut committed,
                    &mut failed,
                    &mut rev,
                    &sc.algos,
                    now,
                );
            }
            if processed {
                rev[s].send(now, 16, Msg::Frame(DataFrame::Ack(acked[s])));
            }
        }
        sink_actions(
            &mut sink,
            &mut sink_files,
            &mut ledgers,
            &mut committed,
            &mut failed,
            &mut rev,
            &sc.algos,
            now,
        );
        // Deliver to the source.
        for (s, pipe) in rev.iter_mut().enumerate() {
            while let Some(Msg::Frame(f)) = pipe.deliverable(now) {
                src.on_frame(s as u32, f, now).unwrap();
            }
        }
        src.handle_timeout(now);
        while let Some(ev) = src.poll_event() {
            if let SourceEvent::StreamLost { stream } = ev {
                fwd[stream as usize].alive = false;
                rev[stream as usize].alive = false;
                sink.on_stream_closed(stream);
            }
        }
        // Advance virtual time to the next thing that can happen.
        let mut next: Vec<Instant> = Vec::new();
        next.extend(fwd.iter().chain(rev.iter()).filter_map(|p| p.next_time()));
        next.extend(
            fwd.iter()
                .filter(|p| p.alive && p.busy_until > now)
                .map(|p| p.busy_until),
        );
        next.extend(src.poll_timeout());
        let step = next
            .into_iter()
            .filter(|t| *t > now)
            .min()
            .unwrap_or(now + Duration::from_millis(1));
        now = step.min(now + Duration::from_millis(200));
    }
    let committed_paths: Vec<String> = committed.keys().cloned().collect();
    // Whatever is not committed is left as a partial copy with its ledger.
    let mut partials = HashMap::new();
    for (path, (ranges, data)) in ledgers {
        if !committed.contains_key(&path) {
            partials.insert(path, (ranges, data));
        }
    }
    Outcome {
        committed,
        partials,
        bytes_sent: src.stats().bytes_sent,
        streams_lost: src.stats().streams_lost,
        blocks_resent: src.stats().blocks_resent,
        blocks_hedged: src.stats().blocks_hedged,
        finished: src.is_finished(),
        elapsed: now - t0,
        // A failed attempt that a later attempt repaired is not a failure.
        failed: failed
            .into_iter()
            .filter(|p| !committed_paths.contains(p))
            .collect(),
    }
}

fn sink_write(
    sink: &mut Sink<Vec<u8>>,
    files: &mut HashMap<(u64, u32), SinkFileData>,
    v: BlockVerdict<Vec<u8>>,
    now: Instant,
) {
    if let BlockVerdict::Write {
        file,
        attempt,
        offset,
        payload,
        new_ranges,
    } = v
    {
        let f = files
            .get_mut(&(file, attempt))
            .expect("opened before writing");
        f.data[offset as usize..offset as usize + payload.len()].copy_from_slice(&payload);
        for r in new_ranges.iter() {
            let slice = payload[(r.start - offset) as usize..(r.end - offset) as usize].to_vec();
            f.digest.offer(
                r.start,
                r.end - r.start,
                Some(block_crc(&slice)),
                Some(slice),
            );
        }
        sink.on_written(file, attempt, &new_ranges, Ok(()), now);
        catch_up(sink, files, file, attempt);
    }
}

fn catch_up(
    sink: &mut Sink<Vec<u8>>,
    files: &mut HashMap<(u64, u32), SinkFileData>,
    file: u64,
    attempt: u32,
) {
    let f = files.get_mut(&(file, attempt)).expect("open");
    while let Some((o, l)) = f.digest.poll_need(1 << 20) {
        let bytes = f.data[o as usize..(o + l) as usize].to_vec();
        f.digest.offer_read_back(o, bytes);
    }
    if f.digest.is_complete() {
        let d = std::mem::replace(&mut f.digest, InOrderDigest::new(&[], 0, 0));
        if let Some(digests) = d.finish() {
            sink.on_digest_complete(file, attempt, digests);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn sink_actions(
    sink: &mut Sink<Vec<u8>>,
    files: &mut HashMap<(u64, u32), SinkFileData>,
    ledgers: &mut HashMap<String, (RangeSet, Vec<u8>)>,
    committed: &mut HashMap<String, Vec<u8>>,
    failed: &mut Vec<String>,
    rev: &mut [Pipe],
    algos: &[Algorithm],
    now: Instant,
) {
    while let Some(a) = sink.poll_action() {
        match a {
            SinkAction::Open {
                file,
                attempt,
                begin,
            } => {
                let (have, data) = match ledgers.get(&begin.path) {
                    Some((r, d)) if begin.resume && d.len() as u64 == begin.size => {
                        (r.clone(), d.clone())
                    }
                    _ => (RangeSet::new(), vec![0; begin.size as usize]),
                };
                let mut digest = InOrderDigest::new(algos, begin.size, 1 << 20);
                for r in have.iter() {
                    digest.offer(r.start, r.end - r.start, None, None);
                }
                files.insert((file, attempt), SinkFileData { data, digest });
                ledgers.insert(
                    begin.path.clone(),
                    (have.clone(), files[&(file, attempt)].data.clone()),
                );
                let writes = sink.on_opened(file, attempt, Ok(have), now);
                for w in writes {
                    sink_write(sink, files, w, now);
                }
                catch_up(sink, files, file, attempt);
            }
            SinkAction::MakeDir { file, attempt, .. } => sink.on_committed(file, attempt, Ok(())),
            SinkAction::Send { stream, frame } => {
                rev[stream as usize].send(now, 64, Msg::Frame(frame))
            }
            SinkAction::Checkpoint {
                file,
                attempt,
                ranges,
            } => {
                let f = &files[&(file, attempt)];
                let path = ledgers
                    .iter()
                    .find(|(_, (_, d))| d.len() == f.data.len())
                    .map(|(p, _)| p.clone());
                if let Some(p) = path {
                    ledgers.insert(p, (ranges, f.data.clone()));
                }
                sink.on_checkpointed(file, attempt);
            }
            SinkAction::DigestCatchUp { file, attempt } => catch_up(sink, files, file, attempt),
            SinkAction::Commit {
                file,
                attempt,
                begin,
                ..
            } => {
                let f = files.remove(&(file, attempt)).expect("open");
                committed.insert(begin.path.clone(), f.data);
                sink.on_committed(file, attempt, Ok(()));
            }
            SinkAction::Discard { file, attempt, .. } => {
                files.remove(&(file, attempt));
            }
            SinkAction::Event(SinkEvent::FileFailed { path, .. }) => failed.push(path),
            SinkAction::Event(SinkEvent::FileDone { .. }) => {}
        }
    }
}

fn dataset(n: usize, max: usize, seed: u64) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let size = (file_bytes(seed + i as u64, 4)
                .iter()
                .map(|b| *b as usize)
                .sum::<usize>()
                * 997)
                % max;
            (
                format!("d/f{i:03}"),
                file_bytes(seed * 1000 + i as u64, size),
            )
        })
        .collect()
}

fn assert_identical(out: &Outcome, files: &[(String, Vec<u8>)]) {
    assert!(
        out.finished,
        "session did not finish; failed: {:?}",
        out.failed
    );
    assert!(out.failed.is_empty(), "failed files: {:?}", out.failed);
    assert_eq!(out.committed.len(), files.len());
    for (p, d) in files {
        assert!(out.committed[p] == *d, "{p} differs");
    }
}

#[test]
fn many_files_over_eight_streams_arrive_identical() {
    let files = dataset(60, 300_000, 1);
    let sc = Scenario {
        streams: 8,
        rates: vec![50e6, 120e6, 80e6],
        ..Default::default()
    };
    let out = run(&sc, &files, HashMap::new());
    assert_identical(&out, &files);
    let total: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    assert_eq!(out.bytes_sent, total, "nothing sent twice on a clean path");
}

#[test]
fn stream_three_stalls_and_the_other_seven_finish() {
    let files = dataset(20, 2_000_000, 2);
    let sc = Scenario {
        streams: 8,
        rates: vec![1e6],
        stall: Some((3, Duration::from_millis(300))),
        algos: vec![Algorithm::Crc32c, Algorithm::Md5],
        ..Default::default()
    };
    let out = run(&sc, &files, HashMap::new());
    assert_identical(&out, &files);
    assert_eq!(out.streams_lost, 1);
    // Stream timeout is 2 s of virtual time; the transfer still completes soon after.
    assert!(out.elapsed < Duration::from_secs(30), "{:?}", out.elapsed);
}

#[test]
fn corrupted_blocks_are_detected_and_sent_again() {
    let files = dataset(10, 1_000_000, 3);
    let sc = Scenario {
        corrupt: Some((1, 5)),
        algos: vec![Algorithm::Crc32c, Algorithm::Sha256],
        ..Default::default()
    };
    let out = run(&sc, &files, HashMap::new());
    assert_identical(&out, &files);
    assert!(out.blocks_resent > 0);
}

#[test]
fn cut_off_session_resumes_from_the_ledger_sending_only_what_is_missing() {
    let files = vec![("big.nc".to_string(), file_bytes(9, 8_000_000))];
    let sc = Scenario {
        streams: 4,
        rates: vec![1e6],
        cut_at: Some(Duration::from_millis(400)),
        ..Default::default()
    };
    let first = run(&sc, &files, HashMap::new());
    assert!(!first.finished);
    let (ledger, _) = &first.partials["big.nc"];
    let present = ledger.len_bytes();
    assert!(
        present > 0 && present < 8_000_000,
        "ledger covers {present}"
    );
    let sc2 = Scenario {
        streams: 4,
        rates: vec![1e6],
        resume: true,
        algos: vec![Algorithm::Crc32c, Algorithm::Adler32],
        ..Default::default()
    };
    let second = run(&sc2, &files, first.partials);
    assert_identical(&second, &files);
    assert_eq!(
        second.bytes_sent,
        8_000_000 - present,
        "only the missing bytes are sent"
    );
}

#[test]
fn resume_with_corrupted_partial_data_is_caught_by_the_file_checksum() {
    let data = file_bytes(11, 1_000_000);
    let files = vec![("x".to_string(), data.clone())];
    // A ledger that claims the first half, over data that is wrong there.
    let mut bad = data.clone();
    bad[1000] ^= 1;
    let mut partials = HashMap::new();
    partials.insert("x".to_string(), (RangeSet::from_range(0..500_000), bad));
    let sc = Scenario {
        resume: true,
        ..Default::default()
    };
    let out = run(&sc, &files, partials);
    // First attempt fails verification, the file restarts from scratch and arrives intact.
    assert_identical(&out, &files);
    assert_eq!(out.bytes_sent, 500_000 + 1_000_000);
}

#[test]
fn on_a_shared_path_a_stuck_stream_is_still_hedged() {
    // A 64 KiB block takes 6.5 s on the slow stream: stuck, and taken over even when the
    // session shares its path with others (see `source::tests` for the slow-stream case).
    let files = dataset(8, 1_500_000, 4);
    let stuck = Scenario {
        streams: 4,
        rates: vec![1e6, 1e6, 1e6, 1e4],
        latency_ms: 20,
        shared_path: true,
        ..Default::default()
    };
    let out = run(&stuck, &files, HashMap::new());
    assert_identical(&out, &files);
    assert!(out.blocks_hedged > 0, "the stuck stream is hedged");
}

#[test]
fn a_slow_stream_does_not_set_the_pace_at_the_end() {
    // Three streams at 1 MB/s, one at 10 kB/s: each of its 64 KiB blocks takes 6.5 s.
    let files = dataset(8, 1_500_000, 4);
    let total: usize = files.iter().map(|(_, d)| d.len()).sum();
    let sc = Scenario {
        streams: 4,
        rates: vec![1e6, 1e6, 1e6, 1e4],
        latency_ms: 20,
        ..Default::default()
    };
    let out = run(&sc, &files, HashMap::new());
    assert_identical(&out, &files);
    let ideal = total as f64 / 3e6;
    assert!(
        out.blocks_hedged > 0,
        "the end game sent stuck blocks again"
    );
    assert!(
        out.elapsed.as_secs_f64() < ideal + 1.5,
        "took {:?} for an ideal of {ideal:.1} s",
        out.elapsed
    );
}
