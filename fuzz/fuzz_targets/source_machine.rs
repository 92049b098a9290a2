//! A hostile sink: any sequence of frames coming back on any stream (acks, resend requests,
//! resume ranges, verdicts, aborts), interleaved with transmissions and timeouts, never panics
//! the source state machine.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::time::{Duration, Instant};
use wire::codec::FrameBuffer;
use wire::data::{self, Decoded, EntryKind, Timestamp};
use wire::source::{FileSpec, Source, SourceConfig};

fuzz_target!(|bytes: &[u8]| {
    let t0 = Instant::now();
    let resume = bytes.first().is_some_and(|b| b & 1 == 1);
    let mut src: Source<()> = Source::new(SourceConfig {
        resume,
        stream_timeout: Duration::from_millis(50),
        hedge_after: Duration::from_millis(10),
        ..Default::default()
    });
    for s in 0..3 {
        src.add_stream(s, t0);
    }
    for f in 0..3u64 {
        src.add_file(FileSpec {
            kind: EntryKind::File,
            path: format!("f{f}"),
            size: 3000 * f,
            mode: 0o644,
            mtime: Timestamp::default(),
        });
    }
    src.finish_adding();
    let mut fb = FrameBuffer::new();
    fb.extend(bytes.get(1..).unwrap_or_default());
    let mut i = 0u64;
    while let Ok(Some((header, body))) = fb.next_frame(data::limits) {
        i += 1;
        let now = t0 + Duration::from_millis(i * 7);
        while let Some(job) = src.claim() {
            for seg in job.segments.iter().filter(|s| s.send) {
                let mut off = seg.offset;
                while off < seg.offset + seg.len {
                    let len = (seg.offset + seg.len - off).min(1000);
                    src.push_block(job.file, job.attempt, off, len as u32, 0, ());
                    off += len;
                }
            }
            src.read_done(job.file, job.attempt, Vec::new());
        }
        while let Some(d) = src.poll_reread() {
            src.push_resend(d, 0, ());
        }
        for s in 0..3 {
            for _ in 0..4 {
                if src.poll_transmit(s, now).is_none() {
                    break;
                }
            }
        }
        if let Ok(Decoded::Frame(f)) = data::decode_any(header, &body) {
            let _ = src.on_frame((i % 4) as u32, f, now);
        }
        if i % 11 == 0 {
            src.on_stream_lost((i % 3) as u32);
        }
        src.handle_timeout(now);
        while src.poll_event().is_some() {}
    }
    let _ = (src.is_finished(), src.stats());
});
