//! Progress on stderr while a copy runs: a bar (bytes, files, rate, ETA) on a terminal, or,
//! off a terminal with `--progress always`, a status line every `--progress-interval` for logs
//! (like `rclone --stats-one-line`); and event lines (failures, retries) in every mode.

use crate::args::{ProgressArg, ProgressArgs};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use transfer::progress::{Counters, Event};
use transfer::translog::Recorder;
use wire::units::{count, format_bytes, format_rate};

pub struct Progress {
    task: tokio::task::JoinHandle<Option<Recorder>>,
    stop: tokio_util::sync::CancellationToken,
}

/// What is drawn while a copy runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Display {
    Bar,
    /// One status line per interval.
    Lines(Duration),
    /// Event lines only.
    Quiet,
}

/// What `--progress` asks for, given whether stderr is a terminal.
pub fn display(p: &ProgressArgs) -> Display {
    display_for(p, std::io::stderr().is_terminal())
}

fn display_for(p: &ProgressArgs, terminal: bool) -> Display {
    match (p.mode, terminal) {
        (ProgressArg::Never, _) => Display::Quiet,
        (_, true) => Display::Bar,
        (ProgressArg::Always, false) => Display::Lines(p.progress_interval),
        (ProgressArg::Auto, false) => Display::Quiet,
    }
}

/// Where a copy stands, for one status line.
#[derive(Clone, Copy, Debug, Default)]
pub struct Standing {
    pub elapsed: Duration,
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub files_done: u64,
    pub files_total: u64,
    /// Bits per second over the last interval.
    pub rate_bps: f64,
}

/// `haul: 12 s: 1.2 GiB of 4.0 GiB (30%), 3 of 10 files, 812.0 Mbit/s, ETA 34 s`.
pub fn status_line(s: &Standing) -> String {
    let total = s.bytes_total.max(s.bytes_done);
    let percent = if total > 0 {
        format!(" ({:.0}%)", s.bytes_done as f64 * 100.0 / total as f64)
    } else {
        String::new()
    };
    let left = total - s.bytes_done;
    let known = total > 0 || s.files_total > 0;
    let eta = if left == 0 && known {
        "ETA 0 s".to_string()
    } else if left > 0 && s.rate_bps > 0.0 {
        format!("ETA {:.0} s", left as f64 * 8.0 / s.rate_bps)
    } else {
        "ETA unknown".to_string()
    };
    format!(
        "haul: {:.0} s: {} of {}{percent}, {} of {}, {}, {eta}",
        s.elapsed.as_secs_f64(),
        format_bytes(s.bytes_done),
        format_bytes(total),
        s.files_done,
        count(s.files_total.max(s.files_done), "file", "files"),
        format_rate(s.rate_bps),
    )
}

impl Progress {
    /// Draws while the copy runs; every event also goes to `recorder` (the transfer log),
    /// which [`Progress::finish`] gives back once the last event reached it.
    pub fn start(
        display: Display,
        counters: Arc<Counters>,
        mut events: mpsc::UnboundedReceiver<Event>,
        mut recorder: Option<Recorder>,
    ) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let stop2 = stop.clone();
        let task = tokio::spawn(async move {
            let bar = if display == Display::Bar {
                let b =
                    ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr_with_hz(10));
                b.set_style(
                    ProgressStyle::with_template(
                        "{spinner} {elapsed_precise} [{wide_bar}] {bytes}/{total_bytes} {msg} ETA {eta}",
                    )
                    .expect("valid template")
                    .progress_chars("=> "),
                );
                Some(b)
            } else {
                None
            };
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let started = Instant::now();
            let every = match display {
                Display::Lines(every) => every,
                // Never fires within a copy.
                _ => Duration::from_secs(86400 * 365),
            };
            let mut lines = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            lines.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut line_from = (0u64, started);
            let mut last = (0u64, started);
            let mut rate = 0.0f64;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = lines.tick() => {
                        let done = Counters::get(&counters.bytes_done);
                        let now = Instant::now();
                        let dt = now.duration_since(line_from.1).as_secs_f64();
                        eprintln!("{}", status_line(&Standing {
                            elapsed: now.duration_since(started),
                            bytes_done: done,
                            bytes_total: Counters::get(&counters.total_bytes),
                            files_done: Counters::get(&counters.files_done),
                            files_total: Counters::get(&counters.total_files),
                            rate_bps: done.saturating_sub(line_from.0) as f64 * 8.0 / dt.max(1e-3),
                        }));
                        line_from = (done, now);
                    }
                    Some(ev) = events.recv() => {
                        if let Some(r) = recorder.as_mut() {
                            r.on_event(&ev);
                        }
                        let line = match &ev {
                            Event::FileFailed { path, error } => Some(if error.message.contains(path.as_str()) {
                                format!("haul: {}", error.message)
                            } else {
                                format!("haul: {path}: {}", error.message)
                            }),
                            Event::FileRetry { path, attempt, reason } => Some(format!("haul: {path}: {reason}; sending again (attempt {})", attempt + 1)),
                            Event::Retrying { attempt, delay_ms, reason } => Some(if *delay_ms == 0 {
                                format!("haul: {reason}")
                            } else {
                                format!("haul: {reason}; resuming in {:.1} s (attempt {attempt})", *delay_ms as f64 / 1e3)
                            }),
                            Event::StreamLost { stream } => Some(format!("haul: data stream {stream} lost; its blocks go to the other streams")),
                            Event::Plan { explanation, .. } => { tracing::info!("plan: {explanation}"); None }
                            Event::FileDone { .. } | Event::FileStarted { .. } => None,
                        };
                        if let Some(l) = line {
                            match &bar { Some(b) => b.println(l), None => eprintln!("{l}") }
                        }
                    }
                    _ = stop2.cancelled() => break,
                }
                if let Some(b) = &bar {
                    let done = Counters::get(&counters.bytes_done);
                    b.set_length(Counters::get(&counters.total_bytes).max(done));
                    b.set_position(done);
                    let now = Instant::now();
                    let dt = now.duration_since(last.1).as_secs_f64();
                    if dt >= 0.5 {
                        let inst = done.saturating_sub(last.0) as f64 * 8.0 / dt;
                        rate = if rate == 0.0 {
                            inst
                        } else {
                            0.7 * rate + 0.3 * inst
                        };
                        last = (done, now);
                    }
                    b.set_message(format!(
                        "{} files {}/{}",
                        format_rate(rate),
                        Counters::get(&counters.files_done),
                        Counters::get(&counters.total_files)
                    ));
                }
            }
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            // What the copy reported last still reaches the log.
            if let Some(r) = recorder.as_mut() {
                while let Ok(ev) = events.try_recv() {
                    r.on_event(&ev);
                }
            }
            recorder
        });
        Self { task, stop }
    }

    /// Stops drawing; the transfer log's recorder, with every event seen.
    pub async fn finish(self) -> Option<Recorder> {
        self.stop.cancel();
        self.task.await.ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(mode: ProgressArg) -> ProgressArgs {
        ProgressArgs {
            mode,
            progress_interval: Duration::from_secs(10),
        }
    }

    #[test]
    fn a_bar_on_a_terminal_and_lines_off_it_only_when_asked() {
        let lines = Display::Lines(Duration::from_secs(10));
        assert_eq!(display_for(&args(ProgressArg::Auto), true), Display::Bar);
        assert_eq!(display_for(&args(ProgressArg::Auto), false), Display::Quiet);
        assert_eq!(display_for(&args(ProgressArg::Always), true), Display::Bar);
        assert_eq!(display_for(&args(ProgressArg::Always), false), lines);
        assert_eq!(display_for(&args(ProgressArg::Never), true), Display::Quiet);
        assert_eq!(
            display_for(&args(ProgressArg::Never), false),
            Display::Quiet
        );
    }

    #[test]
    fn status_lines() {
        let s = Standing {
            elapsed: Duration::from_millis(12_400),
            bytes_done: 3 << 30,
            bytes_total: 10 << 30,
            files_done: 3,
            files_total: 10,
            rate_bps: 8e8,
        };
        assert_eq!(
            status_line(&s),
            "haul: 12 s: 3.0 GiB of 10.0 GiB (30%), 3 of 10 files, 800.0 Mbit/s, ETA 75 s"
        );
        let one = Standing {
            bytes_done: 0,
            bytes_total: 0,
            files_done: 0,
            files_total: 1,
            ..s
        };
        assert_eq!(
            status_line(&one),
            "haul: 12 s: 0 B of 0 B, 0 of 1 file, 800.0 Mbit/s, ETA 0 s"
        );
        let stalled = Standing { rate_bps: 0.0, ..s };
        assert!(status_line(&stalled).ends_with("0.0 bit/s, ETA unknown"));
        // Before the source was listed nothing is known.
        assert_eq!(
            status_line(&Standing::default()),
            "haul: 0 s: 0 B of 0 B, 0 of 0 files, 0.0 bit/s, ETA unknown"
        );
        // Totals still growing (a tree being walked) never show more done than in all.
        let ahead = Standing {
            bytes_total: 1 << 30,
            files_total: 1,
            ..s
        };
        assert!(status_line(&ahead).contains("3.0 GiB of 3.0 GiB (100%), 3 of 3 files"));
    }
}
