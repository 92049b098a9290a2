//! Child processes: killed when dropped, started servers that print their address first,
//! and commands that run to their end or to a time limit, whichever comes first.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A child process, killed (and reaped) when dropped; its stderr goes to `log`.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdout discarded and stderr to `log`.
    pub fn spawn(mut cmd: Command, log: &Path) -> std::io::Result<Proc> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(log)?)
            .spawn()?;
        Ok(Proc {
            child,
            log: log.to_path_buf(),
        })
    }

    /// A child started elsewhere (its log, if any, at `log`).
    pub fn adopt(child: Child, log: &Path) -> Proc {
        Proc {
            child,
            log: log.to_path_buf(),
        }
    }

    /// Starts a server (`cmd` with `--print-addr` or the like) with stderr to `log`, and waits
    /// up to `limit` for the first line it prints on stdout, which it returns trimmed. Stdout
    /// keeps being drained, so that later prints never fail. An error (with the log's text)
    /// when it printed nothing in time.
    pub fn start(mut cmd: Command, log: &Path, limit: Duration) -> Result<(Proc, String), String> {
        let what = format!("{cmd:?}");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(log).map_err(|e| format!("{}: {e}", log.display()))?)
            .spawn()
            .map_err(|e| format!("cannot start {what}: {e}"))?;
        let mut p = Proc::adopt(child, log);
        let stdout = p.child.stdout.take().expect("stdout is piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            let _ = tx.send(line);
            let _ = std::io::copy(&mut r, &mut std::io::sink());
        });
        let line = rx.recv_timeout(limit).unwrap_or_default();
        if line.trim().is_empty() {
            p.kill();
            return Err(format!("{what} did not start:\n{}", p.log_text()));
        }
        Ok((p, line.trim().to_string()))
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How a bounded command ended.
pub struct Outcome {
    /// `None` when it was killed at the time limit.
    pub status: Option<ExitStatus>,
    pub secs: f64,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Outcome {
    pub fn timed_out(&self) -> bool {
        self.status.is_none()
    }

    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }

    /// It ended by itself with exit code 0.
    pub fn ok(&self) -> bool {
        self.code() == Some(0)
    }

    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// Why it did not succeed, in one line: the time limit, or the exit code and the last lines
    /// of stderr.
    pub fn why(&self) -> String {
        let err = self.stderr_text();
        let tail: Vec<&str> = err.lines().rev().take(6).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        if self.timed_out() {
            format!("killed at the time limit after {:.0} s", self.secs)
        } else {
            format!("exit {:?}: {}", self.code(), tail.join(" | "))
        }
    }

    /// As a `std::process::Output` (for a command that ended by itself).
    pub fn into_output(self) -> Output {
        Output {
            status: self.status.expect("the command ended by itself"),
            stdout: self.stdout,
            stderr: self.stderr,
        }
    }
}

/// Runs `cmd` to its end or to `limit`, whichever comes first (then kills it), and returns
/// what it printed. An error only when it cannot be started.
pub fn run_bounded(mut cmd: Command, limit: Duration) -> std::io::Result<Outcome> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let err = drain(Box::new(child.stderr.take().expect("piped")));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if start.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Outcome {
        status,
        secs: start.elapsed().as_secs_f64(),
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_ends_by_itself_or_is_killed_at_the_limit() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 3"]);
        let o = run_bounded(c, Duration::from_secs(30)).unwrap();
        assert_eq!((o.code(), o.stdout_text().as_str()), (Some(3), "out\n"));
        assert!(o.why().contains("exit Some(3): err"), "{}", o.why());
        let mut c = Command::new("sleep");
        c.arg("30");
        let o = run_bounded(c, Duration::from_millis(100)).unwrap();
        assert!(o.timed_out() && !o.ok());
        assert!(o.secs < 29.0);
    }

    #[test]
    fn a_server_that_prints_nothing_is_reported_with_its_log() {
        let dir = std::env::temp_dir().join(format!("harness-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = Command::new("sh");
        c.args(["-c", "echo starting >&2; exit 1"]);
        let e = match Proc::start(c, &dir.join("s.log"), Duration::from_secs(30)) {
            Ok(_) => panic!("it printed nothing"),
            Err(e) => e,
        };
        assert!(e.contains("did not start") && e.contains("starting"), "{e}");
        let mut c = Command::new("sh");
        c.args(["-c", "echo 127.0.0.1:1; sleep 30"]);
        let (mut p, line) = Proc::start(c, &dir.join("s.log"), Duration::from_secs(30)).unwrap();
        assert_eq!(line, "127.0.0.1:1");
        p.kill();
        assert!(p.child.try_wait().unwrap().is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
