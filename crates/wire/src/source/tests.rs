use super::*;
use crate::checksum::{Algorithm, digest_bytes};
use crate::data::{FileAck, Have};

fn spec(path: &str, size: u64) -> FileSpec {
    FileSpec {
        kind: EntryKind::File,
        path: path.into(),
        size,
        mode: 0o644,
        mtime: Timestamp::default(),
    }
}

fn t0() -> Instant {
    Instant::now()
}

/// Reads a whole job the way a driver would, pushing blocks of `bs` bytes.
fn read_job(src: &mut Source<Vec<u8>>, job: &ReadJob, bs: u64) {
    for seg in &job.segments {
        if !seg.send {
            continue;
        }
        let mut off = seg.offset;
        while off < seg.offset + seg.len {
            let len = bs.min(seg.offset + seg.len - off) as u32;
            src.push_block(job.file, job.attempt, off, len, 0, vec![0; len as usize]);
            off += len as u64;
        }
    }
    src.read_done(
        job.file,
        job.attempt,
        digest_bytes(&[Algorithm::Crc32c], b""),
    );
}

fn frames(src: &mut Source<Vec<u8>>, stream: u32, now: Instant) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(t) = src.poll_transmit(stream, now) {
        out.push(match t {
            Transmit::Frame(DataFrame::Begin(b)) => format!("begin {}", b.file),
            Transmit::Frame(DataFrame::End(e)) => format!("end {}", e.file),
            Transmit::Frame(f) => format!("{f:?}"),
            Transmit::Block { header, len, .. } => {
                format!("block {} {}+{}", header.file, header.offset, len)
            }
        });
    }
    out
}

/// The sink refuses `len` bytes at `offset` of file 0 (first attempt) on `stream`.
fn nack(src: &mut Source<Vec<u8>>, stream: u32, offset: u64, len: u64, now: Instant) {
    let nack = Nack {
        file: 0,
        attempt: 0,
        offset,
        len,
    };
    src.on_frame(stream, DataFrame::Nack(nack), now).unwrap();
}

#[test]
fn begin_precedes_blocks_and_end_follows() {
    let now = t0();
    let mut src = Source::new(SourceConfig::default());
    src.add_stream(0, now);
    let id = src.add_file(spec("a", 2500));
    src.finish_adding();
    let job = src.claim().unwrap();
    assert_eq!(
        job.segments,
        vec![Segment {
            offset: 0,
            len: 2500,
            send: true
        }]
    );
    read_job(&mut src, &job, 1000);
    assert_eq!(
        frames(&mut src, 0, now),
        vec![
            "begin 0",
            "block 0 0+1000",
            "block 0 1000+1000",
            "block 0 2000+500",
            "end 0"
        ]
    );
    assert!(!src.is_finished());
    src.on_frame(0, DataFrame::Ack(5), now).unwrap();
    assert_eq!(src.stats().bytes_acked, 2500);
    src.on_frame(
        0,
        DataFrame::FileAck(FileAck {
            file: id,
            attempt: 0,
            result: Ok(vec![]),
        }),
        now,
    )
    .unwrap();
    assert!(src.is_finished());
    assert!(matches!(
        src.poll_event(),
        Some(SourceEvent::FileDone { file: 0, .. })
    ));
}

#[test]
fn streams_pull_blocks_independently() {
    let now = t0();
    let mut src = Source::new(SourceConfig::default());
    for s in 0..3 {
        src.add_stream(s, now);
    }
    src.add_file(spec("a", 6000));
    let job = src.claim().unwrap();
    read_job(&mut src, &job, 1000);
    // Stream 2 is fast and takes most; stream 0 takes one; stream 1 none.
    let first = src.poll_transmit(0, now).unwrap();
    assert!(matches!(first, Transmit::Frame(DataFrame::Begin(_))));
    let rest = frames(&mut src, 2, now);
    assert_eq!(rest.len(), 7);
    assert!(src.poll_transmit(1, now).is_none());
}

#[test]
fn lost_stream_sends_its_frames_again_elsewhere() {
    let now = t0();
    let mut src = Source::new(SourceConfig::default());
    src.add_stream(0, now);
    src.add_stream(1, now);
    src.add_file(spec("a", 3000));
    let job = src.claim().unwrap();
    read_job(&mut src, &job, 1000);
    // Stream 0 takes the begin and one block; stream 1 the rest.
    assert_eq!(
        frames_n(&mut src, 0, 2, now),
        vec!["begin 0", "block 0 0+1000"]
    );
    assert_eq!(
        frames(&mut src, 1, now),
        vec!["block 0 1000+1000", "block 0 2000+1000", "end 0"]
    );
    src.on_stream_lost(0);
    assert_eq!(src.stats().streams_lost, 1);
    // The begin comes back first; the block must be reread.
    assert_eq!(frames(&mut src, 1, now), vec!["begin 0"]);
    let d = src.poll_reread().unwrap();
    assert_eq!((d.offset, d.len), (0, 1000));
    src.push_resend(d, 0, vec![0; 1000]);
    assert_eq!(frames(&mut src, 1, now), vec!["block 0 0+1000"]);
    assert!(
        src.poll_transmit(0, now).is_none(),
        "a lost stream gets nothing"
    );
}

fn frames_n(src: &mut Source<Vec<u8>>, stream: u32, n: usize, now: Instant) -> Vec<String> {
    let mut all = Vec::new();
    for _ in 0..n {
        let t = src.poll_transmit(stream, now).unwrap();
        all.push(match t {
            Transmit::Frame(DataFrame::Begin(b)) => format!("begin {}", b.file),
            Transmit::Block { header, len, .. } => {
                format!("block {} {}+{}", header.file, header.offset, len)
            }
            other => format!("{other:?}"),
        });
    }
    all
}

/// Readers are woken only for something to do: a file to claim, a block to read again, the
/// end of the session; not for the acknowledgements in between.
#[test]
fn readers_have_work_only_for_files_rereads_and_the_end() {
    let now = t0();
    let mut src = Source::new(SourceConfig::default());
    src.add_stream(0, now);
    src.add_file(spec("a", 2000));
    src.finish_adding();
    assert!(src.has_reader_work(), "a file to claim");
    let job = src.claim().unwrap();
    assert!(!src.has_reader_work(), "claimed: nothing left to read");
    read_job(&mut src, &job, 1000);
    frames(&mut src, 0, now);
    assert!(
        !src.has_reader_work(),
        "blocks in flight are the streams' business"
    );
    nack(&mut src, 0, 1000, 1000, now);
    assert!(src.has_reader_work(), "a block to read again");
    let d = src.poll_reread().unwrap();
    assert!(!src.has_reader_work());
    src.push_resend(d, 0, vec![0; 1000]);
    assert!(!src.is_finished());
}

#[test]
fn nack_rereads_and_resends_in_front() {
    let now = t0();
    let mut src = Source::new(SourceConfig::default());
    src.add_stream(0, now);
    src.add_file(spec("a", 2000));
    src.add_file(spec("b", 10));
    let job = src.claim().unwrap();
    read_job(&mut src, &job, 1000);
    frames(&mut src, 0, now);
    nack(&mut src, 0, 1000, 1000, now);
    let job_b = src.claim().unwrap();
    read_job(&mut src, &job_b, 1000);
    let d = src.poll_reread().unwrap();
    src.push_resend(d, 0, vec![0; 1000]);
    let out = frames(&mut src, 0, now);
    assert_eq!(out[0], "block 0 1000+1000", "{out:?}");
    assert_eq!(src.stats().blocks_resent, 1);
}

#[test]
fn resume_waits_for_have_and_skips_present_ranges() {
    let now = t0();
    let cfg = SourceConfig {
        resume: true,
        ..Default::default()
    };
    let mut src = Source::new(cfg);
    src.add_stream(0, now);
    src.add_file(spec("a", 5000));
    assert!(src.claim().is_none(), "no reading before the sink answers");
    assert_eq!(frames(&mut src, 0, now), vec!["begin 0"]);
    src.on_frame(
        0,
        DataFrame::Have(Have {
            file: 0,
            attempt: 0,
            ranges: vec![(0, 2000), (3000, 4000)],
            complete: false,
        }),
        now,
    )
    .unwrap();
    let job = src.claim().unwrap();
    assert_eq!(
        job.segments,
        vec![
            Segment {
                offset: 0,
                len: 2000,
                send: false
            },
            Segment {
                offset: 2000,
                len: 1000,
                send: true
            },
            Segment {
                offset: 3000,
                len: 1000,
                send: false
            },
            Segment {
                offset: 4000,
                len: 1000,
                send: true
            },
        ]
    );
    assert_eq!(src.stats().bytes_skipped, 3000);
    read_job(&mut src, &job, 1000);
    assert_eq!(
        frames(&mut src, 0, now),
        vec!["block 0 2000+1000", "block 0 4000+1000", "end 0"]
    );
}

#[test]
fn have_beyond_file_end_is_a_violation() {
    let now = t0();
    let mut src: Source<Vec<u8>> = Source::new(SourceConfig {
        resume: true,
        ..Default::default()
    });
    src.add_stream(0, now);
    src.add_file(spec("a", 100));
    let err = src
        .on_frame(
            0,
            DataFrame::Have(Have {
                file: 0,
                attempt: 0,
                ranges: vec![(0, 200)],
                complete: false,
            }),
            now,
        )
        .unwrap_err();
    assert!(err.0.contains("beyond the end"));
}

#[test]
fn failed_verification_restarts_then_gives_up() {
    let now = t0();
    let mut src = Source::new(SourceConfig {
        file_attempts: 2,
        ..Default::default()
    });
    src.add_stream(0, now);
    src.add_file(spec("a", 10));
    src.finish_adding();
    let bad = || ErrorInfo::new(ErrorKind::Integrity, "mismatch");
    let job = src.claim().unwrap();
    read_job(&mut src, &job, 1000);
    frames(&mut src, 0, now);
    src.on_frame(
        0,
        DataFrame::FileAck(FileAck {
            file: 0,
            attempt: 0,
            result: Err(bad()),
        }),
        now,
    )
    .unwrap();
    assert!(matches!(
        src.poll_event(),
        Some(SourceEvent::FileRestarted { attempt: 1, .. })
    ));
    let job = src.claim().unwrap();
    assert_eq!(job.attempt, 1);
    read_job(&mut src, &job, 1000);
    let out = frames(&mut src, 0, now);
    assert_eq!(out, vec!["begin 0", "block 0 0+10", "end 0"]);
    src.on_frame(
        0,
        DataFrame::FileAck(FileAck {
            file: 0,
            attempt: 1,
            result: Err(bad()),
        }),
        now,
    )
    .unwrap();
    assert!(matches!(
        src.poll_event(),
        Some(SourceEvent::FileFailed { .. })
    ));
    assert!(src.is_finished());
    assert_eq!(src.stats().files_failed, 1);
}

#[test]
fn ack_for_unsent_frames_is_a_violation() {
    let now = t0();
    let mut src: Source<Vec<u8>> = Source::new(SourceConfig::default());
    src.add_stream(0, now);
    assert!(src.on_frame(0, DataFrame::Ack(1), now).is_err());
    assert!(src.on_frame(5, DataFrame::Ack(0), now).is_err());
    assert!(
        src.on_frame(
            0,
            DataFrame::Begin(FileBegin {
                file: 0,
                attempt: 0,
                kind: EntryKind::File,
                path: "x".into(),
                size: 0,
                mode: 0,
                mtime: Timestamp::default(),
                resume: false,
            }),
            now
        )
        .is_err()
    );
}

#[test]
fn silent_stream_is_lost_only_while_another_progresses() {
    let now = t0();
    let cfg = SourceConfig {
        stream_timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let mut src = Source::new(cfg);
    src.add_stream(0, now);
    src.add_stream(1, now);
    src.add_file(spec("a", 4000));
    let job = src.claim().unwrap();
    read_job(&mut src, &job, 1000);
    frames_n(&mut src, 0, 2, now);
    frames_n(&mut src, 1, 2, now);
    // Nobody acks: a stall of the whole session, not of a stream. Time alone decides nothing,
    // so the driver gets no timer for it.
    assert_eq!(src.poll_timeout(), None);
    src.handle_timeout(now + Duration::from_secs(30));
    assert_eq!(src.live_streams(), 2);
    // Stream 1 acks at 25 s; stream 0 stays silent and is due at its own timeout.
    src.on_frame(1, DataFrame::Ack(2), now + Duration::from_secs(25))
        .unwrap();
    assert_eq!(src.poll_timeout(), Some(now + Duration::from_secs(10)));
    src.handle_timeout(now + Duration::from_secs(30));
    assert_eq!(src.live_streams(), 1);
    assert_eq!(
        src.poll_event(),
        Some(SourceEvent::StreamLost { stream: 0 })
    );
    // Decided: stream 1 has nothing outstanding, nothing is left to time.
    assert_eq!(src.poll_timeout(), None);
}

/// The driver sleeps until `poll_timeout`: in the end game the timer fires when a stuck
/// stream's frames become due, and is gone once an idle stream has taken them all over (a
/// deadline left in the past would make the driver spin).
#[test]
fn the_end_game_timer_fires_when_frames_are_due_and_ends_when_they_are_taken_over() {
    let t = t0();
    let cfg = SourceConfig {
        hedge_after: Duration::from_millis(100),
        ..Default::default()
    };
    let mut src = Source::new(cfg);
    src.add_stream(0, t);
    src.add_stream(1, t);
    assert_eq!(src.poll_timeout(), None, "nothing sent, nothing to time");
    src.add_file(spec("a", 2000));
    src.finish_adding();
    let a = src.claim().unwrap();
    read_job(&mut src, &a, 1000);
    assert_eq!(frames(&mut src, 0, t).len(), 4);
    let due = t + Duration::from_millis(100);
    assert_eq!(src.poll_timeout(), Some(due));
    // Before the deadline the idle stream has nothing to do; at it, it takes over.
    assert!(frames(&mut src, 1, t).is_empty());
    src.handle_timeout(due);
    let mut resent = frames(&mut src, 1, due);
    while let Some(d) = src.poll_reread() {
        // Frames of stream 0 are still to be taken over: still due.
        assert_eq!(src.poll_timeout(), Some(due));
        src.push_resend(d, 0, vec![0; d.len as usize]);
        resent.extend(frames(&mut src, 1, due));
    }
    assert_eq!(
        resent,
        ["begin 0", "block 0 0+1000", "block 0 1000+1000", "end 0"]
    );
    assert_eq!(src.poll_timeout(), None, "every stuck frame was taken over");
}

#[test]
fn read_failure_aborts_the_file_at_the_sink() {
    let now = t0();
    let mut src: Source<Vec<u8>> = Source::new(SourceConfig::default());
    src.add_stream(0, now);
    src.add_file(spec("a", 10));
    src.finish_adding();
    src.add_file(spec("b", 10));
    // File a fails before its begin was sent: nothing reaches the sink about it.
    let job = src.claim().unwrap();
    src.read_failed(
        job.file,
        job.attempt,
        ErrorInfo::new(ErrorKind::Io, "input/output error"),
    );
    assert!(frames(&mut src, 0, now).is_empty());
    // File b fails after its begin was sent: the sink is told to drop it.
    let job = src.claim().unwrap();
    assert_eq!(frames(&mut src, 0, now), vec!["begin 1"]);
    src.read_failed(
        job.file,
        job.attempt,
        ErrorInfo::new(ErrorKind::Io, "input/output error"),
    );
    let out = frames(&mut src, 0, now);
    assert!(out.len() == 1 && out[0].contains("FileAbort"), "{out:?}");
    assert!(src.is_finished());
    assert_eq!(src.stats().files_failed, 2);
}

#[test]
fn complete_files_are_skipped_on_resume() {
    let now = t0();
    let mut src: Source<Vec<u8>> = Source::new(SourceConfig {
        resume: true,
        ..Default::default()
    });
    src.add_stream(0, now);
    src.add_file(spec("a", 5000));
    src.finish_adding();
    frames(&mut src, 0, now);
    src.on_frame(
        0,
        DataFrame::Have(Have {
            file: 0,
            attempt: 0,
            ranges: vec![],
            complete: true,
        }),
        now,
    )
    .unwrap();
    assert!(src.claim().is_none());
    assert!(src.is_finished());
    assert!(matches!(
        src.poll_event(),
        Some(SourceEvent::FileDone {
            skipped: true,
            size: 5000,
            ..
        })
    ));
    assert_eq!(src.stats().bytes_skipped, 5000);
}

#[test]
fn end_game_hedges_only_when_everything_was_read() {
    let t = t0();
    let cfg = SourceConfig {
        hedge_after: Duration::from_millis(100),
        ..Default::default()
    };
    let mut src = Source::new(cfg);
    src.add_stream(0, t);
    src.add_stream(1, t);
    src.add_file(spec("a", 2000));
    src.add_file(spec("b", 2000));
    src.finish_adding();
    let a = src.claim().unwrap();
    read_job(&mut src, &a, 1000);
    // Stream 0 takes all of a; b is claimed but not read yet.
    assert_eq!(frames(&mut src, 0, t).len(), 4);
    let b = src.claim().unwrap();
    let later = t + Duration::from_secs(5);
    assert_eq!(frames(&mut src, 1, later), vec!["begin 1"]);
    assert!(
        src.poll_reread().is_none(),
        "no duplicates while b is still being read"
    );
    read_job(&mut src, &b, 1000);
    // b's two blocks and end, then (stream 0 being stuck) a's begin again.
    assert_eq!(
        frames(&mut src, 1, later),
        vec!["block 1 0+1000", "block 1 1000+1000", "end 1", "begin 0"]
    );
    // Now everything is read and queued: the idle stream takes over a's oldest block.
    assert!(src.poll_transmit(1, later).is_none());
    let d = src.poll_reread().expect("a stuck block is hedged");
    assert_eq!((d.file, d.offset), (0, 0));
    assert_eq!(src.stats().blocks_hedged, 1);
    // Acked twice (original and copy), counted once.
    src.push_resend(d, 0, vec![0; 1000]);
    assert!(matches!(
        src.poll_transmit(1, later),
        Some(Transmit::Block { .. })
    ));
    // Stream 1 sent: begin 1, two blocks, end 1, begin 0 again, block 0+1000 again.
    src.on_frame(1, DataFrame::Ack(6), later).unwrap();
    assert_eq!(src.stats().bytes_acked, 3000);
    src.on_frame(0, DataFrame::Ack(4), later).unwrap();
    assert_eq!(src.stats().bytes_acked, 4000);
}

#[test]
fn a_slow_stream_is_hedged_only_when_the_path_is_not_shared() {
    for shared_path in [false, true] {
        let t = t0();
        let ms = |n: u64| t + Duration::from_millis(n);
        let mut src = Source::new(SourceConfig {
            hedge_after: Duration::from_millis(100),
            shared_path,
            ..Default::default()
        });
        src.add_stream(0, t);
        src.add_stream(1, t);
        src.add_file(spec("a", 8000));
        src.finish_adding();
        let a = src.claim().unwrap();
        read_job(&mut src, &a, 1000);
        // Stream 0 takes the begin and three blocks, stream 1 the other five and the end.
        for _ in 0..4 {
            assert!(src.poll_transmit(0, t).is_some());
        }
        assert_eq!(frames(&mut src, 1, t).len(), 6);
        // Stream 1 delivers quickly (the session's peak: 15 kB/s) ...
        src.on_frame(1, DataFrame::Ack(2), ms(100)).unwrap();
        src.on_frame(1, DataFrame::Ack(6), ms(300)).unwrap();
        // ... stream 0 slowly but steadily: 1 kB in 0.8 s, two blocks still to go.
        src.on_frame(0, DataFrame::Ack(2), ms(800)).unwrap();
        // Idle, stream 1 looks for work 50 ms after stream 0's last progress: not stuck.
        assert!(src.poll_transmit(1, ms(850)).is_none());
        let hedged = src.poll_reread();
        if shared_path {
            assert!(
                hedged.is_none(),
                "shared path: no copy of a slow stream's block"
            );
            assert_eq!(src.stats().blocks_hedged, 0);
        } else {
            let d = hedged.expect("alone on its path, the slow stream's block is copied");
            assert_eq!((d.file, d.offset), (0, 1000));
        }
    }
}
