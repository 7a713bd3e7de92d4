//! Fingerprints of installed file trees: a 128-bit digest of every file's path and metadata
//! (size, modification and change times, inode) under some directories, read with `stat`
//! only, never the contents.
//!
//! Inductor keys its caches by hashes of the contents of torch's and triton's installed
//! files (`torch_key`, `triton_key`), which costs ~0.4 s of every fresh process, most of it
//! reading a several-hundred-megabyte library. `dynamo_rs._inductor_keys` remembers those
//! keys between processes under this fingerprint: any file added, removed, replaced or
//! written since changes it (a write always moves the change time, which no user call can
//! set back), so a remembered key is used only for the very files it was computed from.
//!
//! Byte-code caches (`__pycache__`) are left out: Python writes them on import, and the keys
//! never read them.

use std::collections::hash_map::DefaultHasher;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::Path;

/// Directories whose contents are never part of a fingerprint.
const SKIPPED_DIRECTORIES: &[&str] = &["__pycache__"];

/// The digest of the trees under `roots`, in order. A root that does not exist (or a
/// directory that cannot be listed) counts as such, so it is told apart from an empty one.
pub fn fingerprint<P: AsRef<Path>>(roots: &[P]) -> u128 {
    let mut digest = TreeDigest::default();
    for root in roots {
        let root = root.as_ref();
        digest.write_str("root");
        digest.write_bytes(root.as_os_str().as_encoded_bytes());
        digest.directory(root, root);
    }
    digest.finish()
}

/// Two independently keyed SipHash states: 128 bits, so that unrelated trees colliding is
/// out of the question. (`DefaultHasher` may change between Rust releases; a rebuilt
/// extension then gives other fingerprints, which only makes remembered keys miss once.)
struct TreeDigest {
    low: DefaultHasher,
    high: DefaultHasher,
}

impl Default for TreeDigest {
    fn default() -> Self {
        let low = DefaultHasher::new();
        let mut high = DefaultHasher::new();
        "dynamo_rs file tree, high half".hash(&mut high);
        Self { low, high }
    }
}

impl TreeDigest {
    fn write_bytes(&mut self, bytes: &[u8]) {
        bytes.hash(&mut self.low);
        bytes.hash(&mut self.high);
    }

    fn write_str(&mut self, text: &str) {
        self.write_bytes(text.as_bytes());
    }

    fn write_u64(&mut self, value: u64) {
        value.hash(&mut self.low);
        value.hash(&mut self.high);
    }

    fn finish(&self) -> u128 {
        (u128::from(self.high.finish()) << 64) | u128::from(self.low.finish())
    }

    /// Every entry of `dir`, sorted by name (listing order differs between file systems),
    /// with paths relative to `root`.
    fn directory(&mut self, root: &Path, dir: &Path) {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(err) => {
                self.write_str("unlistable");
                self.write_str(&err.kind().to_string());
                return;
            }
        };
        let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
        entries.sort_by_key(fs::DirEntry::file_name);
        for entry in entries {
            let path = entry.path();
            let relative = path.strip_prefix(root).unwrap_or(&path);
            let Ok(kind) = entry.file_type() else {
                self.write_str("unknown");
                self.write_bytes(relative.as_os_str().as_encoded_bytes());
                continue;
            };
            if kind.is_dir() {
                if SKIPPED_DIRECTORIES
                    .iter()
                    .any(|skipped| entry.file_name() == *skipped)
                {
                    continue;
                }
                self.write_str("dir");
                self.write_bytes(relative.as_os_str().as_encoded_bytes());
                self.directory(root, &path);
            } else {
                // A symbolic link counts as what it points to (that is what a reader reads);
                // links to directories are not followed, so a cycle cannot loop.
                self.write_str(if kind.is_symlink() { "link" } else { "file" });
                self.write_bytes(relative.as_os_str().as_encoded_bytes());
                match fs::metadata(&path) {
                    Ok(meta) => self.metadata(&meta),
                    Err(err) => self.write_str(&err.kind().to_string()),
                }
            }
        }
    }

    #[cfg(unix)]
    fn metadata(&mut self, meta: &fs::Metadata) {
        use std::os::unix::fs::MetadataExt;

        self.write_u64(meta.len());
        self.write_u64(meta.ino());
        self.write_u64(meta.dev());
        for (seconds, nanos) in [
            (meta.mtime(), meta.mtime_nsec()),
            (meta.ctime(), meta.ctime_nsec()),
        ] {
            self.write_u64(seconds.cast_unsigned());
            self.write_u64(nanos.cast_unsigned());
        }
    }

    #[cfg(not(unix))]
    fn metadata(&mut self, meta: &fs::Metadata) {
        use std::time::UNIX_EPOCH;

        self.write_u64(meta.len());
        for time in [meta.modified(), meta.created()] {
            let nanos = time
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            self.write_u64((nanos >> 64) as u64);
            self.write_u64(nanos as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fresh directory under the system's temporary directory, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("dynamo_rs_file_tree_{name}_{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(dir.join("pkg/sub")).unwrap();
            fs::write(dir.join("pkg/a.py"), "a = 1\n").unwrap();
            fs::write(dir.join("pkg/sub/b.py"), "b = 2\n").unwrap();
            Self(dir)
        }

        fn path(&self, relative: &str) -> PathBuf {
            self.0.join(relative)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// Writes `contents` (of the file's current size) over `path` once the file system's
    /// clock has moved on from its last write (its timestamps may be as coarse as seconds).
    fn rewrite_after_clock_tick(path: &Path, contents: &str) {
        let before = fs::metadata(path).unwrap().modified().unwrap();
        for _ in 0..300 {
            std::thread::sleep(std::time::Duration::from_millis(10));
            fs::write(path, contents).unwrap();
            if fs::metadata(path).unwrap().modified().unwrap() != before {
                return;
            }
        }
        panic!("the file system's clock did not move in 3 s");
    }

    #[test]
    fn unchanged_tree_gives_the_same_fingerprint() {
        let tree = Scratch::new("same");
        let roots = [tree.path("pkg")];
        assert_eq!(fingerprint(&roots), fingerprint(&roots));
    }

    #[test]
    fn every_kind_of_change_gives_another_fingerprint() {
        let tree = Scratch::new("changes");
        let roots = [tree.path("pkg")];
        let mut seen = vec![fingerprint(&roots)];
        let changed = |what: &str, seen: &mut Vec<u128>| {
            let now = fingerprint(&roots);
            assert!(!seen.contains(&now), "{what} went unnoticed");
            seen.push(now);
        };
        rewrite_after_clock_tick(&tree.path("pkg/sub/b.py"), "b = 3\n");
        changed("a file rewritten with contents of the same size", &mut seen);
        fs::write(tree.path("pkg/sub/c.py"), "").unwrap();
        changed("a file added", &mut seen);
        fs::remove_file(tree.path("pkg/a.py")).unwrap();
        changed("a file removed", &mut seen);
        fs::rename(tree.path("pkg/sub/c.py"), tree.path("pkg/sub/d.py")).unwrap();
        changed("a file renamed", &mut seen);
        fs::create_dir(tree.path("pkg/empty")).unwrap();
        changed("a directory added", &mut seen);
    }

    #[test]
    fn bytecode_caches_are_left_out() {
        let tree = Scratch::new("pycache");
        let roots = [tree.path("pkg")];
        let before = fingerprint(&roots);
        fs::create_dir(tree.path("pkg/__pycache__")).unwrap();
        fs::write(tree.path("pkg/__pycache__/a.cpython-311.pyc"), "x").unwrap();
        assert_eq!(before, fingerprint(&roots));
    }

    #[test]
    fn missing_root_differs_from_an_empty_one() {
        let tree = Scratch::new("missing");
        let missing = fingerprint(&[tree.path("nowhere")]);
        fs::create_dir(tree.path("nowhere")).unwrap();
        assert_ne!(missing, fingerprint(&[tree.path("nowhere")]));
    }

    #[test]
    fn the_same_files_under_another_root_differ() {
        let tree = Scratch::new("roots");
        assert_ne!(
            fingerprint(&[tree.path("pkg")]),
            fingerprint(&[tree.path("pkg/sub")])
        );
    }
}
