//! The pure half of an app's reconcile. From the app's desired objects
//! (rollout overlays included) and what was observed of the cluster, it
//! decides everything the apply stage will do and why: what to write, what
//! is unchanged, what to prune, and which objects a brand-new app creates.
//! No I/O here; `sync` observes, calls [`plan_app`], applies and reports.

pub mod autoscaled;
pub mod desired;
mod health;
pub mod quantity;

pub use health::{WorkloadProgress, health_view, is_healthy};

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

use crate::APPLIED_HASH_ANNOTATION;
use crate::manifest::{Allowed, Manifest, ObjectKey, Problem, ROOT_APP};
use crate::model::{Deletion, InventoryEntry, LeftGit, Resolved, SyncOptions};
use desired::is_subset;

/// An object of the revision, resolved against the API server.
pub struct Planned<'a> {
    pub manifest: &'a Manifest,
    pub resolved: Resolved,
    pub desired: Value,
    pub key: ObjectKey,
}

impl<'a> Planned<'a> {
    /// The object to apply for a manifest of a kind resolved as `resolved`.
    pub fn new(manifest: &'a Manifest, resolved: Resolved, options: &SyncOptions) -> Planned<'a> {
        let desired = desired::prepare(
            manifest,
            resolved.namespaced,
            &options.instance,
            &options.allowed.default_namespace,
        );
        let key = key_of(&desired, manifest);
        Planned {
            manifest,
            resolved,
            desired,
            key,
        }
    }

    pub fn namespace(&self) -> Option<&str> {
        self.desired["metadata"]["namespace"].as_str()
    }
    pub fn name(&self) -> &str {
        self.manifest.name()
    }
    pub fn is_staged_first(&self) -> bool {
        is_staged_first(self.manifest)
    }
    pub fn inventory_entry(&self, adopted: bool) -> InventoryEntry {
        InventoryEntry {
            api_version: self.manifest.api_version().to_string(),
            kind: self.manifest.kind().to_string(),
            namespace: self.namespace().map(str::to_string),
            name: self.name().to_string(),
            adopted,
        }
    }

    /// The manifest asks gitcanary to take over an object that already exists.
    pub fn asks_adoption(&self) -> bool {
        self.manifest.object["metadata"]["annotations"][ADOPT_ANNOTATION].as_str() == Some("true")
    }
}

/// On a manifest: take over the object of that name if it already exists.
pub const ADOPT_ANNOTATION: &str = "gitcanary.io/adopt";

/// Who made an object, as the API server's answer for it (an apply or its
/// dry run) tells: the one reading both rules below decide from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    /// Field managers other than gitcanary's, sorted, each once.
    pub other_managers: Vec<String>,
    /// One managedFields entry, and it is gitcanary's.
    pub ours_alone: bool,
    pub created: Option<jiff::Timestamp>,
}

impl Provenance {
    pub fn of(answer: &Value) -> Provenance {
        let fields = answer["metadata"]["managedFields"].as_array();
        let mut other_managers: Vec<String> = fields
            .into_iter()
            .flatten()
            .filter_map(|f| f["manager"].as_str())
            .filter(|m| *m != crate::FIELD_MANAGER)
            .map(str::to_string)
            .collect();
        other_managers.sort();
        other_managers.dedup();
        Provenance {
            other_managers,
            ours_alone: fields.is_some_and(|f| f.len() == 1 && f[0]["manager"] == crate::FIELD_MANAGER),
            created: answer["metadata"]["creationTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok()),
        }
    }

    /// The adoption rule's question: someone else's field manager holds
    /// some of it, or it was created before the sync began (with the
    /// managers that hold it).
    pub fn existed_before(&self, started: jiff::Timestamp) -> Option<Vec<String>> {
        let created_before = self.created.is_some_and(|t| t.as_second() < started.as_second());
        (created_before || !self.other_managers.is_empty()).then(|| self.other_managers.clone())
    }

    /// The take-back's question: made by this sync and gitcanary's alone
    /// (one field manager, gitcanary, created at or after the sync began).
    /// It fails closed where [`Provenance::existed_before`] need not (no
    /// timestamp, no manager, a second entry): a delete cannot be undone,
    /// and an object that fails it is released instead.
    pub fn made_by_this_sync(&self, started: jiff::Timestamp) -> bool {
        self.ours_alone && self.created.is_some_and(|t| t.as_second() >= started.as_second())
    }
}

/// [`Provenance::existed_before`] of an answer.
pub fn existed_before(answer: &Value, started: jiff::Timestamp) -> Option<Vec<String>> {
    Provenance::of(answer).existed_before(started)
}

/// [`Provenance::made_by_this_sync`] of an answer.
pub fn made_by_this_sync(answer: &Value, started: jiff::Timestamp) -> bool {
    Provenance::of(answer).made_by_this_sync(started)
}

/// How an object written as new turned out, decided from the API server's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Creation {
    /// gitcanary made it.
    Created,
    /// It existed and was taken over, as asked (or it was this app's already).
    Adopted,
    /// It existed and nothing asked to take it over: the message says why and how.
    Refused(String),
}

/// The adoption rule: an object that already exists and that this instance
/// does not manage is taken over only when its manifest says
/// `gitcanary.io/adopt: "true"` or the agent runs with `--adopt`.
pub fn creation(
    item: &Planned<'_>,
    answer: &Value,
    started: jiff::Timestamp,
    previous: &[InventoryEntry],
    adopt_all: bool,
) -> Creation {
    let Some(managers) = existed_before(answer, started) else {
        return Creation::Created;
    };
    if let Some(entry) = previous.iter().find(|e| e.key() == item.key) {
        // This app's already (its label was removed, say).
        return if entry.adopted {
            Creation::Adopted
        } else {
            Creation::Created
        };
    }
    if adopt_all || item.asks_adoption() {
        return Creation::Adopted;
    }
    let managers = if managers.is_empty() {
        "no other field manager".to_string()
    } else {
        format!("field managers: {}", managers.join(", "))
    };
    Creation::Refused(format!(
        "{} already exists and this instance does not manage it ({managers}): to take it over, annotate the manifest {ADOPT_ANNOTATION}: \"true\" (or run the agent with --adopt for a migration); or rename it",
        item.key
    ))
}

/// Objects that would land where `allowed` does not let them, now that
/// discovery told each kind's scope: an object without a namespace in the
/// default one, a cluster-scoped kind cluster-wide.
pub fn landing_problems(objects: &[Planned<'_>], allowed: &Allowed) -> Vec<Problem> {
    objects
        .iter()
        .filter_map(|item| {
            let refusal = allowed.refusal(
                item.manifest.group(),
                item.manifest.kind(),
                item.name(),
                item.manifest.namespace(),
                item.namespace(),
            )?;
            Some(item.manifest.problem(refusal))
        })
        .collect()
}

/// Namespaces and CRDs are applied before everything else (other objects,
/// and other apps, may need them).
pub fn is_staged_first(manifest: &Manifest) -> bool {
    is_staged_first_kind(manifest.kind())
}

pub fn is_staged_first_kind(kind: &str) -> bool {
    matches!(kind, "Namespace" | "CustomResourceDefinition")
}

/// The key an object will have once applied: its namespace as resolved.
pub fn key_of(desired: &Value, manifest: &Manifest) -> ObjectKey {
    ObjectKey {
        group: manifest.group().to_string(),
        kind: manifest.kind().to_string(),
        namespace: desired["metadata"]["namespace"].as_str().map(str::to_string),
        name: manifest.name().to_string(),
    }
}

/// Live objects managed by this instance, listed once per kind for the whole
/// sync. Each is kept as compact JSON and parsed when its app is planned: a
/// parsed object takes several times the memory of its text, and a large
/// repository's objects would all be held at once.
#[derive(Default)]
pub struct LiveObjects {
    objects: HashMap<ObjectKey, Box<str>>,
}

impl LiveObjects {
    pub fn get(&self, key: &ObjectKey) -> Option<Value> {
        self.objects.get(key).and_then(|text| serde_json::from_str(text).ok())
    }
    pub fn contains_key(&self, key: &ObjectKey) -> bool {
        self.objects.contains_key(key)
    }
}

impl FromIterator<(ObjectKey, Box<str>)> for LiveObjects {
    fn from_iter<I: IntoIterator<Item = (ObjectKey, Box<str>)>>(iter: I) -> Self {
        LiveObjects {
            objects: iter.into_iter().collect(),
        }
    }
}

/// Why an object is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// No object of this instance by that name exists.
    Create,
    /// Git changed it since it was applied.
    Change,
    /// Someone changed it in the cluster; Git did not.
    Drift,
}

/// Everything the apply stage does for one app's objects, decided up front.
pub struct AppPlan<'a> {
    /// The app's resolved objects, as they will be applied.
    pub objects: Vec<Planned<'a>>,
    /// Indices into `objects` to write, and why.
    pub writes: Vec<(usize, Reason)>,
    /// Indices into `objects` already as Git wants them, with what health reads of each.
    pub unchanged: Vec<(usize, Value)>,
    /// Manifests of kinds that CRDs of this revision add: applied once those are established.
    pub pending: Vec<&'a Manifest>,
    /// None of the app's objects is gitcanary's yet: if the API server
    /// refuses one object, the others are taken back.
    pub fresh: bool,
    /// Objects that left Git, to delete (only with `--prune`).
    pub prunes: Vec<Deletion>,
    /// Adopted Namespaces that left Git: released (gitcanary's fields and
    /// labels removed), never deleted, by prune.
    pub releases: Vec<ObjectRelease>,
    /// Objects that left Git and stay in the inventory (not pruned, or not readable).
    pub kept: Vec<InventoryEntry>,
    /// Why some of `kept` could not be decided on.
    pub problems: Vec<Problem>,
}

/// An object to give back: gitcanary's fields removed, the object kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRelease {
    pub entry: InventoryEntry,
    /// The object observe found. The release is applied to it alone: an
    /// apply creates what is missing, and a Namespace deleted since must
    /// not come back.
    pub uid: String,
}

impl AppPlan<'_> {
    /// Drops the writes of live objects that the server, asked by a dry-run
    /// apply, would leave as they are: its own normalisation (`2000m` stored
    /// as `2`, defaults, dropped empty fields) is not drift.
    pub fn settle(&mut self, answers: &BTreeMap<usize, Value>, live: &LiveObjects) {
        let mut settled = Vec::new();
        self.writes.retain(|&(index, _)| {
            let item = &self.objects[index];
            match (live.get(&item.key), answers.get(&index)) {
                (Some(current), Some(answer)) if desired::applies_as_is(&current, answer, &item.desired) => {
                    settled.push((index, health_view(&current)));
                    false
                }
                _ => true,
            }
        });
        self.unchanged.extend(settled);
    }

    /// Writes of objects staged first (Namespaces, CRDs), then the others.
    pub fn staged_writes(&self) -> (Vec<usize>, Vec<usize>) {
        self.writes
            .iter()
            .map(|&(i, _)| i)
            .partition(|&i| self.objects[i].is_staged_first())
    }
}

/// Inventory entries of `previous` that none of the app's objects (resolved or
/// pending) names any more.
pub fn left_git(
    objects: &[Planned<'_>],
    pending: &[&Manifest],
    previous: &[InventoryEntry],
    default_namespace: &str,
) -> Vec<InventoryEntry> {
    let current: BTreeSet<ObjectKey> = objects.iter().map(|p| p.key.clone()).collect();
    previous
        .iter()
        .filter(|entry| {
            let key = entry.key();
            !current.contains(&key) && !pending.iter().any(|m| names_pending(m, &key, default_namespace))
        })
        .cloned()
        .collect()
}

/// A pending manifest's namespace is not resolved yet (its kind is not served):
/// one without a namespace names the entry in the default namespace or none.
fn names_pending(manifest: &Manifest, key: &ObjectKey, default_namespace: &str) -> bool {
    let same = manifest.group() == key.group && manifest.kind() == key.kind && manifest.name() == key.name;
    same && match manifest.namespace() {
        Some(ns) => key.namespace.as_deref() == Some(ns),
        None => key.namespace.as_deref().is_none_or(|ns| ns == default_namespace),
    }
}

/// The keys of every object a revision holds, across its apps, so that an
/// object that moved to another app in the same commit is never pruned by the
/// app it left, whichever app syncs first.
#[derive(Debug, Default)]
pub struct RevisionKeys {
    keys: std::collections::HashSet<ObjectKey>,
}

impl RevisionKeys {
    pub fn of<'a>(manifests: impl Iterator<Item = &'a Manifest>, default_namespace: &str) -> RevisionKeys {
        let mut keys = std::collections::HashSet::new();
        for manifest in manifests {
            let key = manifest.key();
            if key.namespace.is_none() {
                // Resolved later: the default namespace for a namespaced kind, none for a cluster-scoped one.
                keys.insert(ObjectKey {
                    namespace: Some(default_namespace.to_string()),
                    ..key.clone()
                });
            }
            keys.insert(key);
        }
        RevisionKeys { keys }
    }

    pub fn holds(&self, key: &ObjectKey) -> bool {
        self.keys.contains(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = &ObjectKey> {
        self.keys.iter()
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

impl Extend<ObjectKey> for RevisionKeys {
    fn extend<I: IntoIterator<Item = ObjectKey>>(&mut self, keys: I) {
        self.keys.extend(keys);
    }
}

/// What one app's plan is made from.
pub struct AppInputs<'a, 'o> {
    pub app: &'a str,
    pub objects: Vec<Planned<'a>>,
    pub pending: Vec<&'a Manifest>,
    pub live: &'o LiveObjects,
    /// The inventory the last sync recorded.
    pub previous: &'o [InventoryEntry],
    /// Why the recorded inventory could not be read, when it could not: then
    /// nothing is pruned, whatever `prune` says.
    pub unreadable_inventory: Option<&'o str>,
    /// What observe read of each entry that left Git (only with `--prune`).
    pub left_git: &'o BTreeMap<ObjectKey, LeftGit>,
    /// Every object the revision holds, in any app (see [`RevisionKeys`]).
    pub revision: &'o RevisionKeys,
    /// The app governs workloads with Rollouts.
    pub has_rollouts: bool,
    pub instance: &'o str,
    /// Where an object whose manifest names no namespace lands.
    pub default_namespace: &'o str,
    pub prune: bool,
}

/// The sync's rules for one app, as one pure decision.
pub fn plan_app<'a>(inputs: AppInputs<'a, '_>) -> AppPlan<'a> {
    let AppInputs {
        app,
        objects,
        pending,
        live,
        previous,
        left_git: observed,
        revision,
        unreadable_inventory,
        has_rollouts,
        instance,
        default_namespace,
        prune,
    } = inputs;
    let mut writes = Vec::new();
    let mut unchanged = Vec::new();
    for (index, item) in objects.iter().enumerate() {
        match live.get(&item.key) {
            Some(current) if is_subset(&item.desired, &current) => unchanged.push((index, health_view(&current))),
            Some(current) => {
                let same_hash = current["metadata"]["annotations"][APPLIED_HASH_ANNOTATION]
                    == item.desired["metadata"]["annotations"][APPLIED_HASH_ANNOTATION];
                writes.push((index, if same_hash { Reason::Drift } else { Reason::Change }));
            }
            None => writes.push((index, Reason::Create)),
        }
    }
    let fresh = previous.is_empty()
        && !has_rollouts
        && pending.is_empty()
        && objects
            .iter()
            .all(|p| !live.contains_key(&p.key) && p.manifest.kind() != "CustomResourceDefinition");

    let mut prunes = Vec::new();
    let mut releases = Vec::new();
    let mut kept = Vec::new();
    let mut problems = Vec::new();
    // Prune must never act on a forgotten inventory.
    let prune = prune && unreadable_inventory.is_none();
    if let Some(error) = unreadable_inventory {
        problems.push(Problem {
            file: app.to_string(),
            line: 0,
            message: format!(
                "the recorded inventory cannot be read ({error}): nothing is pruned for this app until its status ConfigMap is fixed or deleted"
            ),
        });
    }
    for entry in left_git(&objects, &pending, previous, default_namespace) {
        if !prune {
            kept.push(entry);
            continue;
        }
        match observed.get(&entry.key()) {
            None | Some(LeftGit::Gone) => {}
            Some(LeftGit::Unreadable(message)) => {
                problems.push(Problem {
                    file: app.to_string(),
                    line: 0,
                    message: format!("pruning {}: {message}", entry.key()),
                });
                kept.push(entry);
            }
            Some(LeftGit::Live(meta)) => {
                // Someone else owns it now, or it moved to another app in the
                // same commit (its source names that app's file): never delete.
                let ours = meta.managed_by.as_deref() == Some(instance);
                let moved =
                    revision.holds(&entry.key()) || meta.source.as_deref().is_some_and(|file| !belongs_to(file, app));
                if ours && !moved && entry.adopted && entry.kind == "Namespace" {
                    releases.push(ObjectRelease {
                        entry,
                        uid: meta.uid.clone(),
                    });
                } else if ours && !moved {
                    prunes.push(Deletion::of(&entry.api_version, entry.key(), meta));
                }
            }
        }
    }
    // Workloads first, then CRDs, then Namespaces.
    prunes.sort_by_key(|d| match d.key.kind.as_str() {
        "Namespace" => 2,
        "CustomResourceDefinition" => 1,
        _ => 0,
    });
    AppPlan {
        objects,
        writes,
        unchanged,
        pending,
        fresh,
        prunes,
        releases,
        kept,
        problems,
    }
}

/// Whether a `file:line` source annotation names a file of `app`.
pub fn belongs_to(source: &str, app: &str) -> bool {
    let file = source.rsplit_once(':').map_or(source, |(file, _)| file);
    match file.split_once('/') {
        Some((dir, _)) => dir == app,
        None => app == ROOT_APP,
    }
}

#[cfg(test)]
mod tests;
