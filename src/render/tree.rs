//! The files a renderer reads, from a commit's tree or a local directory,
//! and their copy into a scratch directory: only regular files, so a
//! symlink in Git can never lead a renderer outside the repository.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use crate::manifest::MAX_FILE_BYTES;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    File,
    Dir,
}

/// Paths are relative to the source path, with `/` separators; `""` is the
/// source path itself.
pub trait SourceTree {
    /// A directory's entries (hidden ones left out), or `None` when it is not one.
    fn list(&self, dir: &str) -> Option<BTreeMap<String, Entry>>;
    /// A file's content; `Err` names why it cannot be read (absent, too large).
    fn read(&self, file: &str) -> Result<Vec<u8>, String>;
    /// An id that changes whenever anything under the directory does.
    fn id(&self, dir: &str) -> Option<String>;
}

pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// Whether `path` is `dir` or lies under it.
pub fn is_within(path: &str, dir: &str) -> bool {
    dir.is_empty() || path == dir || path.strip_prefix(dir).is_some_and(|rest| rest.starts_with('/'))
}

/// `dir/relative` with `.` and `..` resolved; `None` when it climbs above the
/// source path or is absolute.
pub fn resolve(dir: &str, relative: &str) -> Option<String> {
    if relative.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    Some(parts.join("/"))
}

pub struct GitTree<'r> {
    pub repo: &'r git2::Repository,
    pub root: git2::Tree<'r>,
}

impl GitTree<'_> {
    fn tree_at(&self, dir: &str) -> Option<git2::Tree<'_>> {
        if dir.is_empty() {
            return Some(self.root.clone());
        }
        let entry = self.root.get_path(Path::new(dir)).ok()?;
        self.repo.find_tree(entry.id()).ok()
    }
}

impl SourceTree for GitTree<'_> {
    fn list(&self, dir: &str) -> Option<BTreeMap<String, Entry>> {
        let tree = self.tree_at(dir)?;
        let mut entries = BTreeMap::new();
        for entry in tree.iter() {
            let Some(name) = entry.name() else { continue };
            if name.starts_with('.') {
                continue;
            }
            // Symlinks (0o120000) and submodules are no files of the repository's own.
            let kind = match (entry.kind(), entry.filemode()) {
                (Some(git2::ObjectType::Tree), _) => Entry::Dir,
                (Some(git2::ObjectType::Blob), 0o100644 | 0o100755) => Entry::File,
                _ => continue,
            };
            entries.insert(name.to_string(), kind);
        }
        Some(entries)
    }

    fn read(&self, file: &str) -> Result<Vec<u8>, String> {
        let entry = self
            .root
            .get_path(Path::new(file))
            .map_err(|_| format!("{file} not found"))?;
        let odb = self.repo.odb().map_err(|e| e.message().to_string())?;
        let (size, _) = odb.read_header(entry.id()).map_err(|e| e.message().to_string())?;
        if size as u64 > MAX_FILE_BYTES {
            return Err(format!(
                "{file} is {size} bytes, larger than the {MAX_FILE_BYTES}-byte limit"
            ));
        }
        let blob = self.repo.find_blob(entry.id()).map_err(|e| e.message().to_string())?;
        Ok(blob.content().to_vec())
    }

    fn id(&self, dir: &str) -> Option<String> {
        Some(self.tree_at(dir)?.id().to_string())
    }
}

pub struct DirTree {
    pub root: PathBuf,
}

impl SourceTree for DirTree {
    fn list(&self, dir: &str) -> Option<BTreeMap<String, Entry>> {
        let mut entries = BTreeMap::new();
        for entry in std::fs::read_dir(self.root.join(dir)).ok()? {
            let Ok(entry) = entry else { continue };
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with('.') {
                continue;
            }
            // symlink_metadata: a link is neither, as in Git.
            match entry.path().symlink_metadata() {
                Ok(m) if m.is_dir() => entries.insert(name, Entry::Dir),
                Ok(m) if m.is_file() => entries.insert(name, Entry::File),
                _ => continue,
            };
        }
        Some(entries)
    }

    fn read(&self, file: &str) -> Result<Vec<u8>, String> {
        let path = self.root.join(file);
        let size = path.symlink_metadata().map_err(|e| format!("{file}: {e}"))?.len();
        if size > MAX_FILE_BYTES {
            return Err(format!(
                "{file} is {size} bytes, larger than the {MAX_FILE_BYTES}-byte limit"
            ));
        }
        std::fs::read(&path).map_err(|e| format!("{file}: {e}"))
    }

    /// Paths, sizes and modification times: a local directory is for
    /// development, where an edit always changes one of them.
    fn id(&self, dir: &str) -> Option<String> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for entry in walkdir::WalkDir::new(self.root.join(dir)).sort_by_file_name() {
            let entry = entry.ok()?;
            let metadata = entry.path().symlink_metadata().ok()?;
            entry.path().hash(&mut hasher);
            metadata.len().hash(&mut hasher);
            metadata.modified().ok().hash(&mut hasher);
        }
        Some(format!("{:016x}", hasher.finish()))
    }
}

/// Copies `dirs` (with everything under them) from the tree to `into`,
/// keeping their paths; returns the bytes copied, or why it stopped.
pub fn export(tree: &dyn SourceTree, dirs: &[String], into: &Path, max_bytes: u64) -> Result<u64, String> {
    let mut copied = 0;
    let mut pending: Vec<String> = dirs.to_vec();
    while let Some(dir) = pending.pop() {
        let Some(entries) = tree.list(&dir) else { continue };
        let target = into.join(&dir);
        std::fs::create_dir_all(&target).map_err(|e| format!("creating {}: {e}", target.display()))?;
        for (name, kind) in entries {
            let path = join(&dir, &name);
            match kind {
                Entry::Dir => pending.push(path),
                Entry::File => {
                    let content = tree.read(&path)?;
                    copied += content.len() as u64;
                    if copied > max_bytes {
                        return Err(format!("its files are more than {max_bytes} bytes together"));
                    }
                    std::fs::write(into.join(&path), content).map_err(|e| format!("writing {path}: {e}"))?;
                }
            }
        }
    }
    Ok(copied)
}

/// A directory of `files` (path, content) and the tree over it, for tests.
#[cfg(test)]
pub(crate) fn tree_of(files: &[(&str, &str)]) -> (tempfile::TempDir, DirTree) {
    let dir = tempfile::tempdir().expect("dir");
    for (path, content) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
        std::fs::write(path, content).expect("write");
    }
    let tree = DirTree {
        root: dir.path().to_path_buf(),
    };
    (dir, tree)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_inside_the_source_or_not_at_all() {
        assert_eq!(resolve("web/overlays/prod", "../../base").as_deref(), Some("web/base"));
        assert_eq!(resolve("web", "./a/./b.yaml").as_deref(), Some("web/a/b.yaml"));
        assert_eq!(resolve("web", "../shared").as_deref(), Some("shared"));
        assert_eq!(resolve("web", "../../etc"), None);
        assert_eq!(resolve("web", "/etc/passwd"), None);
    }

    #[test]
    fn a_symlink_is_not_listed_and_not_exported() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir(dir.path().join("app")).expect("app");
        std::fs::write(dir.path().join("app/a.yaml"), "a: 1").expect("file");
        std::os::unix::fs::symlink("/etc", dir.path().join("app/etc")).expect("link");
        let tree = DirTree {
            root: dir.path().to_path_buf(),
        };
        let entries = tree.list("app").expect("listed");
        assert_eq!(entries.keys().collect::<Vec<_>>(), ["a.yaml"]);
        let out = tempfile::tempdir().expect("out");
        assert_eq!(export(&tree, &["app".into()], out.path(), 1000), Ok(4));
        assert!(!out.path().join("app/etc").exists());
        assert_eq!(
            export(&tree, &["app".into()], out.path(), 3),
            Err("its files are more than 3 bytes together".into())
        );
    }
}
