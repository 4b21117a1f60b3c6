//! Reading a source directory's manifest files from disk, sizes checked
//! before anything is read.

use std::path::Path;

use super::parse::{app_of_file, is_yaml, too_large};
use super::{MAX_FILE_BYTES, MAX_REVISION_BYTES};
use super::{ManifestSet, Problem, load_files};
use crate::{Error, Result};

/// Counts a revision's manifest bytes against [`MAX_REVISION_BYTES`] and
/// holds back files over [`MAX_FILE_BYTES`], both before anything is read.
#[derive(Debug, Default)]
pub struct SizeCheck {
    total: u64,
    /// Files too large to read, with their size.
    pub oversized: Vec<(String, u64)>,
}

impl SizeCheck {
    /// Whether the file (of `bytes`, known from its header or metadata) is
    /// to be read; `Err` once the revision passes the cap.
    pub fn admit(&mut self, revision: &str, path: &str, bytes: u64) -> Result<bool> {
        self.total += bytes;
        if self.total > MAX_REVISION_BYTES {
            return Err(Error::RevisionTooLarge {
                revision: revision.to_string(),
                path: path.to_string(),
                limit: MAX_REVISION_BYTES,
            });
        }
        if bytes > MAX_FILE_BYTES {
            self.oversized.push((path.to_string(), bytes));
            return Ok(false);
        }
        Ok(true)
    }

    /// Counts files read before (an app taken over from an earlier load).
    pub fn add(&mut self, bytes: u64) {
        self.total += bytes;
    }

    /// Each file held back becomes a problem of its app.
    pub fn report(self, set: &mut ManifestSet) {
        for (path, bytes) in self.oversized {
            app_of_file(set, &path).problems.push(too_large(&path, bytes));
        }
    }
}

/// Loads every `.yaml`/`.yml` file under `root` (hidden directories
/// skipped), except in the app directories `skip` names (rendered ones).
pub fn load_dir(root: &Path, skip: &std::collections::HashSet<String>) -> Result<ManifestSet> {
    let mut files = Vec::new();
    let mut links = Vec::new();
    let mut sizes = SizeCheck::default();
    let plain = |e: &walkdir::DirEntry| {
        let name = e.file_name().to_string_lossy();
        e.depth() == 0 || !(name.starts_with('.') || (e.depth() == 1 && skip.contains(name.as_ref())))
    };
    for entry in walkdir::WalkDir::new(root)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(plain)
    {
        let entry = entry.map_err(|e| Error::Read {
            path: root.display().to_string(),
            source: e.into(),
        })?;
        let relative = entry.path().strip_prefix(root).unwrap_or(entry.path());
        let relative = relative.to_string_lossy().replace('\\', "/");
        // A link is never followed (it could lead out of the source); as in
        // Git, it is no file of the source, and said so.
        if entry.path_is_symlink() && entry.depth() > 0 {
            links.push(relative);
            continue;
        }
        if !entry.file_type().is_file() || !is_yaml(&entry.path().to_string_lossy()) {
            continue;
        }
        let read_error = |source| Error::Read {
            path: entry.path().display().to_string(),
            source,
        };
        let bytes = entry.metadata().map_err(|e| read_error(e.into()))?.len();
        if !sizes.admit(&root.display().to_string(), &relative, bytes)? {
            continue;
        }
        let content = std::fs::read(entry.path()).map_err(read_error)?;
        files.push((relative, content));
    }
    let mut set = load_files(files.into_iter());
    sizes.report(&mut set);
    for link in links {
        app_of_file(&mut set, &link).problems.push(Problem {
            file: link.clone(),
            line: 1,
            message: "is a symbolic link; links are not followed, so nothing is read through it".into(),
        });
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlink_out_of_the_directory_is_reported_and_not_read() {
        let outside = tempfile::tempdir().expect("dir");
        std::fs::write(outside.path().join("secret.yaml"), "token: outside-4711\n").expect("write");
        let root = tempfile::tempdir().expect("dir");
        std::fs::create_dir(root.path().join("web")).expect("mkdir");
        std::fs::write(root.path().join("web/cm.yaml"), "kind: ConfigMap\n").expect("write");
        std::os::unix::fs::symlink(outside.path().join("secret.yaml"), root.path().join("web/leak.yaml"))
            .expect("link");
        std::os::unix::fs::symlink(outside.path(), root.path().join("web/dir")).expect("link");
        let set = load_dir(root.path(), &Default::default()).expect("loads");
        let web = &set.apps["web"];
        assert_eq!(web.manifests.len(), 1);
        assert!(!format!("{:?}", web.manifests).contains("outside-4711"));
        let linked: Vec<_> = web.problems.iter().map(|p| (p.file.as_str(), p.line)).collect();
        assert_eq!(linked, [("web/dir", 1), ("web/leak.yaml", 1)]);
        assert!(web.problems[0].message.contains("symbolic link"), "{}", web.problems[0]);
    }
}
