//! Inode numbers of the mount: the kernel names entries by number, the metadata server by path.
//! This table gives each grid path a number while the kernel holds it (counted lookups, dropped
//! by `forget`), and moves numbers along with a rename, whole subtrees included. Pure: no I/O.

use std::collections::HashMap;

/// The kernel's number of the mount's root.
pub const ROOT: u64 = 1;

struct Node {
    path: String,
    /// Lookups the kernel has not forgotten yet (the root is never forgotten).
    lookups: u64,
}

pub struct Inodes {
    by_ino: HashMap<u64, Node>,
    by_path: HashMap<String, u64>,
    next: u64,
}

impl Inodes {
    /// A table whose root is the grid directory `root` (normalized, no trailing slash
    /// except `/`).
    pub fn new(root: &str) -> Self {
        let mut t = Self {
            by_ino: HashMap::new(),
            by_path: HashMap::new(),
            next: ROOT + 1,
        };
        t.by_ino.insert(
            ROOT,
            Node {
                path: root.to_string(),
                lookups: 1,
            },
        );
        t.by_path.insert(root.to_string(), ROOT);
        t
    }

    /// The grid path of `ino`, while the kernel holds it.
    pub fn path(&self, ino: u64) -> Option<String> {
        self.by_ino.get(&ino).map(|n| n.path.clone())
    }

    /// The number of `path` if it has one, without counting a lookup.
    pub fn ino(&self, path: &str) -> Option<u64> {
        self.by_path.get(path).copied()
    }

    /// The number of `path`, counting one lookup the kernel will `forget` (a new number when
    /// it has none).
    pub fn learn(&mut self, path: &str) -> u64 {
        if let Some(&ino) = self.by_path.get(path) {
            if let Some(n) = self.by_ino.get_mut(&ino) {
                n.lookups += 1;
            }
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        self.by_ino.insert(
            ino,
            Node {
                path: path.to_string(),
                lookups: 1,
            },
        );
        self.by_path.insert(path.to_string(), ino);
        ino
    }

    /// The kernel dropped `n` lookups of `ino`; at none the number is free.
    pub fn forget(&mut self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        let gone = match self.by_ino.get_mut(&ino) {
            Some(node) => {
                node.lookups = node.lookups.saturating_sub(n);
                node.lookups == 0
            }
            None => false,
        };
        if gone
            && let Some(node) = self.by_ino.remove(&ino)
            && self.by_path.get(&node.path) == Some(&ino)
        {
            self.by_path.remove(&node.path);
        }
    }

    /// `path` was removed: its name no longer leads to its number (the kernel may still hold
    /// the number, e.g. an open file, until it forgets it).
    pub fn unlinked(&mut self, path: &str) {
        self.by_path.remove(path);
    }

    /// `from` was renamed `to`: its number and every number below it follow. Whatever `to`
    /// named before is replaced.
    pub fn renamed(&mut self, from: &str, to: &str) {
        self.by_path.remove(to);
        let prefix = format!("{}/", from.trim_end_matches('/'));
        let moved: Vec<(String, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| p.as_str() == from || p.starts_with(&prefix))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        for (old, ino) in moved {
            let new = format!("{to}{}", &old[from.len()..]);
            self.by_path.remove(&old);
            if let Some(n) = self.by_ino.get_mut(&ino) {
                n.path = new.clone();
            }
            self.by_path.insert(new, ino);
        }
    }

    /// Numbers in use (for tests and the log).
    pub fn len(&self) -> usize {
        self.by_ino.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_ino.is_empty()
    }
}

/// `dir`'s child `name` as a grid path.
pub fn child(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_are_counted_and_forgotten() {
        let mut t = Inodes::new("/alice");
        let a = t.learn("/alice/a");
        assert_eq!(t.learn("/alice/a"), a);
        assert_eq!(t.path(a).as_deref(), Some("/alice/a"));
        t.forget(a, 1);
        assert_eq!(t.ino("/alice/a"), Some(a));
        t.forget(a, 1);
        assert_eq!(t.ino("/alice/a"), None);
        assert_eq!(t.path(a), None);
        // The root stays.
        t.forget(ROOT, 100);
        assert_eq!(t.path(ROOT).as_deref(), Some("/alice"));
        // A forgotten path gets a new number: the kernel never sees one reused for another.
        assert_ne!(t.learn("/alice/a"), a);
    }

    #[test]
    fn a_rename_moves_the_subtree_and_replaces_the_target() {
        let mut t = Inodes::new("/");
        let d = t.learn("/d");
        let f = t.learn("/d/sub/f");
        let other = t.learn("/dx");
        let old = t.learn("/e");
        t.renamed("/d", "/e");
        assert_eq!(t.path(d).as_deref(), Some("/e"));
        assert_eq!(t.path(f).as_deref(), Some("/e/sub/f"));
        assert_eq!(t.ino("/e/sub/f"), Some(f));
        // A sibling sharing the prefix is not part of the subtree.
        assert_eq!(t.path(other).as_deref(), Some("/dx"));
        // The replaced target keeps its number for the kernel, not its name.
        assert_eq!(t.ino("/e"), Some(d));
        assert_eq!(t.path(old).as_deref(), Some("/e"));
        t.forget(old, 1);
        assert_eq!(
            t.ino("/e"),
            Some(d),
            "forgetting the replaced one keeps the new"
        );
    }

    #[test]
    fn unlinked_names_lose_their_number() {
        let mut t = Inodes::new("/");
        let a = t.learn("/a");
        t.unlinked("/a");
        assert_eq!(t.ino("/a"), None);
        assert_eq!(t.path(a).as_deref(), Some("/a"));
        assert_ne!(t.learn("/a"), a);
        assert_eq!(child("/", "x"), "/x");
        assert_eq!(child("/a", "x"), "/a/x");
    }
}
