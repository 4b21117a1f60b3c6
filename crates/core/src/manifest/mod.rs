//! Manifests: every YAML document under the source path, parsed once, each
//! remembering its file and line. Apps are the top-level directories.

pub mod parse;
pub mod schema;

pub use parse::{MAX_FILE_BYTES, MAX_REVISION_BYTES, load_files};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use serde_json::Value;

/// The app name for files that sit directly in the source path.
pub const ROOT_APP: &str = "root";

/// An app directory's optional settings file (how it is rendered); never applied.
pub const SETTINGS_FILE: &str = "gitcanary.yaml";

/// Whether `path` (relative to the source path) is an app's settings file,
/// or one directly in the source path: the repository's wave settings when
/// the source path is its root, never a manifest in any case.
pub fn is_settings_file(path: &str) -> bool {
    path == SETTINGS_FILE || path.split_once('/').is_some_and(|(_, rest)| rest == SETTINGS_FILE)
}

/// Whether a line of a YAML file ends one document: `---` (perhaps with a
/// comment after it) starts the next, `...` ends the one before.
pub fn is_document_break(line: &str) -> bool {
    let trimmed = line.trim_end();
    trimmed == "---" || trimmed.starts_with("--- ") || trimmed == "..."
}

/// One YAML document that holds a Kubernetes object.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    pub app: String,
    /// Path relative to the source path, with `/` separators.
    pub file: String,
    /// 1-based line where the document's content starts.
    pub line: usize,
    pub object: Value,
}

impl Manifest {
    pub fn api_version(&self) -> &str {
        self.object["apiVersion"].as_str().unwrap_or_default()
    }
    pub fn kind(&self) -> &str {
        self.object["kind"].as_str().unwrap_or_default()
    }
    pub fn name(&self) -> &str {
        self.object["metadata"]["name"].as_str().unwrap_or_default()
    }
    pub fn namespace(&self) -> Option<&str> {
        self.object["metadata"]["namespace"].as_str()
    }
    pub fn group(&self) -> &str {
        match self.api_version().rsplit_once('/') {
            Some((group, _)) => group,
            None => "",
        }
    }
    /// Whether this manifest names (group, kind, name), in any namespace.
    pub fn is_named(&self, group: &str, kind: &str, name: &str) -> bool {
        self.name() == name && self.kind() == kind && self.group() == group
    }
    pub fn key(&self) -> ObjectKey {
        ObjectKey {
            group: self.group().to_string(),
            kind: self.kind().to_string(),
            namespace: self.namespace().map(str::to_string),
            name: self.name().to_string(),
        }
    }
    /// `file:line`, as problems and logs name a manifest.
    pub fn location(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
    pub fn problem(&self, message: impl Into<String>) -> Problem {
        Problem {
            file: self.file.clone(),
            line: self.line,
            message: message.into(),
        }
    }
}

/// Identifies an object regardless of its API version.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct ObjectKey {
    pub group: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            write!(f, "{}", self.kind)?;
        } else {
            write!(f, "{}.{}", self.kind, self.group)?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " {ns}/{}", self.name),
            None => write!(f, " {}", self.name),
        }
    }
}

/// Something wrong with the manifests, at a file and line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: String,
    pub line: usize,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

/// The documents and problems of one app.
#[derive(Debug, Clone, Default)]
pub struct App {
    pub name: String,
    /// Shared with the loads that take the app over unchanged: a push
    /// copies none of the objects of the apps it leaves alone.
    pub manifests: std::sync::Arc<Vec<Manifest>>,
    pub problems: Vec<Problem>,
    /// See [`App::digest`]; made on first use, when the manifests are final.
    pub digest: std::sync::OnceLock<[u8; 32]>,
    /// Every object passed the checks that look at it alone, under the
    /// `Allowed` of this fingerprint (an app taken over by a later load is
    /// not checked again).
    pub checked: Option<u64>,
    /// See [`App::kinds`].
    /// Shared, as the hashes: a load that copies an app copies neither.
    pub kinds: std::sync::OnceLock<std::sync::Arc<[(String, String)]>>,
    /// See [`App::key_hashes`].
    pub key_hashes: std::sync::OnceLock<std::sync::Arc<[KeyHash]>>,
}

/// A manifest's [`key_hash`], the hash of its key without the namespace
/// (for the key in another namespace) and whether it names its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyHash {
    pub hash: u64,
    pub name_hash: u64,
    pub names_namespace: bool,
}

impl KeyHash {
    fn of(manifest: &Manifest) -> KeyHash {
        let name_hash = name_hash(manifest.group(), manifest.kind(), manifest.name());
        KeyHash {
            hash: key_hash_in(name_hash, manifest.namespace()),
            name_hash,
            names_namespace: manifest.namespace().is_some(),
        }
    }
}

/// A hash of an object's key, the same for the same key all through one
/// process and unforeseeable outside it (the seed is the process's own: the
/// one read of the environment in this crate, and no output depends on it).
/// Equal hashes are only candidates: whoever compares them compares the
/// keys too.
pub fn key_hash(group: &str, kind: &str, namespace: Option<&str>, name: &str) -> u64 {
    key_hash_in(name_hash(group, kind, name), namespace)
}

/// The hash of (group, kind, name), which [`key_hash_in`] places in a namespace.
pub fn name_hash(group: &str, kind: &str, name: &str) -> u64 {
    use std::hash::BuildHasher;
    SEED.hash_one((group, kind, name))
}

/// [`key_hash`] from a [`name_hash`].
pub fn key_hash_in(name_hash: u64, namespace: Option<&str>) -> u64 {
    use std::hash::BuildHasher;
    SEED.hash_one((name_hash, namespace))
}

static SEED: std::sync::LazyLock<std::collections::hash_map::RandomState> = std::sync::LazyLock::new(Default::default);

/// A [`key_hash`] taken as the hash it already is.
#[derive(Default)]
pub struct KeyHashed(u64);

impl std::hash::Hasher for KeyHashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64`s are hashed with it; anything else is mixed in anyway.
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }
    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }
}

/// A map keyed by [`key_hash`]es.
pub type ByKeyHash<V> = HashMap<u64, V, std::hash::BuildHasherDefault<KeyHashed>>;

/// Claims of object keys, found by their [`key_hash`] without a key built
/// or copied; keys that share a hash and differ (rare) are told apart by
/// the key itself. The first claim of a key is kept; a later one meets it.
pub struct KeyIndex<K, C> {
    by_hash: ByKeyHash<C>,
    /// Keys whose hash an earlier key has too, by key.
    shared_hash: HashMap<K, C>,
}

impl<K: Eq + std::hash::Hash, C> KeyIndex<K, C> {
    pub fn with_capacity(claims: usize) -> Self {
        KeyIndex {
            by_hash: ByKeyHash::with_capacity_and_hasher(claims, Default::default()),
            shared_hash: HashMap::new(),
        }
    }

    /// Claims the key hashed as `hash` for `claim`. `key_of` makes a
    /// claim's key and `is` tells whether a claim is of a key (each asked
    /// only when a hash is met again). The first claim of the same key, when
    /// another came first: `claim` is then dropped.
    pub fn claim(
        &mut self,
        hash: u64,
        claim: C,
        key_of: impl Fn(&C) -> K,
        is: impl Fn(&C, &K) -> bool,
    ) -> Option<&mut C> {
        let first = match self.by_hash.entry(hash) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(claim);
                return None;
            }
            std::collections::hash_map::Entry::Occupied(first) => first.into_mut(),
        };
        let key = key_of(&claim);
        if is(first, &key) {
            return Some(first);
        }
        match self.shared_hash.entry(key) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(claim);
                None
            }
            std::collections::hash_map::Entry::Occupied(first) => Some(first.into_mut()),
        }
    }

    /// The first claim of `key`, hashed as `hash`.
    pub fn get(&self, hash: u64, key: &K, is: impl Fn(&C, &K) -> bool) -> Option<&C> {
        self.by_hash
            .get(&hash)
            .filter(|claim| is(claim, key))
            .or_else(|| self.shared_hash.get(key))
    }
}

impl App {
    pub fn is_valid(&self) -> bool {
        self.problems.is_empty()
    }

    /// The (apiVersion, kind) of the app's manifests, sorted, each once.
    pub fn kinds(&self) -> &[(String, String)] {
        self.kinds.get_or_init(|| {
            let kinds: BTreeSet<(&str, &str)> = self.manifests.iter().map(|m| (m.api_version(), m.kind())).collect();
            kinds.into_iter().map(|(a, k)| (a.to_string(), k.to_string())).collect()
        })
    }

    /// The [`key_hash`] of each manifest, in order: made once for an app a
    /// later load takes over, so that the checks across apps read only the
    /// objects of the apps that changed.
    /// Made again when the manifests changed after (the fields are public):
    /// a hash missing would leave an object out of every check.
    pub fn key_hashes(&self) -> std::borrow::Cow<'_, [KeyHash]> {
        let kept = self
            .key_hashes
            .get_or_init(|| self.manifests.iter().map(KeyHash::of).collect());
        if kept.len() == self.manifests.len() {
            std::borrow::Cow::Borrowed(kept)
        } else {
            std::borrow::Cow::Owned(self.manifests.iter().map(KeyHash::of).collect())
        }
    }

    /// A hash of the app's manifests (content, file and line): equal
    /// digests, the same objects to apply.
    pub fn digest(&self) -> [u8; 32] {
        *self.digest.get_or_init(|| {
            use sha2::{Digest, Sha256};
            let mut hasher = Sha256::new();
            for manifest in self.manifests.iter() {
                hasher.update(manifest.file.as_bytes());
                hasher.update(manifest.line.to_le_bytes());
                // Writing into the hasher cannot fail.
                let _ = serde_json::to_writer(HashWriter(&mut hasher), &manifest.object);
                hasher.update([0]);
            }
            hasher.finalize().into()
        })
    }
}

/// Checks of gitcanary's own kinds in one app (see `rollout::validate`).
type KindChecks<'c> = dyn Fn(&App) -> Vec<Problem> + 'c;

struct HashWriter<'h>(&'h mut sha2::Sha256);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        sha2::Digest::update(self.0, bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every app of one source revision.
#[derive(Debug, Clone, Default)]
pub struct ManifestSet {
    pub apps: BTreeMap<String, App>,
}

impl ManifestSet {
    pub fn problems(&self) -> impl Iterator<Item = &Problem> {
        self.apps.values().flat_map(|app| app.problems.iter())
    }

    /// Checks that need no cluster: required fields, duplicates, and where
    /// objects may land (see [`Allowed`]).
    pub fn validate(&mut self, allowed: &Allowed) {
        self.check(allowed, None);
    }

    /// [`ManifestSet::validate`], then `kind_checks` on each app that passed
    /// (the checks of gitcanary's own kinds, which live with those kinds).
    /// An app that passed them all before, under the same `allowed`, is
    /// only checked for duplicates: its objects are the same.
    pub fn validate_with(&mut self, allowed: &Allowed, kind_checks: impl Fn(&App) -> Vec<Problem>) {
        self.check(allowed, Some(&kind_checks));
    }

    fn check(&mut self, allowed: &Allowed, kind_checks: Option<&KindChecks<'_>>) {
        let checked_for = kind_checks.is_some().then(|| allowed.fingerprint());
        let mut duplicates = self.duplicates();
        for app in self.apps.values_mut() {
            let passed_before = checked_for.is_some() && app.checked == checked_for;
            let mut duplicated = duplicates
                .remove(app.name.as_str())
                .unwrap_or_default()
                .into_iter()
                .peekable();
            let mut problems = Vec::new();
            for (index, manifest) in app.manifests.iter().enumerate() {
                if !passed_before {
                    problems.extend(object_problems(manifest, allowed));
                }
                if let Some((_, problem)) = duplicated.next_if(|(at, _)| *at == index) {
                    problems.push(problem);
                }
            }
            if let Some(kind_checks) = kind_checks
                && problems.is_empty()
                && !passed_before
            {
                problems.extend(kind_checks(app));
            }
            app.checked = checked_for.filter(|_| problems.is_empty() && app.problems.is_empty());
            app.problems.extend(problems);
        }
    }

    /// Each object defined a second time, by app: the manifest's index in
    /// its app and the problem. The first definition (in app order, then
    /// file order) is the one kept. Keys are borrowed, not built: a large
    /// repository has tens of thousands of objects.
    fn duplicates(&self) -> HashMap<String, Vec<(usize, Problem)>> {
        type Key<'m> = (&'m str, &'m str, Option<&'m str>, &'m str);
        fn key_of(m: &Manifest) -> Key<'_> {
            (m.group(), m.kind(), m.namespace(), m.name())
        }
        let objects = self.apps.values().map(|app| app.manifests.len()).sum();
        let mut seen: KeyIndex<Key<'_>, (&str, &Manifest)> = KeyIndex::with_capacity(objects);
        let mut found: HashMap<String, Vec<(usize, Problem)>> = HashMap::new();
        for app in self.apps.values() {
            for ((index, manifest), hash) in app.manifests.iter().enumerate().zip(app.key_hashes().iter()) {
                let claim = (app.name.as_str(), manifest);
                let first = seen.claim(hash.hash, claim, |c| key_of(c.1), |c, key| key_of(c.1) == *key);
                let Some(&mut first) = first else {
                    continue;
                };
                let (other_app, other) = first;
                let where_ = if other_app == app.name {
                    other.location()
                } else {
                    format!("{} (app {other_app})", other.location())
                };
                let message = format!("duplicate object {}, first defined at {where_}", manifest.key());
                found
                    .entry(app.name.clone())
                    .or_default()
                    .push((index, manifest.problem(message)));
            }
        }
        found
    }
}

/// The namespace an object without one lands in, when its kind is namespaced.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Cluster-scoped kinds of Kubernetes and of the Gateway API, for checks
/// made without a cluster; a sync asks discovery instead.
pub const CLUSTER_SCOPED_KINDS: [&str; 16] = [
    "Namespace",
    "Node",
    "PersistentVolume",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "StorageClass",
    "PriorityClass",
    "IngressClass",
    "RuntimeClass",
    "CSIDriver",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "APIService",
    "GatewayClass",
    "ValidatingAdmissionPolicy",
];

/// Where objects may land: `--namespaces` (empty allows everything) and,
/// under it, the cluster-scoped kinds allowed (`--cluster-kinds`).
#[derive(Debug, Clone, Hash)]
pub struct Allowed {
    pub namespaces: Vec<String>,
    pub cluster_kinds: Vec<String>,
    /// Where a namespaced object whose manifest names no namespace lands
    /// (`--default-namespace`).
    pub default_namespace: String,
}

impl Default for Allowed {
    fn default() -> Self {
        Allowed {
            namespaces: Vec::new(),
            cluster_kinds: Vec::new(),
            default_namespace: DEFAULT_NAMESPACE.to_string(),
        }
    }
}

impl Allowed {
    fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut hasher);
        hasher.finish()
    }

    /// Why an object may not land where it would: in `namespace` (what it
    /// resolves to: its own, or the default), or cluster-wide when `None`.
    pub fn refusal(
        &self,
        group: &str,
        kind: &str,
        name: &str,
        declared: Option<&str>,
        namespace: Option<&str>,
    ) -> Option<String> {
        if self.namespaces.is_empty() {
            return None;
        }
        let allowed = |ns: &str| self.namespaces.iter().any(|a| a == ns);
        let list = self.namespaces.join(", ");
        match namespace {
            Some(ns) if allowed(ns) => None,
            Some(ns) if declared.is_none() => Some(format!(
                "no namespace: it would land in {ns:?}, which is not allowed (allowed: {list}); give metadata.namespace"
            )),
            Some(ns) => Some(format!("namespace {ns:?} is not allowed (allowed: {list})")),
            None if !cluster_kind_listed(&self.cluster_kinds, group, kind) => Some(format!(
                "{} is cluster-scoped, and cluster-scoped kinds are refused under --namespaces unless listed in --cluster-kinds",
                group_kind(group, kind)
            )),
            None if group.is_empty() && kind == "Namespace" && !allowed(name) => {
                Some(format!("Namespace {name:?} is not one of --namespaces ({list})"))
            }
            None => None,
        }
    }

    /// [`Allowed::refusal`] of a manifest checked without a cluster: the kind's
    /// scope is taken from the well-known cluster-scoped kinds.
    fn offline_refusal(&self, manifest: &Manifest) -> Option<String> {
        let declared = manifest.namespace();
        let namespace = if CLUSTER_SCOPED_KINDS.contains(&manifest.kind()) {
            None
        } else {
            Some(declared.unwrap_or(&self.default_namespace))
        };
        self.refusal(manifest.group(), manifest.kind(), manifest.name(), declared, namespace)
    }
}

/// `group/Kind` as `--cluster-kinds` takes it; a core kind is just `Kind`.
fn group_kind(group: &str, kind: &str) -> String {
    if group.is_empty() {
        kind.to_string()
    } else {
        format!("{group}/{kind}")
    }
}

/// Whether `--cluster-kinds` lists this group and kind. An entry names both
/// (`rbac.authorization.k8s.io/ClusterRole`); a bare `Namespace` or
/// `/Namespace` is the core group. Matching on the kind alone would let a
/// CRD named like a built-in (`evil.example.com/ClusterRole`) through.
pub fn cluster_kind_listed(listed: &[String], group: &str, kind: &str) -> bool {
    listed.iter().any(|entry| {
        let (entry_group, entry_kind) = entry.rsplit_once('/').unwrap_or(("", entry.as_str()));
        entry_group == group && entry_kind == kind
    })
}

fn object_problems(manifest: &Manifest, allowed: &Allowed) -> Vec<Problem> {
    let object = &manifest.object;
    let mut problems = Vec::new();
    if !object.is_object() {
        problems.push(manifest.problem("a manifest must be a mapping with apiVersion, kind and metadata"));
        return problems;
    }
    for field in ["apiVersion", "kind"] {
        match &object[field] {
            Value::String(s) if !s.is_empty() => {}
            Value::Null => problems.push(manifest.problem(format!("missing {field}"))),
            _ => problems.push(manifest.problem(format!("{field} must be a non-empty string"))),
        }
    }
    match &object["metadata"]["name"] {
        Value::String(s) if is_dns_subdomain(s) => {}
        Value::String(s) => problems.push(manifest.problem(format!(
            "metadata.name {s:?} is not a valid name (lower-case letters, digits, '-' and '.', at most 253 characters)"
        ))),
        Value::Null => problems.push(manifest.problem("missing metadata.name")),
        _ => problems.push(manifest.problem("metadata.name must be a string")),
    }
    match &object["metadata"]["namespace"] {
        Value::Null | Value::String(_) => {
            problems.extend(allowed.offline_refusal(manifest).map(|m| manifest.problem(m)))
        }
        _ => problems.push(manifest.problem("metadata.namespace must be a string")),
    }
    if problems.is_empty()
        && let Some(problem) = schema::typed_problem(manifest)
    {
        problems.push(manifest.problem(format!("{} {}: {problem}", manifest.kind(), manifest.name())));
    }
    problems
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(files: &[(&str, &str)]) -> ManifestSet {
        let mut set = load_files(files.iter().map(|(p, c)| (p.to_string(), c.as_bytes().to_vec())));
        set.validate(&Allowed::default());
        set
    }

    #[test]
    fn documents_remember_file_and_line() {
        let set = set(&[(
            "web/all.yaml",
            "# leading comment\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\n",
        )]);
        let app = &set.apps["web"];
        let lines: Vec<_> = app.manifests.iter().map(|m| (m.name(), m.line)).collect();
        assert_eq!(lines, vec![("a", 2), ("b", 8)]);
        assert!(app.is_valid());
    }

    #[test]
    fn syntax_error_names_file_and_line() {
        let set = set(&[(
            "web/bad.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n   bad: [\n",
        )]);
        let problems: Vec<_> = set.problems().collect();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].file, "web/bad.yaml");
        assert!((8..=10).contains(&problems[0].line), "{}", problems[0]);
    }

    #[test]
    fn missing_fields_and_duplicates_are_reported() {
        let set = set(&[
            (
                "a/one.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: demo}\n",
            ),
            (
                "b/two.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: demo}\n---\nkind: Secret\nmetadata: {name: Bad_Name}\n",
            ),
        ]);
        let text: Vec<String> = set.problems().map(ToString::to_string).collect();
        assert_eq!(text.len(), 3, "{text:?}");
        assert!(
            text[0]
                .starts_with("b/two.yaml:1: duplicate object ConfigMap demo/x, first defined at a/one.yaml:1 (app a)")
        );
        assert!(text[1].starts_with("b/two.yaml:5: missing apiVersion"));
        assert!(text[2].contains("metadata.name \"Bad_Name\" is not a valid name"));
        assert!(set.apps["a"].is_valid());
    }

    #[test]
    fn keys_that_share_a_hash_are_told_apart_and_a_duplicate_of_either_is_found() {
        let mut set = load_files(
            [
                (
                    "a/x.yaml",
                    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: demo}\n",
                ),
                (
                    "b/y.yaml",
                    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: limits, namespace: demo}\n",
                ),
                (
                    "c/y.yaml",
                    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: limits, namespace: demo}\n",
                ),
            ]
            .into_iter()
            .map(|(p, c)| (p.to_string(), c.as_bytes().to_vec())),
        );
        // Every key hashed alike, as two keys of thousands may be.
        let same = KeyHash {
            hash: 7,
            name_hash: 7,
            names_namespace: true,
        };
        for app in set.apps.values_mut() {
            app.key_hashes.set(vec![same].into()).expect("not made yet");
        }
        set.validate(&Allowed::default());
        assert!(
            set.apps["a"].is_valid() && set.apps["b"].is_valid(),
            "{:?}",
            set.problems().collect::<Vec<_>>()
        );
        let text: Vec<String> = set.problems().map(ToString::to_string).collect();
        assert_eq!(text.len(), 1, "{text:?}");
        assert!(
            text[0]
                .starts_with("c/y.yaml:1: duplicate object ConfigMap demo/limits, first defined at b/y.yaml:1 (app b)"),
            "{text:?}"
        );
    }

    #[test]
    fn hashes_kept_from_before_a_change_of_the_manifests_are_made_again() {
        let mut set = load_files(
            [(
                "a/x.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: demo}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: demo}\n",
            )]
            .into_iter()
            .map(|(p, c)| (p.to_string(), c.as_bytes().to_vec())),
        );
        let app = set.apps.get_mut("a").expect("app");
        // Hashes of the first manifest alone, as if made before the second came.
        let first = KeyHash::of(&app.manifests[0]);
        app.key_hashes.set(vec![first].into()).expect("not made yet");
        set.validate(&Allowed::default());
        let text: Vec<String> = set.problems().map(ToString::to_string).collect();
        assert_eq!(text.len(), 1, "{text:?}");
        assert!(
            text[0].starts_with("a/x.yaml:5: duplicate object ConfigMap demo/settings"),
            "{text:?}"
        );
    }

    #[test]
    fn namespace_allow_list() {
        let mut set = load_files(
            [(
                "a/x.yaml".to_string(),
                b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: kube-system}\n".to_vec(),
            )]
            .into_iter(),
        );
        let allowed = Allowed {
            namespaces: vec!["demo".to_string()],
            ..Allowed::default()
        };
        set.validate(&allowed);
        let problem = set.problems().next().expect("a problem");
        assert!(problem.message.contains("namespace \"kube-system\" is not allowed"));
    }

    #[test]
    fn the_allow_list_has_no_holes_for_objects_without_a_namespace_or_cluster_wide() {
        let files = [
            ("a/no-ns.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"),
            (
                "a/role.yaml",
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: admin-for-all}\n",
            ),
            (
                "a/ns.yaml",
                "apiVersion: v1\nkind: Namespace\nmetadata: {name: kube-system}\n",
            ),
            ("a/ok.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: demo}\n"),
        ];
        let mut allowed = Allowed {
            namespaces: vec!["demo".to_string()],
            ..Allowed::default()
        };
        let problems = |allowed: &Allowed| {
            let mut set = set(&files);
            set.validate(allowed);
            set.problems().map(ToString::to_string).collect::<Vec<_>>()
        };
        let refused = problems(&allowed);
        assert!(
            refused[0].starts_with("a/no-ns.yaml:1: no namespace: it would land in \"default\""),
            "{refused:?}"
        );
        assert!(
            refused
                .iter()
                .any(|p| p.starts_with("a/role.yaml:1: rbac.authorization.k8s.io/ClusterRoleBinding is cluster-scoped"))
        );
        assert!(
            refused
                .iter()
                .any(|p| p.starts_with("a/ns.yaml:1: Namespace is cluster-scoped"))
        );
        allowed.cluster_kinds = vec!["Namespace".to_string()];
        let refused = problems(&allowed);
        assert!(
            refused
                .iter()
                .any(|p| p.starts_with("a/ns.yaml:1: Namespace \"kube-system\" is not one of --namespaces"))
        );
        assert!(!refused.iter().any(|p| p.starts_with("a/ok.yaml")), "{refused:?}");
        assert!(problems(&Allowed::default()).is_empty());
    }

    #[test]
    fn cluster_kinds_name_the_group_as_well_as_the_kind() {
        let listed: Vec<String> = [
            "Namespace",
            "rbac.authorization.k8s.io/ClusterRole",
            "/PersistentVolume",
        ]
        .map(String::from)
        .to_vec();
        assert!(cluster_kind_listed(&listed, "", "Namespace"));
        assert!(cluster_kind_listed(&listed, "", "PersistentVolume"));
        assert!(cluster_kind_listed(&listed, "rbac.authorization.k8s.io", "ClusterRole"));
        // A CRD whose kind is named like a built-in one is another kind.
        assert!(!cluster_kind_listed(&listed, "evil.example.com", "ClusterRole"));
        assert!(!cluster_kind_listed(&listed, "evil.example.com", "Namespace"));
        assert!(!cluster_kind_listed(&listed, "", "ClusterRole"));

        let allowed = Allowed {
            namespaces: vec!["team-a".into()],
            cluster_kinds: listed,
            ..Allowed::default()
        };
        let refusal = allowed.refusal("evil.example.com", "Namespace", "kube-system", None, None);
        assert!(
            refusal
                .as_deref()
                .is_some_and(|r| r.starts_with("evil.example.com/Namespace is cluster-scoped")),
            "{refusal:?}"
        );
        assert!(
            allowed
                .refusal("rbac.authorization.k8s.io", "ClusterRole", "reader", None, None)
                .is_none()
        );
        assert!(allowed.refusal("", "Namespace", "team-a", None, None).is_none());
    }

    #[test]
    fn alias_bomb_is_refused_not_expanded() {
        let mut bomb = String::from(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bomb}\ndata:\n  a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
        );
        let mut prev = 'a';
        for c in 'b'..='m' {
            bomb.push_str(&format!(
                "  {c}: &{c} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"
            ));
            prev = c;
        }
        let set = set(&[("a/bomb.yaml", &bomb)]);
        assert_eq!(set.problems().count(), 1);
        assert!(set.apps["a"].manifests.is_empty());
    }

    #[test]
    fn top_level_files_form_the_root_app() {
        let set = set(&[("ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: demo}\n")]);
        assert_eq!(set.apps[ROOT_APP].manifests.len(), 1);
    }
}
