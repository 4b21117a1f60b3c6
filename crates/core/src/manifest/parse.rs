//! Parsing manifest files held in memory: documents split with their
//! line numbers, YAML parsed, problems named by file and line.

use serde_json::Value;

use super::{App, Manifest, ManifestSet, Problem, ROOT_APP};

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
    app.key_hashes = Default::default();
    app.problems.push(Problem {
        file,
        line,
        message: format!(
            "app {} holds {count} documents, more than the {MAX_APP_DOCUMENTS} an app may hold; nothing of it is applied",
            app.name
        ),
    });
}

pub fn too_large(path: &str, bytes: u64) -> Problem {
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
pub fn app_of_file<'s>(set: &'s mut ManifestSet, path: &str) -> &'s mut App {
    let name = app_of_path(path).to_string();
    set.apps
        .entry(name.clone())
        .or_insert_with(|| App { name, ..App::default() })
}

pub fn is_yaml(path: &str) -> bool {
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

pub struct Document<'a> {
    pub text: &'a str,
    /// File line of the document's first line.
    pub first_line: usize,
    /// File line of its first line that is neither blank nor a comment.
    pub content_line: usize,
}

/// Splits a multi-document YAML file at `---` lines, keeping line numbers.
pub fn split_documents(text: &str) -> Vec<Document<'_>> {
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
