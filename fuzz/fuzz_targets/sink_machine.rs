//! A hostile source: any sequence of decoded frames and blocks (with any claimed CRC outcome)
//! fed to the sink state machine, with the driver's answers applied, never panics and keeps its
//! bookkeeping consistent.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::time::{Duration, Instant};
use wire::codec::FrameBuffer;
use wire::data::{self, Decoded};
use wire::ranges::RangeSet;
use wire::sink::{BlockVerdict, Sink, SinkAction, SinkConfig};

fuzz_target!(|bytes: &[u8]| {
    let t0 = Instant::now();
    let mut sink: Sink<Vec<u8>> = Sink::new(SinkConfig { stash_budget: 1 << 16, ..Default::default() });
    for s in 0..4 {
        sink.add_stream(s);
    }
    let mut fb = FrameBuffer::new();
    fb.extend(bytes);
    let mut i = 0u64;
    while let Ok(Some((header, body))) = fb.next_frame(data::limits) {
        i += 1;
        let now = t0 + Duration::from_millis(i);
        let stream = (i % 4) as u32;
        let decoded = match data::decode_any(header, &body) {
            Ok(d) => d,
            Err(_) => continue,
        };
        let mut writes = Vec::new();
        match decoded {
            Decoded::Block(h, payload) => {
                let len = payload.len() as u32;
                writes.push(sink.on_block(stream, h, len, i % 3 != 0, payload, now));
            }
            Decoded::Frame(f) => {
                let _ = sink.on_frame(stream, f, now);
            }
        }
        // Play the driver: open files, finish writes, complete digests, commit.
        while let Some(a) = sink.poll_action() {
            match a {
                SinkAction::Open { file, attempt, .. } => {
                    let have = if i % 5 == 0 { RangeSet::from_range(0..(i * 7)) } else { RangeSet::new() };
                    writes.extend(sink.on_opened(file, attempt, Ok(have), now));
                }
                SinkAction::MakeDir { file, attempt, .. } | SinkAction::Commit { file, attempt, .. } => {
                    sink.on_committed(file, attempt, Ok(()))
                }
                SinkAction::Checkpoint { file, attempt, .. } => sink.on_checkpointed(file, attempt),
                SinkAction::DigestCatchUp { file, attempt } => sink.on_digest_complete(file, attempt, Vec::new()),
                SinkAction::Send { .. } | SinkAction::Discard { .. } | SinkAction::Event(_) => {}
            }
        }
        for w in writes {
            if let BlockVerdict::Write { file, attempt, new_ranges, .. } = w {
                sink.on_written(file, attempt, &new_ranges, Ok(()), now);
            }
        }
    }
    let _ = sink.open_files();
});
