//! The progress bar (bytes, files, rate, ETA) on a terminal, and event lines (failures,
//! retries) on stderr. Nothing is drawn when stderr is not a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use transfer::progress::{Counters, Event};
use transfer::translog::Recorder;

pub struct Progress {
    task: tokio::task::JoinHandle<Option<Recorder>>,
    stop: tokio_util::sync::CancellationToken,
}

/// Whether a bar is drawn for this mode.
pub fn wanted(mode: crate::args::ProgressArg) -> bool {
    match mode {
        crate::args::ProgressArg::Always => true,
        crate::args::ProgressArg::Never => false,
        crate::args::ProgressArg::Auto => std::io::stderr().is_terminal(),
    }
}

impl Progress {
    /// Draws while the copy runs; every event also goes to `recorder` (the transfer log),
    /// which [`Progress::finish`] gives back once the last event reached it.
    pub fn start(
        draw: bool,
        counters: Arc<Counters>,
        mut events: mpsc::UnboundedReceiver<Event>,
        mut recorder: Option<Recorder>,
    ) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let stop2 = stop.clone();
        let task = tokio::spawn(async move {
            let bar = if draw {
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
            let mut last = (0u64, std::time::Instant::now());
            let mut rate = 0.0f64;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
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
                    let now = std::time::Instant::now();
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
                        wire::units::format_rate(rate),
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
