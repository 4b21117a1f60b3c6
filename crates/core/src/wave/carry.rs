//! Writing a release's images into the next environment's manifests, the
//! way they are expressed there: a container's `image:` in plain YAML, an
//! `images:` entry of a kustomization, a key of a Helm values file. Edits
//! are made line by line, so comments, order and quoting stay as written.

use super::HelmImageKeys;

/// An image reference: its name, and its tag and digest when it has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageRef<'a> {
    pub name: &'a str,
    pub tag: Option<&'a str>,
    pub digest: Option<&'a str>,
}

/// `registry:5000/team/app:1.2@sha256:…` → name, tag and digest; a `:` in
/// the registry's host is not a tag.
pub fn split_image(image: &str) -> ImageRef<'_> {
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    match rest[last_slash..].rfind(':') {
        Some(colon) => ImageRef {
            name: &rest[..last_slash + colon],
            tag: Some(&rest[last_slash + colon + 1..]),
            digest,
        },
        None => ImageRef {
            name: rest,
            tag: None,
            digest,
        },
    }
}

/// A YAML line split around its scalar value: what comes before it, the
/// value (unquoted), its quote, and what follows (a comment).
struct Scalar<'a> {
    before: &'a str,
    value: &'a str,
    quote: &'a str,
    after: &'a str,
}

impl Scalar<'_> {
    /// The line with `value` in place, quoted as before; an unquoted value
    /// YAML would read as something else than a string (`1.10`, `true`) is
    /// quoted, so the tag stays the tag.
    fn with(&self, value: &str) -> String {
        let quote = if self.quote.is_empty() && !reads_as_string(value) {
            "\""
        } else {
            self.quote
        };
        format!("{}{quote}{value}{quote}{}", self.before, self.after)
    }
}

/// Whether YAML reads `value`, unquoted, as that very string.
fn reads_as_string(value: &str) -> bool {
    serde_saphyr::from_str::<serde_json::Value>(value).is_ok_and(|v| v.as_str() == Some(value))
}

/// Whether an image reference is one gitcanary writes into manifests:
/// the characters of a reference (name, tag, digest) and nothing that
/// could end a YAML scalar or start another key.
pub fn is_image_reference(image: &str) -> bool {
    !image.is_empty()
        && image.len() <= 512
        && image
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/' | b':' | b'@' | b'+'))
}

/// The value of `key: value` on `line` (after any `- ` list markers).
fn scalar_of<'a>(line: &'a str, key: &str) -> Option<Scalar<'a>> {
    let mut rest = line.trim_start();
    while let Some(stripped) = rest.strip_prefix("- ") {
        rest = stripped.trim_start();
    }
    let after_key = rest.strip_prefix(key)?.strip_prefix(':')?;
    let value_at = line.len() - after_key.trim_start().len();
    let text = &line[value_at..];
    let (quote, inner_end) = match text.chars().next() {
        Some(q @ ('"' | '\'')) => (&text[..1], text[1..].find(q).map(|i| i + 1)?),
        _ => ("", text.find(" #").unwrap_or(text.len())),
    };
    let value = text[quote.len()..inner_end].trim_end();
    if value.is_empty() {
        return None;
    }
    let after_start = value_at + quote.len() + value.len() + quote.len();
    Some(Scalar {
        before: &line[..value_at],
        value,
        quote,
        after: &line[after_start..],
    })
}

fn lines_of(text: &str) -> Vec<String> {
    text.lines().map(str::to_string).collect()
}

/// The lines written back with the file's own line ends.
fn joined(lines: &[String], text: &str) -> String {
    let newline = if text.contains("\r\n") { "\r\n" } else { "\n" };
    let mut out = lines.join(newline);
    if text.ends_with('\n') {
        out.push_str(newline);
    }
    out
}

/// The released image of the same name as `image`, when it differs.
fn newer<'i>(image: &str, images: &'i [String]) -> Option<&'i String> {
    let name = split_image(image).name;
    images
        .iter()
        .find(|released| split_image(released).name == name && released.as_str() != image)
}

/// The workload a Rollout governs, by kind and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub kind: String,
    pub name: String,
}

/// The workload that gitcanary's Rollout `rollout` among `files` (path,
/// text) governs, when one of them holds that Rollout.
pub fn rollout_workload(files: &[(String, String)], rollout: &str) -> Option<Workload> {
    files.iter().find_map(|(_, text)| {
        documents(&lines_of(text))
            .into_iter()
            .find_map(|(_, kind, name, document)| {
                let group = document["apiVersion"]
                    .as_str()
                    .and_then(|v| v.split_once('/'))
                    .map(|(g, _)| g);
                let ours = group == Some(crate::rollout::api::GROUP);
                (ours && kind == "Rollout" && name == rollout).then(|| {
                    let reference = &document["spec"]["workloadRef"];
                    Workload {
                        kind: reference["kind"].as_str().unwrap_or_default().to_string(),
                        name: reference["name"].as_str().unwrap_or_default().to_string(),
                    }
                })
            })
    })
}

/// Each YAML document of `lines` that parses: its lines, kind and name.
fn documents(lines: &[String]) -> Vec<(std::ops::Range<usize>, String, String, serde_json::Value)> {
    document_ranges(lines)
        .into_iter()
        .filter_map(|range| {
            let text = lines[range.clone()].join("\n");
            let document: serde_json::Value = serde_saphyr::from_str(&text).ok()?;
            let kind = document["kind"].as_str()?.to_string();
            let name = document["metadata"]["name"].as_str()?.to_string();
            Some((range, kind, name, document))
        })
        .collect()
}

/// The line ranges of the documents of a multi-document YAML text, split
/// where the manifest loader splits them.
fn document_ranges(lines: &[String]) -> Vec<std::ops::Range<usize>> {
    let mut ranges = Vec::new();
    let mut start = 0;
    for (at, line) in lines.iter().enumerate() {
        if crate::manifest::is_document_break(line) {
            ranges.push(start..at);
            start = at + 1;
        }
    }
    ranges.push(start..lines.len());
    ranges
}

/// A plain manifest with every container's `image:` of a released image's
/// name set to the released one; `None` when nothing changes. Only an
/// `image:` under a `containers`, `initContainers` or `ephemeralContainers`
/// list counts: one in a ConfigMap's data or another field is left alone.
/// With `only`, only that workload's containers take it: another workload
/// of the app that runs the same image (a CronJob, say) is not released.
pub fn carry_plain(text: &str, images: &[String], only: Option<&Workload>) -> Option<String> {
    let mut lines = lines_of(text);
    let mut changed = false;
    let mut in_containers = container_lines(&lines);
    if let Some(workload) = only {
        let mut its_lines = vec![false; lines.len()];
        for (range, kind, name, _) in documents(&lines) {
            if kind == workload.kind && name == workload.name {
                its_lines[range].fill(true);
            }
        }
        for (container, its) in in_containers.iter_mut().zip(its_lines) {
            *container &= its;
        }
    }
    for (line, container) in lines.iter_mut().zip(in_containers) {
        if container
            && let Some(scalar) = scalar_of(line, "image")
            && let Some(released) = newer(scalar.value, images)
        {
            *line = scalar.with(released);
            changed = true;
        }
    }
    changed.then(|| joined(&lines, text))
}

/// For each line, whether it lies within a list of containers, read by
/// indentation: the keys above a line are those of lower indentation; a
/// list item may sit at its list key's own indentation, as YAML allows.
fn container_lines(lines: &[String]) -> Vec<bool> {
    const CONTAINER_LISTS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];
    let mut keys: Vec<(usize, &str)> = Vec::new();
    let mut within = Vec::with_capacity(lines.len());
    for line in lines {
        let trimmed = line.trim_start();
        let document_break = crate::manifest::is_document_break(line);
        if document_break {
            keys.clear();
        }
        if trimmed.is_empty() || trimmed.starts_with('#') || document_break {
            within.push(false);
            continue;
        }
        let dash = line.len() - trimmed.len();
        let mut rest = trimmed;
        while let Some(stripped) = rest.strip_prefix("- ") {
            rest = stripped.trim_start();
        }
        let key_at = line.len() - rest.len();
        if key_at == dash {
            keys.retain(|&(indent, _)| indent < key_at);
        } else {
            // A list item: a key at the dash's own indentation is its list's.
            keys.retain(|&(indent, _)| indent <= dash);
        }
        within.push(keys.iter().any(|(_, key)| CONTAINER_LISTS.contains(key)));
        if let Some((key, _)) = rest.split_once(':') {
            keys.push((key_at, key.trim()));
        }
    }
    within
}

/// The entries of a kustomization's top-level `images:`: each entry's
/// first and one-past-last line.
fn image_entries(lines: &[String]) -> (Option<usize>, Vec<(usize, usize)>) {
    let is_key = |line: &String| {
        line.strip_prefix("images:")
            .is_some_and(|rest| rest.trim().is_empty() || rest.trim_start().starts_with('#'))
    };
    let Some(key) = lines.iter().position(is_key) else {
        return (None, Vec::new());
    };
    let mut entries: Vec<(usize, usize)> = Vec::new();
    let mut end = key + 1;
    for (at, line) in lines.iter().enumerate().skip(key + 1) {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let indent = line.len() - trimmed.len();
        if indent == 0 && !trimmed.starts_with("- ") {
            break;
        }
        if trimmed.starts_with("- ") {
            if let Some(last) = entries.last_mut() {
                last.1 = at;
            }
            entries.push((at, at + 1));
        } else if let Some(last) = entries.last_mut() {
            last.1 = at + 1;
        }
        end = at + 1;
    }
    if let Some(last) = entries.last_mut() {
        last.1 = last.1.max(end.min(lines.len()));
    }
    (Some(key), entries)
}

/// A kustomization whose `images:` entries for the released images name
/// the released tag (and digest); an image it has no entry for gets one.
/// `None` when nothing changes.
pub fn carry_kustomization(text: &str, images: &[String]) -> Option<String> {
    let mut lines = lines_of(text);
    let before = lines.clone();
    // An empty flow list becomes a block one, so entries can follow.
    for line in &mut lines {
        if line.split('#').next().is_some_and(|l| l.trim_end() == "images: []") {
            *line = "images:".into();
        }
    }
    for image in images {
        let released = split_image(image);
        let (key, entries) = image_entries(&lines);
        let entry = entries.into_iter().find(|&(start, end)| {
            let field = |name: &str| {
                lines[start..end]
                    .iter()
                    .find_map(|l| scalar_of(l, name).map(|s| s.value))
            };
            field("newName").or_else(|| field("name")) == Some(released.name)
        });
        match entry {
            Some((start, end)) => set_entry(&mut lines, (start, end), released),
            None => add_entry(&mut lines, key, released),
        }
    }
    (lines != before).then(|| joined(&lines, text))
}

/// Sets an entry's `newTag` and `digest` to the released image's.
fn set_entry(lines: &mut Vec<String>, (start, end): (usize, usize), released: ImageRef<'_>) {
    let indent = lines[start].find("- ").map_or(2, |i| i + 2);
    let mut end = end;
    for (field, value) in [("newTag", released.tag), ("digest", released.digest)] {
        let at = (start..end).find(|&i| scalar_of(&lines[i], field).is_some());
        match (at, value) {
            (Some(at), Some(value)) => {
                let scalar = scalar_of(&lines[at], field).expect("found above");
                lines[at] = scalar.with(value);
            }
            (Some(at), None) => {
                lines.remove(at);
                end -= 1;
            }
            (None, Some(value)) => {
                lines.insert(
                    end,
                    format!("{}{field}: {}", " ".repeat(indent), quoted_if_needed(value)),
                );
                end += 1;
            }
            (None, None) => {}
        }
    }
}

fn quoted_if_needed(value: &str) -> String {
    match reads_as_string(value) {
        true => value.to_string(),
        false => format!("\"{value}\""),
    }
}

fn add_entry(lines: &mut Vec<String>, key: Option<usize>, released: ImageRef<'_>) {
    let (_, entries) = image_entries(lines);
    // As indented as the entries already there.
    let pad = entries.first().map_or(String::new(), |&(start, _)| {
        lines[start][..lines[start].find('-').unwrap_or(0)].to_string()
    });
    let mut entry = vec![format!("{pad}- name: {}", released.name)];
    entry.extend(
        released
            .tag
            .map(|tag| format!("{pad}  newTag: {}", quoted_if_needed(tag))),
    );
    entry.extend(released.digest.map(|digest| format!("{pad}  digest: {digest}")));
    match key {
        Some(key) => {
            let at = entries.last().map_or(key + 1, |&(_, end)| end);
            for (offset, line) in entry.into_iter().enumerate() {
                lines.insert(at + offset, line);
            }
        }
        None => {
            lines.push("images:".into());
            lines.extend(entry);
        }
    }
}

/// The line holding the scalar at a dotted key of a values file, read by
/// indentation (block mappings, as values files are written), and the
/// key as the file writes it (quoted or not).
fn values_line(lines: &[String], key: &str) -> Option<(usize, String)> {
    let wanted: Vec<&str> = key.split('.').collect();
    let mut path: Vec<(usize, &str)> = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('-') {
            continue;
        }
        let indent = line.len() - trimmed.len();
        let Some((name, _)) = trimmed.split_once(':') else {
            continue;
        };
        while path.last().is_some_and(|&(i, _)| i >= indent) {
            path.pop();
        }
        path.push((indent, name.trim_matches(|c| c == '"' || c == '\'')));
        if path.len() == wanted.len() && path.iter().map(|(_, n)| *n).eq(wanted.iter().copied()) {
            let written = name.trim_end();
            return scalar_of(line, written).is_some().then(|| (at, written.to_string()));
        }
    }
    None
}

/// A values file with each configured tag key set to its released image's
/// tag; `None` when nothing changes.
pub fn carry_values(text: &str, keys: &[HelmImageKeys], images: &[String]) -> Option<String> {
    let mut lines = lines_of(text);
    let mut changed = false;
    for entry in keys {
        let released = match &entry.repository {
            Some(repository) => values_line(&lines, repository)
                .and_then(|(at, key)| scalar_of(&lines[at], &key).map(|s| s.value.to_string()))
                .and_then(|name| images.iter().map(|i| split_image(i)).find(|i| i.name == name)),
            None if images.len() == 1 => Some(split_image(&images[0])),
            None => None,
        };
        let (Some(tag), Some((at, key))) = (released.and_then(|r| r.tag), values_line(&lines, &entry.tag)) else {
            continue;
        };
        let Some(scalar) = scalar_of(&lines[at], &key) else {
            continue;
        };
        if scalar.value != tag {
            lines[at] = scalar.with(tag);
            changed = true;
        }
    }
    changed.then(|| joined(&lines, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn released(images: &[&str]) -> Vec<String> {
        images.iter().map(|i| i.to_string()).collect()
    }

    #[test]
    fn an_image_reference_splits_into_name_tag_and_digest() {
        let split = |s| {
            let r = split_image(s);
            (r.name, r.tag, r.digest)
        };
        assert_eq!(split("echo"), ("echo", None, None));
        assert_eq!(
            split("registry.test:5000/team/echo:1.2"),
            ("registry.test:5000/team/echo", Some("1.2"), None)
        );
        assert_eq!(
            split("registry.test:5000/echo"),
            ("registry.test:5000/echo", None, None)
        );
        assert_eq!(split("echo:1@sha256:ab"), ("echo", Some("1"), Some("sha256:ab")));
    }

    #[test]
    fn a_plain_manifest_takes_the_released_image_and_keeps_everything_else() {
        let text = "spec:\n  containers:\n  - name: echo\n    image: \"registry.test/echo:1.0.0\"  # pinned\n  - image: registry.test/sidecar:3\n    name: sidecar\n";
        let carried = carry_plain(text, &released(&["registry.test/echo:1.1.0"]), None).expect("changed");
        assert_eq!(
            carried,
            "spec:\n  containers:\n  - name: echo\n    image: \"registry.test/echo:1.1.0\"  # pinned\n  - image: registry.test/sidecar:3\n    name: sidecar\n"
        );
        assert_eq!(
            carry_plain(&carried, &released(&["registry.test/echo:1.1.0"]), None),
            None,
            "already there"
        );
        assert_eq!(
            carry_plain(text, &released(&["registry.test/other:2"]), None),
            None,
            "not this app's"
        );
    }

    #[test]
    fn only_the_rollouts_workload_takes_the_release() {
        let app = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: echo}\nspec:\n  template:\n    spec:\n      containers:\n      - name: echo\n        image: registry.test/echo:1.0.0\n---\napiVersion: batch/v1\nkind: CronJob\nmetadata:\n  name: echo-report\nspec:\n  jobTemplate:\n    spec:\n      template:\n        spec:\n          containers:\n          - name: report\n            image: registry.test/echo:1.0.0\n";
        let rollout = "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata: {name: echo}\nspec:\n  workloadRef: {apiVersion: apps/v1, kind: Deployment, name: echo}\n";
        let files = vec![
            ("production/echo/app.yaml".to_string(), app.to_string()),
            ("production/echo/rollout.yaml".to_string(), rollout.to_string()),
        ];
        let workload = rollout_workload(&files, "echo").expect("the Rollout's workload");
        assert_eq!(
            workload,
            Workload {
                kind: "Deployment".into(),
                name: "echo".into()
            }
        );
        assert_eq!(rollout_workload(&files, "other"), None);
        let carried = carry_plain(app, &released(&["registry.test/echo:1.1.0"]), Some(&workload)).expect("changed");
        assert!(
            carried.contains("      - name: echo\n        image: registry.test/echo:1.1.0\n"),
            "{carried}"
        );
        assert!(
            carried.contains("          - name: report\n            image: registry.test/echo:1.0.0\n"),
            "the CronJob is not the release's: {carried}"
        );
        // Without the Rollout there, every container of the image, as `images:` would.
        let everywhere = carry_plain(app, &released(&["registry.test/echo:1.1.0"]), None).expect("changed");
        assert_eq!(everywhere.matches("echo:1.1.0").count(), 2);
    }

    #[test]
    fn only_a_containers_image_is_carried() {
        let text = "apiVersion: v1\nkind: ConfigMap\ndata:\n  image: registry.test/echo:1.0.0\n---\nkind: CronJob\nspec:\n  jobTemplate:\n    spec:\n      template:\n        spec:\n          initContainers:\n          - image: registry.test/echo:1.0.0\n          containers:\n          - name: a\n            image: registry.test/echo:1.0.0\n          volumes:\n          - name: v\n            image: registry.test/echo:1.0.0\n";
        let carried = carry_plain(text, &released(&["registry.test/echo:1.1.0"]), None).expect("changed");
        let changed: Vec<usize> = text
            .lines()
            .zip(carried.lines())
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(at, _)| at + 1)
            .collect();
        assert_eq!(
            changed,
            [13, 16],
            "the init container's and the container's image only:\n{carried}"
        );
    }

    #[test]
    fn a_kustomization_entry_takes_the_released_tag() {
        let text = "resources:\n- ../../base/shop\nimages:\n- name: registry.test/shop\n  newTag: 1.0.0 # production\n- name: registry.test/db\n  newTag: \"9\"\nnamePrefix: prod-\n";
        let carried = carry_kustomization(text, &released(&["registry.test/shop:1.1.0"])).expect("changed");
        assert_eq!(
            carried,
            "resources:\n- ../../base/shop\nimages:\n- name: registry.test/shop\n  newTag: 1.1.0 # production\n- name: registry.test/db\n  newTag: \"9\"\nnamePrefix: prod-\n"
        );
        // A renamed image matches by its new name; a digest replaces nothing it lacks.
        let renamed = "images:\n- name: shop\n  newName: registry.test/shop\n  digest: sha256:old\n";
        assert_eq!(
            carry_kustomization(renamed, &released(&["registry.test/shop:2"])).expect("changed"),
            "images:\n- name: shop\n  newName: registry.test/shop\n  newTag: \"2\"\n"
        );
    }

    #[test]
    fn a_kustomization_without_an_entry_gets_one() {
        let text = "resources:\n- ../../base/shop\n";
        assert_eq!(
            carry_kustomization(text, &released(&["registry.test/shop:1.1.0"])).expect("changed"),
            "resources:\n- ../../base/shop\nimages:\n- name: registry.test/shop\n  newTag: 1.1.0\n"
        );
        let other = "images:\n- name: registry.test/db\n  newTag: \"9\"\nnamePrefix: prod-\n";
        assert_eq!(
            carry_kustomization(other, &released(&["registry.test/shop:1.1.0"])).expect("changed"),
            "images:\n- name: registry.test/db\n  newTag: \"9\"\n- name: registry.test/shop\n  newTag: 1.1.0\nnamePrefix: prod-\n"
        );
    }

    #[test]
    fn a_tag_yaml_would_read_as_a_number_is_quoted() {
        let text = "images:\n- name: registry.test/shop\n  newTag: 1.0.0\n";
        assert_eq!(
            carry_kustomization(text, &released(&["registry.test/shop:1.10"])).expect("changed"),
            "images:\n- name: registry.test/shop\n  newTag: \"1.10\"\n"
        );
        assert_eq!(
            carry_kustomization("resources: []\n", &released(&["registry.test/shop:2"])).expect("changed"),
            "resources: []\nimages:\n- name: registry.test/shop\n  newTag: \"2\"\n"
        );
        let keys = [HelmImageKeys {
            repository: None,
            tag: "image.tag".into(),
        }];
        assert_eq!(
            carry_values("image:\n  tag: v1\n", &keys, &released(&["web:true"])).expect("changed"),
            "image:\n  tag: \"true\"\n"
        );
    }

    #[test]
    fn odd_but_valid_files_keep_their_shape() {
        // CRLF line ends stay.
        let crlf = "images:\r\n- name: registry.test/shop\r\n  newTag: \"1\"\r\n";
        assert_eq!(
            carry_kustomization(crlf, &released(&["registry.test/shop:1.1.0"])).expect("changed"),
            "images:\r\n- name: registry.test/shop\r\n  newTag: \"1.1.0\"\r\n"
        );
        // An indented list, a comment on the key, an empty flow list.
        let indented = "images: # pinned\n  - name: registry.test/db\n    newTag: \"9\"\n";
        assert_eq!(
            carry_kustomization(indented, &released(&["registry.test/shop:2.0.1"])).expect("changed"),
            "images: # pinned\n  - name: registry.test/db\n    newTag: \"9\"\n  - name: registry.test/shop\n    newTag: 2.0.1\n"
        );
        assert_eq!(
            carry_kustomization("images: []\n", &released(&["registry.test/shop:2.0.1"])).expect("changed"),
            "images:\n- name: registry.test/shop\n  newTag: 2.0.1\n"
        );
        // A values key written quoted, and a repository key the file lacks.
        let keys = [
            HelmImageKeys {
                repository: Some("missing.repository".into()),
                tag: "missing.tag".into(),
            },
            HelmImageKeys {
                repository: Some("image.repository".into()),
                tag: "image.tag".into(),
            },
        ];
        assert_eq!(
            carry_values(
                "image:\n  \"repository\": web\n  \"tag\": v1\n",
                &keys,
                &released(&["web:v2"])
            )
            .expect("changed"),
            "image:\n  \"repository\": web\n  \"tag\": v2\n"
        );
    }

    #[test]
    fn only_a_plain_image_reference_is_carried() {
        assert!(is_image_reference("registry.test:5000/team/web:1.2@sha256:0123abcd"));
        for bad in [
            "",
            "web:1\n  command: [sh]",
            "web:1 # x",
            "web:\"1\"",
            "web:{1}",
            "web: 1",
        ] {
            assert!(!is_image_reference(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_values_file_takes_the_tag_at_the_named_key() {
        let keys = [HelmImageKeys {
            repository: Some("image.repository".into()),
            tag: "image.tag".into(),
        }];
        let text = "replicas: 3\nimage:\n  repository: registry.test/web\n  tag: \"1.0.0\" # prod\nsidecar:\n  tag: \"1.0.0\"\n";
        assert_eq!(
            carry_values(text, &keys, &released(&["registry.test/web:1.1.0"])).expect("changed"),
            "replicas: 3\nimage:\n  repository: registry.test/web\n  tag: \"1.1.0\" # prod\nsidecar:\n  tag: \"1.0.0\"\n"
        );
        assert_eq!(
            carry_values(text, &keys, &released(&["registry.test/api:2"])),
            None,
            "another image"
        );
        let untold = [HelmImageKeys {
            repository: None,
            tag: "image.tag".into(),
        }];
        assert_eq!(
            carry_values(text, &untold, &released(&["a:1", "b:2"])),
            None,
            "two images and no repository key: which one is not known"
        );
    }
}
