use super::*;
use crate::checksum::{Algorithm, digest_bytes};
use crate::data::Timestamp;

fn begin(file: FileId, size: u64, resume: bool) -> FileBegin {
    FileBegin {
        file,
        attempt: 0,
        kind: EntryKind::File,
        path: format!("f{file}"),
        size,
        mode: 0o644,
        mtime: Timestamp::default(),
        resume,
    }
}

fn hdr(file: FileId, offset: u64) -> BlockHeader {
    BlockHeader {
        file,
        offset,
        crc: 0,
    }
}

fn drain(sink: &mut Sink<Vec<u8>>) -> Vec<SinkAction> {
    std::iter::from_fn(|| sink.poll_action()).collect()
}

fn write_all(sink: &mut Sink<Vec<u8>>, v: BlockVerdict<Vec<u8>>, now: Instant) {
    match v {
        BlockVerdict::Write {
            file,
            attempt,
            new_ranges,
            ..
        } => sink.on_written(file, attempt, &new_ranges, Ok(()), now),
        BlockVerdict::Drop => panic!("expected a write"),
    }
}

#[test]
fn happy_path_commits_and_acks() {
    let now = Instant::now();
    let mut sink = Sink::new(SinkConfig::default());
    sink.add_stream(0);
    sink.on_begin(0, begin(1, 2000, false), now).unwrap();
    assert!(matches!(
        drain(&mut sink)[..],
        [SinkAction::Open { file: 1, .. }]
    ));
    assert!(sink.on_opened(1, 0, Ok(RangeSet::new()), now).is_empty());
    for off in [1000, 0] {
        let v = sink.on_block(0, hdr(1, off), 1000, true, vec![0; 1000], now);
        write_all(&mut sink, v, now);
    }
    let digests = digest_bytes(&[Algorithm::Crc32c], &[0; 2000]);
    sink.on_end(
        0,
        FileEnd {
            file: 1,
            attempt: 0,
            digests: digests.clone(),
        },
    )
    .unwrap();
    // Everything written, digest not yet reported: the driver is asked to catch up.
    assert!(matches!(
        drain(&mut sink)[..],
        [SinkAction::DigestCatchUp { file: 1, .. }]
    ));
    sink.on_digest_complete(1, 0, digests.clone());
    assert!(matches!(
        drain(&mut sink)[..],
        [SinkAction::Commit { file: 1, .. }]
    ));
    sink.on_committed(1, 0, Ok(()));
    let acts = drain(&mut sink);
    assert!(matches!(
        &acts[0],
        SinkAction::Send {
            stream: 0,
            frame: DataFrame::FileAck(FileAck { result: Ok(_), .. })
        }
    ));
    assert!(matches!(
        &acts[1],
        SinkAction::Event(SinkEvent::FileDone { size: 2000, .. })
    ));
    assert_eq!(sink.open_files(), 0);
    assert_eq!(sink.stats().bytes_written, 2000);
}

#[test]
fn early_blocks_are_stashed_and_replayed() {
    let now = Instant::now();
    let mut sink = Sink::new(SinkConfig::default());
    sink.add_stream(0);
    sink.add_stream(1);
    assert!(matches!(
        sink.on_block(1, hdr(4, 0), 10, true, vec![1; 10], now),
        BlockVerdict::Drop
    ));
    sink.on_begin(0, begin(4, 20, false), now).unwrap();
    // Still opening: also stashed.
    assert!(matches!(
        sink.on_block(1, hdr(4, 10), 10, true, vec![1; 10], now),
        BlockVerdict::Drop
    ));
    let writes = sink.on_opened(4, 0, Ok(RangeSet::new()), now);
    assert_eq!(writes.len(), 2);
    for w in writes {
        write_all(&mut sink, w, now);
    }
    assert_eq!(sink.written(4).unwrap().pairs(), &[(0, 20)]);
}

#[test]
fn full_stash_refuses_with_a_resend_request() {
    let now = Instant::now();
    let mut sink = Sink::new(SinkConfig {
        stash_budget: 15,
        ..Default::default()
    });
    sink.add_stream(2);
    sink.on_block(2, hdr(9, 0), 10, true, vec![0; 10], now);
    sink.on_block(2, hdr(9, 10), 10, true, vec![0; 10], now);
    let acts = drain(&mut sink);
    assert!(
        matches!(
            &acts[..],
            [SinkAction::Send {
                stream: 2,
                frame: DataFrame::Nack(Nack {
                    file: 9,
                    offset: 10,
                    len: 10,
                    ..
                })
            }]
        ),
        "{acts:?}"
    );
    assert_eq!(sink.stats().stash_refusals, 1);
}

#[test]
fn bad_crc_asks_for_the_block_again_and_duplicates_are_dropped() {
    let now = Instant::now();
    let mut sink = Sink::new(SinkConfig::default());
    sink.add_stream(0);
    sink.on_begin(0, begin(1, 100, false), now).unwrap();
    sink.on_opened(1, 0, Ok(RangeSet::new()), now);
    drain(&mut sink);
    assert!(matches!(
        sink.on_block(0, hdr(1, 0), 100, false, vec![], now),
        BlockVerdict::Drop
    ));
    assert!(matches!(
        &drain(&mut sink)[..],
        [SinkAction::Send {
            frame: DataFrame::Nack(_),
            ..
        }]
    ));
    assert_eq!(sink.stats().crc_failures, 1);
    let v = sink.on_block(0, hdr(1, 0), 100, true, vec![], now);
    write_all(&mut sink, v, now);
    assert!(matches!(
        sink.on_block(0, hdr(1, 0), 100, true, vec![], now),
        BlockVerdict::Drop
    ));
    assert_eq!(sink.stats().duplicates, 1);
}

#[test]
fn checksum_mismatch_fails_retryably_and_discards() {
    let now = Instant::now();
    let mut sink = Sink::new(SinkConfig::default());
    sink.add_stream(0);
    sink.on_begin(0, begin(1, 3, false), now).unwrap();
    sink.on_opened(1, 0, Ok(RangeSet::new()), now);
    let v = sink.on_block(0, hdr(1, 0), 3, true, vec![], now);
    write_all(&mut sink, v, now);
    sink.on_digest_complete(1, 0, digest_bytes(&[Algorithm::Md5], b"abc"));
    sink.on_end(
        0,
        FileEnd {
            file: 1,
            attempt: 0,
            digests: digest_bytes(&[Algorithm::Md5], b"abd"),
        },
    )
    .unwrap();
    let acts = drain(&mut sink);
    let ack = acts.iter().find_map(|a| match a {
        SinkAction::Send {
            frame: DataFrame::FileAck(a),
            ..
        } => Some(a.clone()),
        _ => None,
    });
    let err = ack.unwrap().result.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Integrity);
    assert!(err.retryable);
    assert!(acts.contains(&SinkAction::Discard {
        file: 1,
        attempt: 0,
        keep_partial: false
    }));
}

#[test]
fn resume_answers_have_and_expects_only_the_rest() {
    let now = Instant::now();
    let mut sink = Sink::new(SinkConfig::default());
    sink.add_stream(0);
    sink.on_begin(0, begin(1, 100, true), now).unwrap();
    drain(&mut sink);
    let have = RangeSet::from_pairs(&[(0, 60), (90, 120)]).unwrap();
    sink.on_opened(1, 0, Ok(have), now);
    let acts = drain(&mut sink);
    assert!(
        matches!(&acts[..], [SinkAction::Send { frame: DataFrame::Have(Have { ranges, .. }), .. }] if ranges == &vec![(0, 60), (90, 100)])
    );
    let v = sink.on_block(0, hdr(1, 60), 30, true, vec![], now);
    write_all(&mut sink, v, now);
    sink.on_end(
        0,
        FileEnd {
            file: 1,
            attempt: 0,
            digests: vec![],
        },
    )
    .unwrap();
    assert!(matches!(
        drain(&mut sink)[..],
        [SinkAction::DigestCatchUp { .. }]
    ));
    assert_eq!(sink.stats().bytes_resumed, 70);
}

#[test]
fn block_beyond_end_fails_the_file() {
    let now = Instant::now();
    let mut sink = Sink::new(SinkConfig::default());
    sink.add_stream(0);
    sink.on_begin(0, begin(1, 100, false), now).unwrap();
    sink.on_opened(1, 0, Ok(RangeSet::new()), now);
    drain(&mut sink);
    assert!(matches!(
        sink.on_block(0, hdr(1, 90), 20, true, vec![], now),
        BlockVerdict::Drop
    ));
    let acts = drain(&mut sink);
    assert!(acts.iter().any(|a| matches!(a, SinkAction::Event(SinkEvent::FileFailed { error, .. }) if error.kind == ErrorKind::Protocol)));
    assert!(matches!(
        sink.on_block(0, hdr(1, u64::MAX), 20, true, vec![], now),
        BlockVerdict::Drop
    ));
}

#[test]
fn new_attempt_discards_the_old_partial_copy() {
    let now = Instant::now();
    let mut sink = Sink::new(SinkConfig::default());
    sink.add_stream(0);
    sink.on_begin(0, begin(1, 100, false), now).unwrap();
    drain(&mut sink);
    let mut b = begin(1, 100, false);
    b.attempt = 1;
    sink.on_begin(0, b.clone(), now).unwrap();
    let acts = drain(&mut sink);
    assert_eq!(
        acts[0],
        SinkAction::Discard {
            file: 1,
            attempt: 0,
            keep_partial: false
        }
    );
    assert!(matches!(&acts[1], SinkAction::Open { attempt: 1, .. }));
    // The same begin again (sent again after a lost stream) is ignored...
    sink.on_begin(0, b.clone(), now).unwrap();
    assert!(drain(&mut sink).is_empty());
    // ...but different metadata under the same id and attempt is a violation.
    b.size = 5;
    assert!(sink.on_begin(0, b, now).is_err());
}

#[test]
fn checkpoints_follow_written_bytes() {
    let now = Instant::now();
    let mut sink = Sink::new(SinkConfig {
        checkpoint_bytes: 150,
        ..Default::default()
    });
    sink.add_stream(0);
    sink.on_begin(0, begin(1, 1000, false), now).unwrap();
    sink.on_opened(1, 0, Ok(RangeSet::new()), now);
    drain(&mut sink);
    for off in [0, 100] {
        let v = sink.on_block(0, hdr(1, off), 100, true, vec![], now);
        write_all(&mut sink, v, now);
    }
    let acts = drain(&mut sink);
    assert!(
        matches!(&acts[..], [SinkAction::Checkpoint { ranges, .. }] if ranges.pairs() == [(0, 200)])
    );
    // No second checkpoint while one is in flight.
    let v = sink.on_block(0, hdr(1, 200), 200, true, vec![], now);
    write_all(&mut sink, v, now);
    assert!(drain(&mut sink).is_empty());
    sink.on_checkpointed(1, 0);
    let v = sink.on_block(0, hdr(1, 400), 10, true, vec![], now);
    write_all(&mut sink, v, now);
    assert!(matches!(
        &drain(&mut sink)[..],
        [SinkAction::Checkpoint { .. }]
    ));
}

#[test]
fn replies_move_off_a_closed_stream() {
    let now = Instant::now();
    let mut sink = Sink::new(SinkConfig::default());
    sink.add_stream(0);
    sink.add_stream(1);
    sink.on_begin(0, begin(1, 0, false), now).unwrap();
    drain(&mut sink);
    sink.on_opened(1, 0, Ok(RangeSet::new()), now);
    sink.on_stream_closed(0);
    sink.on_end(
        1,
        FileEnd {
            file: 1,
            attempt: 0,
            digests: digest_bytes(&[], b""),
        },
    )
    .unwrap();
    let acts = drain(&mut sink);
    assert!(matches!(acts[..], [SinkAction::DigestCatchUp { .. }]));
    sink.on_digest_complete(1, 0, digest_bytes(&[], b""));
    drain(&mut sink);
    sink.on_committed(1, 0, Ok(()));
    assert!(matches!(
        &drain(&mut sink)[0],
        SinkAction::Send { stream: 1, .. }
    ));
}

#[test]
fn end_before_begin_is_kept_until_the_begin_arrives() {
    let now = Instant::now();
    let mut sink: Sink<Vec<u8>> = Sink::new(SinkConfig::default());
    sink.add_stream(0);
    sink.add_stream(1);
    let digests = digest_bytes(&[], b"");
    sink.on_end(
        1,
        FileEnd {
            file: 7,
            attempt: 0,
            digests: digests.clone(),
        },
    )
    .unwrap();
    assert!(drain(&mut sink).is_empty());
    sink.on_begin(0, begin(7, 0, false), now).unwrap();
    drain(&mut sink);
    sink.on_opened(7, 0, Ok(RangeSet::new()), now);
    assert!(matches!(
        drain(&mut sink)[..],
        [SinkAction::DigestCatchUp { .. }]
    ));
    // A flood of frames for files never announced is refused.
    for i in 0..4 {
        sink.on_end(
            1,
            FileEnd {
                file: 99,
                attempt: i,
                digests: vec![],
            },
        )
        .unwrap();
    }
    assert!(
        sink.on_end(
            1,
            FileEnd {
                file: 99,
                attempt: 9,
                digests: vec![]
            }
        )
        .is_err()
    );
}

#[test]
fn already_complete_files_are_reported_as_skipped() {
    let now = Instant::now();
    let mut sink: Sink<Vec<u8>> = Sink::new(SinkConfig::default());
    sink.add_stream(0);
    sink.on_begin(0, begin(3, 50, true), now).unwrap();
    drain(&mut sink);
    sink.on_already_complete(3, 0);
    let acts = drain(&mut sink);
    assert!(matches!(
        &acts[0],
        SinkAction::Send {
            frame: DataFrame::Have(Have { complete: true, .. }),
            ..
        }
    ));
    assert!(matches!(
        &acts[1],
        SinkAction::Event(SinkEvent::FileDone { skipped: true, .. })
    ));
    assert_eq!(sink.open_files(), 0);
}

/// A file wanted by another transfer is given up with its partial data kept (the driver
/// writes its ledger), unless it is already being committed.
#[test]
fn a_file_given_up_keeps_its_partial_data_unless_committing() {
    let now = Instant::now();
    let mut sink = Sink::new(SinkConfig::default());
    sink.add_stream(0);
    sink.on_begin(0, begin(1, 2000, false), now).unwrap();
    sink.on_begin(0, begin(2, 1000, false), now).unwrap();
    drain(&mut sink);
    sink.on_opened(1, 0, Ok(RangeSet::new()), now);
    sink.on_opened(2, 0, Ok(RangeSet::new()), now);
    let v = sink.on_block(0, hdr(1, 0), 1000, true, vec![0; 1000], now);
    write_all(&mut sink, v, now);
    drain(&mut sink);
    let taken = ErrorInfo::new(ErrorKind::Io, "taken over");
    // A stale attempt number changes nothing.
    sink.give_up(1, 7, taken.clone());
    assert!(drain(&mut sink).is_empty());
    sink.give_up(1, 0, taken.clone());
    let acts = drain(&mut sink);
    assert!(acts.iter().any(|a| matches!(
        a,
        SinkAction::Discard {
            file: 1,
            keep_partial: true,
            ..
        }
    )));
    assert!(
        acts.iter()
            .any(|a| matches!(a, SinkAction::Event(SinkEvent::FileFailed { file: 1, .. })))
    );
    // File 2 is complete and committing: it is not given up.
    let v = sink.on_block(0, hdr(2, 0), 1000, true, vec![0; 1000], now);
    write_all(&mut sink, v, now);
    let digests = digest_bytes(&[Algorithm::Crc32c], &[0; 1000]);
    sink.on_end(
        0,
        FileEnd {
            file: 2,
            attempt: 0,
            digests: digests.clone(),
        },
    )
    .unwrap();
    sink.on_digest_complete(2, 0, digests);
    assert!(
        drain(&mut sink)
            .iter()
            .any(|a| matches!(a, SinkAction::Commit { file: 2, .. }))
    );
    sink.give_up(2, 0, taken);
    assert!(drain(&mut sink).is_empty());
}
