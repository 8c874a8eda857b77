//! The paths the kernel's inode numbers stand for, in one mount: the kernel names entries by
//! inode number and the host by path, so each number the mount hands out is kept with its path
//! and a count of the kernel's lookups, and follows renames.

use std::collections::HashMap;

/// The paths the kernel's inode numbers stand for.
pub(super) struct Inodes {
    by_ino: HashMap<u64, (String, u64)>,
    by_path: HashMap<String, u64>,
    next: u64,
}

impl Inodes {
    pub(super) fn new() -> Inodes {
        let mut by_ino = HashMap::new();
        by_ino.insert(1, (String::new(), 1));
        let mut by_path = HashMap::new();
        by_path.insert(String::new(), 1);
        Inodes {
            by_ino,
            by_path,
            next: 2,
        }
    }

    pub(super) fn path(&self, ino: u64) -> Option<String> {
        self.by_ino.get(&ino).map(|(p, _)| p.clone())
    }

    /// The inode number of `path`, one more lookup of it counted.
    pub(super) fn remember(&mut self, path: &str) -> u64 {
        if let Some(&ino) = self.by_path.get(path) {
            if let Some(e) = self.by_ino.get_mut(&ino) {
                e.1 += 1;
            }
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        self.by_ino.insert(ino, (path.to_owned(), 1));
        self.by_path.insert(path.to_owned(), ino);
        ino
    }

    pub(super) fn forget(&mut self, ino: u64, n: u64) {
        if ino == 1 {
            return;
        }
        let gone = match self.by_ino.get_mut(&ino) {
            Some(e) => {
                e.1 = e.1.saturating_sub(n);
                e.1 == 0
            }
            None => false,
        };
        if gone {
            if let Some((p, _)) = self.by_ino.remove(&ino) {
                if self.by_path.get(&p) == Some(&ino) {
                    self.by_path.remove(&p);
                }
            }
        }
    }

    /// `path` is gone: its inode stays (open files, the kernel's count) but names nothing.
    pub(super) fn removed(&mut self, path: &str) {
        self.by_path.remove(path);
    }

    /// `from` (and everything under it) is at `to` now.
    pub(super) fn renamed(&mut self, from: &str, to: &str) {
        self.removed(to);
        let prefix = format!("{from}/");
        let moved: Vec<(u64, String)> = self
            .by_ino
            .iter()
            .filter(|(_, (p, _))| p == from || p.starts_with(&prefix))
            .map(|(&i, (p, _))| (i, format!("{to}{}", &p[from.len()..])))
            .collect();
        for (ino, new) in moved {
            if let Some(e) = self.by_ino.get_mut(&ino) {
                let old = std::mem::replace(&mut e.0, new.clone());
                if self.by_path.get(&old) == Some(&ino) {
                    self.by_path.remove(&old);
                }
                self.by_path.insert(new, ino);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inodes_follow_renames_and_forgets() {
        let mut t = Inodes::new();
        let d = t.remember("d");
        let f = t.remember("d/f");
        assert_eq!(t.remember("d"), d);
        t.renamed("d", "e");
        assert_eq!(t.path(f).as_deref(), Some("e/f"));
        assert_eq!(t.path(d).as_deref(), Some("e"));
        assert_eq!(t.remember("e/f"), f);
        t.forget(f, 2);
        assert!(t.path(f).is_none());
        t.removed("e");
        assert_ne!(
            t.remember("e"),
            d,
            "a new entry at a removed path is a new inode"
        );
        t.forget(1, 100);
        assert_eq!(t.path(1).as_deref(), Some(""));
    }
}
