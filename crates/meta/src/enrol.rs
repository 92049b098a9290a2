//! Enrolment of storage nodes: which host certificates may join the grid as nodes. A host
//! certificate from the CA is not enough (any host of the federation, the metadata server's own
//! certificate included, would receive users' files): an administrator lists each node in a
//! file given with `haul meta serve --nodes FILE`, one per line:
//!
//! ```text
//! # name        certificate (as `haul cert issue --host` prints it)
//! node1.example.org sha256:5f1c...e0
//! node2.example.org                  # any certificate for this name, the first one sticks
//! ```
//!
//! A line with a fingerprint admits exactly that certificate (several lines for one name admit
//! several, e.g. while a certificate is replaced). A line without admits the first certificate
//! that registers under the name; the catalog then keeps the node's key for that certificate
//! only, and another certificate for the name needs a line with its fingerprint. The file is
//! re-read when it changes. Without `--nodes` no node may join (the refusal says which line
//! to add).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;
use transfer::certid::{Fingerprint, is_host_name};

/// How a node is enrolled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enrolled {
    /// By name: the certificate the node first registered with is the one.
    Name,
    /// This very certificate is listed (it may replace the one registered before).
    Certificate,
}

/// The nodes of an enrolment file: name -> fingerprints (`None` for a line without one).
type Entries = HashMap<String, Vec<Option<Fingerprint>>>;

/// Parses an enrolment file's text.
pub fn parse(text: &str) -> Result<Entries, String> {
    let mut out: Entries = HashMap::new();
    for (no, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let name = words.next().unwrap_or_default();
        if !is_host_name(name) {
            return Err(format!(
                "line {}: {name:?} is not a node name (a DNS name or IP address, the CN of its host certificate)",
                no + 1
            ));
        }
        let fp = match words.next() {
            None => None,
            Some(f) => Some(Fingerprint::parse(f).map_err(|e| format!("line {}: {e}", no + 1))?),
        };
        if let Some(extra) = words.next() {
            return Err(format!(
                "line {}: unexpected {extra:?}; expected NAME [sha256:FINGERPRINT]",
                no + 1
            ));
        }
        out.entry(name.to_string()).or_default().push(fp);
    }
    Ok(out)
}

struct Loaded {
    /// (modification time, length, inode) of the file as last read.
    stamp: Option<(SystemTime, u64, u64)>,
    entries: Entries,
}

/// The enrolment list of a metadata server.
pub struct Enrolment {
    path: Option<PathBuf>,
    loaded: Mutex<Loaded>,
}

impl Default for Enrolment {
    fn default() -> Self {
        Self::none()
    }
}

fn stamp(path: &Path) -> std::io::Result<(SystemTime, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.modified()?, m.len(), m.ino()))
}

impl Enrolment {
    /// No file: every node is refused.
    pub fn none() -> Self {
        Self {
            path: None,
            loaded: Mutex::new(Loaded {
                stamp: None,
                entries: HashMap::new(),
            }),
        }
    }

    /// Reads `path` (it must exist and parse).
    pub fn load(path: &Path) -> Result<Self, String> {
        let e = Self {
            path: Some(path.to_path_buf()),
            loaded: Mutex::new(Loaded {
                stamp: None,
                entries: HashMap::new(),
            }),
        };
        let st = stamp(path)
            .map_err(|err| format!("cannot read the node list {}: {err}", path.display()))?;
        let text = std::fs::read_to_string(path)
            .map_err(|err| format!("cannot read the node list {}: {err}", path.display()))?;
        let entries = parse(&text).map_err(|err| format!("{}: {err}", path.display()))?;
        *e.loaded.lock().expect("enrolment lock") = Loaded {
            stamp: Some(st),
            entries,
        };
        Ok(e)
    }

    /// The file, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Re-reads the file if it changed; a file that no longer parses leaves the last good
    /// list in force (and says why in the log).
    fn refresh(&self) {
        let Some(path) = &self.path else { return };
        let Ok(st) = stamp(path) else {
            tracing::warn!(file = %path.display(), "node list unreadable; keeping the last one read");
            return;
        };
        let mut l = self.loaded.lock().expect("enrolment lock");
        if l.stamp == Some(st) {
            return;
        }
        match std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| parse(&t))
        {
            Ok(entries) => {
                tracing::info!(file = %path.display(), nodes = entries.len(), "node list read");
                *l = Loaded {
                    stamp: Some(st),
                    entries,
                };
            }
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "node list does not parse; keeping the last one read");
                l.stamp = Some(st);
            }
        }
    }

    /// Whether node `name` with certificate `fp` may register; the refusal says which line to
    /// add where.
    pub fn check(&self, name: &str, fp: &Fingerprint) -> Result<Enrolled, String> {
        let Some(path) = &self.path else {
            return Err(format!(
                "node {name} is not enrolled: this metadata server enrols no nodes; start it with --nodes FILE, a file with the line `{name} {fp}`"
            ));
        };
        self.refresh();
        let l = self.loaded.lock().expect("enrolment lock");
        let Some(lines) = l.entries.get(name) else {
            return Err(format!(
                "node {name} is not enrolled: add the line `{name} {fp}` to {} on the metadata server",
                path.display()
            ));
        };
        if lines.contains(&Some(*fp)) {
            Ok(Enrolled::Certificate)
        } else if lines.contains(&None) {
            Ok(Enrolled::Name)
        } else {
            Err(format!(
                "node {name}'s certificate {fp} is not the one enrolled: if it replaces the old one, add the line `{name} {fp}` to {} on the metadata server",
                path.display()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_nodes_and_certificates() {
        let a = Fingerprint([1; 32]);
        let b = Fingerprint([2; 32]);
        let e = parse(&format!(
            "# nodes\nn1 {a}   # the first\n\nn2\nn3 {a}\nn3 {b}\n"
        ))
        .unwrap();
        assert_eq!(e["n1"], vec![Some(a)]);
        assert_eq!(e["n2"], vec![None]);
        assert_eq!(e["n3"], vec![Some(a), Some(b)]);
        assert!(parse("n1 sha256:12").unwrap_err().contains("line 1"));
        assert!(parse("n1 x y").is_err());
        assert!(
            parse("eve/OU=hosts")
                .unwrap_err()
                .contains("not a node name")
        );
    }

    #[test]
    fn unlisted_nodes_are_told_which_line_to_add_and_changes_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nodes");
        let (a, b) = (Fingerprint([1; 32]), Fingerprint([2; 32]));
        std::fs::write(&path, format!("n1 {a}\nn2\n")).unwrap();
        let e = Enrolment::load(&path).unwrap();
        assert_eq!(e.check("n1", &a), Ok(Enrolled::Certificate));
        assert_eq!(e.check("n2", &b), Ok(Enrolled::Name));
        let err = e.check("n1", &b).unwrap_err();
        assert!(err.contains(&format!("`n1 {b}`")), "{err}");
        let err = e.check("n9", &b).unwrap_err();
        assert!(err.contains(&format!("add the line `n9 {b}`")), "{err}");
        assert!(err.contains(&path.display().to_string()), "{err}");
        // Re-read when it changes (a longer file: the stamp differs even within one second).
        std::fs::write(&path, format!("n1 {a}\nn2\nn9 {b}\n")).unwrap();
        assert_eq!(e.check("n9", &b), Ok(Enrolled::Certificate));
        // A broken edit keeps the last good list.
        std::fs::write(&path, "n9 sha256:zz and more\n").unwrap();
        assert_eq!(e.check("n9", &b), Ok(Enrolled::Certificate));
        // No file at all: nobody, with the hint.
        let err = Enrolment::none().check("n1", &a).unwrap_err();
        assert!(err.contains("--nodes"), "{err}");
        assert!(Enrolment::load(&dir.path().join("missing")).is_err());
    }
}
