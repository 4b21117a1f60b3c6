use std::path::Path;

use serde_json::Value;

use super::{App, Manifest, ManifestSet, Problem, ROOT_APP};
use crate::{Error, Result};

/// Largest manifest file read; bigger ones are reported, not read.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Largest sum of a revision's manifest files; a bigger revision is refused whole.
pub const MAX_REVISION_BYTES: u64 = 64 * 1024 * 1024;

/// Most documents one app may hold, rendered or not; an app with more is
/// refused (a render that fans out must not starve the other apps).
pub const MAX_APP_DOCUMENTS: usize = 50_000;

/// Refuses the app when it holds more than [`MAX_APP_DOCUMENTS`] documents:
/// its manifests are dropped and a problem says why.
pub fn cap_documents(app: &mut App) {
    let count = app.manifests.len();
    if count <= MAX_APP_DOCUMENTS {
        return;
    }
    let file = app.manifests[MAX_APP_DOCUMENTS].file.clone();
    let line = app.manifests[MAX_APP_DOCUMENTS].line;
    app.manifests = Default::default();
    // Made from the manifests just dropped, if made already.
    app.kinds = Default::default();
    app.digest = Default::default();
    app.problems.push(Problem {
        file,
        line,
        message: format!(
            "app {} holds {count} documents, more than the {MAX_APP_DOCUMENTS} an app may hold; nothing of it is applied",
            app.name
        ),
    });
}

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

fn too_large(path: &str, bytes: u64) -> Problem {
    Problem {
        file: path.to_string(),
        line: 1,
        message: format!("file is {bytes} bytes, larger than the {MAX_FILE_BYTES}-byte limit; it was not read"),
    }
}

/// The app a path (relative to the source path) belongs to: its top-level
/// directory, or the root app.
pub fn app_of_path(path: &str) -> &str {
    path.split_once('/').map_or(ROOT_APP, |(dir, _)| dir)
}

/// The app a file belongs to (its top-level directory, or the root app),
/// made when it is the first file of it.
fn app_of_file<'s>(set: &'s mut ManifestSet, path: &str) -> &'s mut App {
    let name = app_of_path(path).to_string();
    set.apps
        .entry(name.clone())
        .or_insert_with(|| App { name, ..App::default() })
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

pub(crate) fn is_yaml(path: &str) -> bool {
    path.ends_with(".yaml") || path.ends_with(".yml")
}

/// Parses files given as (path relative to the source path, content).
/// Never fails: what cannot be parsed becomes a [`Problem`] of its app.
pub fn load_files(files: impl Iterator<Item = (String, Vec<u8>)>) -> ManifestSet {
    let mut set = ManifestSet::default();
    for (path, content) in files {
        if !is_yaml(&path) || super::is_settings_file(&path) {
            continue;
        }
        let app = app_of_file(&mut set, &path);
        let app_name = app.name.clone();
        parse_file(&app_name, &path, &content, app);
    }
    set
}

fn parse_file(app_name: &str, path: &str, content: &[u8], app: &mut App) {
    let problem = |line: usize, message: String| Problem {
        file: path.to_string(),
        line,
        message,
    };
    if content.len() as u64 > MAX_FILE_BYTES {
        app.problems.push(too_large(path, content.len() as u64));
        return;
    }
    let Ok(text) = std::str::from_utf8(content) else {
        app.problems.push(problem(1, "file is not UTF-8".to_string()));
        return;
    };
    for document in split_documents(text) {
        match serde_saphyr::from_str::<Value>(document.text) {
            Ok(Value::Null) => {} // empty or comment-only document
            Ok(object) => std::sync::Arc::make_mut(&mut app.manifests).push(Manifest {
                app: app_name.to_string(),
                file: path.to_string(),
                line: document.content_line,
                object,
            }),
            Err(error) => {
                let line = error
                    .location()
                    .map(|l| document.first_line + l.line() as usize - 1)
                    .unwrap_or(document.content_line);
                app.problems.push(problem(
                    line,
                    format!("invalid YAML: {}", first_line(&error.to_string())),
                ));
            }
        }
    }
}

/// The parser's message without its snippet, and without its own `error: ` prefix.
fn first_line(message: &str) -> &str {
    let line = message.lines().find(|l| !l.trim().is_empty()).unwrap_or(message).trim();
    line.strip_prefix("error: ").unwrap_or(line)
}

pub(crate) struct Document<'a> {
    pub(crate) text: &'a str,
    /// File line of the document's first line.
    pub(crate) first_line: usize,
    /// File line of its first line that is neither blank nor a comment.
    pub(crate) content_line: usize,
}

/// Splits a multi-document YAML file at `---` lines, keeping line numbers.
pub(crate) fn split_documents(text: &str) -> Vec<Document<'_>> {
    let mut documents = Vec::new();
    let mut start_byte = 0;
    let mut start_line = 1;
    let mut offset = 0;
    for (index, line) in text.split_inclusive('\n').enumerate() {
        if super::is_document_break(line) {
            documents.push(document(text, start_byte, offset, start_line));
            start_byte = offset + line.len();
            start_line = index + 2;
        }
        offset += line.len();
    }
    documents.push(document(text, start_byte, text.len(), start_line));
    documents
}

fn document(text: &str, from: usize, to: usize, first_line: usize) -> Document<'_> {
    let body = &text[from..to];
    let content_line = body
        .lines()
        .position(|l| {
            let t = l.trim();
            !t.is_empty() && !t.starts_with('#')
        })
        .map_or(first_line, |i| first_line + i);
    Document {
        text: body,
        first_line,
        content_line,
    }
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

    #[test]
    fn an_app_past_the_document_cap_is_refused_by_name() {
        let documents = "kind: ConfigMap\n---\n".repeat(MAX_APP_DOCUMENTS / 2 + 1);
        let files = [
            ("big/a.yaml".to_string(), documents.clone().into_bytes()),
            ("big/b.yaml".to_string(), documents.into_bytes()),
            ("small/cm.yaml".to_string(), b"kind: ConfigMap\n".to_vec()),
        ];
        let mut set = load_files(files.into_iter());
        for app in set.apps.values_mut() {
            cap_documents(app);
        }
        let big = &set.apps["big"];
        assert!(big.manifests.is_empty());
        assert_eq!(big.problems.len(), 1);
        assert_eq!(big.problems[0].file, "big/b.yaml");
        assert!(
            big.problems[0].message.starts_with("app big holds"),
            "{}",
            big.problems[0]
        );
        assert_eq!(set.apps["small"].manifests.len(), 1, "the other apps are untouched");
    }
}
