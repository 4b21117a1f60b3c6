//! Which apps a burst of triggers concerns: a watch event concerns the app
//! whose Git holds the object (or the Rollout that owns it), a due requeue
//! the app that asked for it. Anything else (a new revision, a GitHub
//! decision, an object no app holds) concerns every app. Pure.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use kube::api::DynamicObject;

use super::Trigger;
use crate::manifest::{App, KeyIndex, Manifest, ManifestSet, ObjectKey, key_hash, key_hash_in};
use crate::source::Revision;

/// A watched object that changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub uid: String,
    pub version: String,
    pub key: ObjectKey,
    /// The Rollout that owns it (a canary object), if one does.
    pub rollout: Option<ObjectKey>,
}

impl Seen {
    /// What a watch event of `object` (of `group`/`kind`) names.
    pub(super) fn of(group: &str, kind: &str, object: &DynamicObject) -> Option<Seen> {
        let metadata = &object.metadata;
        let rollout = metadata
            .owner_references
            .iter()
            .flatten()
            .find(|owner| {
                owner.kind == crate::rollout::api::KIND && owner.api_version.split('/').next() == Some(crate::API_GROUP)
            })
            .map(|owner| ObjectKey {
                group: crate::API_GROUP.to_string(),
                kind: owner.kind.clone(),
                namespace: metadata.namespace.clone(),
                name: owner.name.clone(),
            });
        Some(Seen {
            uid: metadata.uid.clone()?,
            version: metadata.resource_version.clone()?,
            key: ObjectKey {
                group: group.to_string(),
                kind: kind.to_string(),
                namespace: metadata.namespace.clone(),
                name: metadata.name.clone()?,
            },
            rollout,
        })
    }
}

/// Which app holds each object of a revision: an index of the revision's
/// manifests by [`key_hash`] (no key copied: an app a load took over keeps
/// its hashes), each lookup checked against the manifest's own key.
pub(super) struct Owners {
    default_namespace: String,
    /// Each app's name, and whether it is valid (an invalid app holds nothing).
    apps: Vec<(String, bool)>,
    claims: KeyIndex<ObjectKey, Claim>,
}

impl Default for Owners {
    fn default() -> Self {
        Owners {
            default_namespace: String::new(),
            apps: Vec::new(),
            claims: KeyIndex::with_capacity(0),
        }
    }
}

/// An object key claimed by a manifest: its own, or (`defaulted`) with the
/// default namespace when the manifest names none.
struct Claim {
    /// Index into `Owners::apps`; `None` once a second app claims the key.
    app: Option<usize>,
    manifests: Arc<Vec<Manifest>>,
    index: usize,
    defaulted: bool,
}

impl Claim {
    fn manifest(&self) -> &Manifest {
        &self.manifests[self.index]
    }

    fn namespace<'a>(&'a self, default_namespace: &'a str) -> Option<&'a str> {
        if self.defaulted {
            Some(default_namespace)
        } else {
            self.manifest().namespace()
        }
    }

    fn is(&self, key: &ObjectKey, default_namespace: &str) -> bool {
        self.manifest().is_named(&key.group, &key.kind, &key.name)
            && key.namespace.as_deref() == self.namespace(default_namespace)
    }

    fn key(&self, default_namespace: &str) -> ObjectKey {
        ObjectKey {
            namespace: self.namespace(default_namespace).map(str::to_string),
            ..self.manifest().key()
        }
    }
}

impl Owners {
    /// The app that holds the object `key` names, if one alone does and it
    /// is valid.
    pub(super) fn get(&self, key: &ObjectKey) -> Option<&String> {
        let hash = key_hash(&key.group, &key.kind, key.namespace.as_deref(), &key.name);
        let claim = self
            .claims
            .get(hash, key, |claim, key| claim.is(key, &self.default_namespace))?;
        let (app, valid) = &self.apps[claim.app?];
        valid.then_some(app)
    }

    /// A key two apps claim is neither's.
    fn claim(&mut self, hash: u64, claim: Claim) {
        let default_namespace = self.default_namespace.as_str();
        let app = claim.app;
        let key_of = |claim: &Claim| claim.key(default_namespace);
        let first = self
            .claims
            .claim(hash, claim, key_of, |claim, key| claim.is(key, default_namespace));
        if let Some(first) = first
            && first.app != app
        {
            first.app = None;
        }
    }
}

/// Which app holds each object of a revision. An object whose manifest
/// names no namespace is found under `default_namespace` too. Only apps
/// without problems count, and a key two apps claim belongs to neither
/// (its events sync every app, or for a canary object its Rollout's app):
/// one app's manifests cannot make the events of another's objects look
/// elsewhere.
pub(super) fn owners(manifests: &ManifestSet, default_namespace: &str) -> Owners {
    let objects = manifests.apps.values().map(|app| app.manifests.len()).sum();
    let mut owners = Owners {
        default_namespace: default_namespace.to_string(),
        apps: Vec::with_capacity(manifests.apps.len()),
        claims: KeyIndex::with_capacity(objects),
    };
    for (app_index, app) in manifests.apps.values().enumerate() {
        owners.apps.push((app.name.clone(), app.problems.is_empty()));
        for (index, hash) in app.key_hashes().iter().enumerate() {
            let claim = |defaulted| Claim {
                app: Some(app_index),
                manifests: app.manifests.clone(),
                index,
                defaulted,
            };
            if !hash.names_namespace {
                owners.claim(key_hash_in(hash.name_hash, Some(default_namespace)), claim(true));
            }
            owners.claim(hash.hash, claim(false));
        }
    }
    owners
}

/// The apps `triggers` concern, or `None` for all of them.
#[cfg(test)]
pub(super) fn apps_of(triggers: &[&Trigger], owners: &Owners) -> Option<BTreeSet<String>> {
    apps_of_with(triggers, owners, None)
}

/// [`apps_of`], where a new revision loaded concerns the apps `changed`
/// (see [`changed_apps`]) when they are known, and all of them otherwise.
pub(super) fn apps_of_with(
    triggers: &[&Trigger],
    owners: &Owners,
    changed: Option<&BTreeSet<String>>,
) -> Option<BTreeSet<String>> {
    let mut apps = BTreeSet::new();
    for trigger in triggers {
        match trigger {
            Trigger::Loaded => apps.extend(changed?.iter().cloned()),
            Trigger::Due(due) => apps.extend(due.iter().map(|(app, _)| app.clone())),
            Trigger::WrittenBack(written) => apps.extend(written.iter().cloned()),
            // The app whose Git holds the object and the app of the Rollout
            // that owns it: each may need to act on it.
            Trigger::Drift(Some(seen)) | Trigger::Signal(Some(seen)) => {
                let holder = owners.get(&seen.key);
                let rollout = seen.rollout.as_ref().and_then(|rollout| owners.get(rollout));
                if holder.is_none() && rollout.is_none() {
                    return None;
                }
                apps.extend(holder.into_iter().chain(rollout).cloned());
            }
            _ => return None,
        }
    }
    Some(apps)
}

/// What each app of a revision is to a sync: a hash of its manifests,
/// the commit it is synced at and its problems.
pub(super) type AppPrints = HashMap<String, [u8; 32]>;

fn print_of(revision: &Revision, app: &App) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(app.digest());
    hasher.update(revision.commit_for(&app.name).as_bytes());
    for problem in &app.problems {
        hasher.update(problem.to_string().as_bytes());
        hasher.update([0]);
    }
    hasher.finalize().into()
}

/// Every app of `revision`, printed.
pub(super) fn app_prints(revision: &Revision) -> AppPrints {
    let apps = revision.manifests.apps.values();
    apps.map(|app| (app.name.clone(), print_of(revision, app))).collect()
}

/// The prints of `synced` brought to `revision` for the apps `changed`.
pub(super) fn reprint(mut synced: AppPrints, revision: &Revision, changed: &BTreeSet<String>) -> AppPrints {
    for name in changed {
        match revision.manifests.apps.get(name) {
            Some(app) => synced.insert(name.clone(), print_of(revision, app)),
            None => synced.remove(name),
        };
    }
    synced
}

/// The apps a newly loaded `revision` changed since the one whose every app
/// was last synced in order (`synced`: its commit and prints): new ones,
/// changed ones (manifests, commit or problems) and the ones it no longer
/// holds. The others were synced from the same manifests, and what moved
/// in the cluster since has woken their own syncs. `None` for the same
/// commit (a poll of an unchanged source looks at every app, as always).
pub(super) fn changed_apps(synced: &(String, AppPrints), revision: &Revision) -> Option<BTreeSet<String>> {
    let (commit, prints) = synced;
    if *commit == revision.commit {
        return None;
    }
    let apps = &revision.manifests.apps;
    let mut changed: BTreeSet<String> = apps
        .values()
        .filter(|app| prints.get(&app.name) != Some(&print_of(revision, app)))
        .map(|app| app.name.clone())
        .collect();
    changed.extend(prints.keys().filter(|name| !apps.contains_key(*name)).cloned());
    Some(changed)
}

/// With a new revision loaded among `news`, the apps it changed since
/// `settled` ([`changed_apps`]); `None` (every app) otherwise, and while a
/// write-back waits to be recorded in its Rollout's status: its commit
/// changes no app's files, and every app's sync is where it is recorded.
pub(super) fn changed_by_load(
    news: &[&Trigger],
    settled: Option<&(String, AppPrints)>,
    revision: &Revision,
    writing_back: bool,
) -> Option<BTreeSet<String>> {
    let loaded = news.iter().any(|t| matches!(t, Trigger::Loaded));
    changed_apps(settled.filter(|_| loaded && !writing_back)?, revision)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kind: &str, namespace: Option<&str>, name: &str) -> ObjectKey {
        ObjectKey {
            group: if kind == "Rollout" {
                crate::API_GROUP.into()
            } else {
                String::new()
            },
            kind: kind.into(),
            namespace: namespace.map(Into::into),
            name: name.into(),
        }
    }

    fn seen(key: ObjectKey) -> Seen {
        Seen {
            uid: "u".into(),
            version: "1".into(),
            key,
            rollout: None,
        }
    }

    /// The owners of a revision whose apps hold these objects.
    fn owners_of(held: &[(ObjectKey, &str)]) -> Owners {
        let mut set = ManifestSet::default();
        for (key, app) in held {
            let api_version = if key.group.is_empty() {
                "v1".to_string()
            } else {
                format!("{}/v1", key.group)
            };
            let mut object =
                serde_json::json!({"apiVersion": api_version, "kind": key.kind, "metadata": {"name": key.name}});
            if let Some(namespace) = &key.namespace {
                object["metadata"]["namespace"] = namespace.as_str().into();
            }
            let entry = set.apps.entry(app.to_string()).or_insert_with(|| crate::manifest::App {
                name: app.to_string(),
                ..crate::manifest::App::default()
            });
            let file = format!("{app}/x.yaml");
            std::sync::Arc::make_mut(&mut entry.manifests).push(Manifest {
                app: app.to_string(),
                file,
                line: 1,
                object,
            });
        }
        super::owners(&set, "default")
    }

    fn set(apps: &[(&str, &str, &str)]) -> ManifestSet {
        let mut set = ManifestSet::default();
        for (app, kind, name) in apps {
            let manifest = crate::manifest::Manifest {
                app: app.to_string(),
                file: format!("{app}/x.yaml"),
                line: 1,
                object: serde_json::json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": name}}),
            };
            let entry = set.apps.entry(app.to_string()).or_insert_with(|| crate::manifest::App {
                name: app.to_string(),
                ..crate::manifest::App::default()
            });
            std::sync::Arc::make_mut(&mut entry.manifests).push(manifest);
        }
        set
    }

    #[test]
    fn a_new_revision_concerns_the_apps_it_changed_and_an_unchanged_commit_concerns_all() {
        let first = Revision::new(
            "c1".into(),
            set(&[
                ("web", "ConfigMap", "a"),
                ("api", "ConfigMap", "b"),
                ("old", "ConfigMap", "c"),
            ]),
        );
        let synced = ("c1".to_string(), app_prints(&first));
        // Each app is synced at the commit that last changed it.
        assert_eq!(changed_apps(&synced, &first), None, "the same commit: every app");
        let mut second = Revision::new(
            "c2".into(),
            set(&[
                ("web", "ConfigMap", "a2"),
                ("api", "ConfigMap", "b"),
                ("new", "ConfigMap", "d"),
            ]),
        );
        second.app_commits = [("api", "c1"), ("web", "c2"), ("new", "c2")]
            .map(|(app, commit)| (app.to_string(), commit.to_string()))
            .into();
        let names = |apps: &[&str]| apps.iter().map(|a| a.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(
            changed_apps(&synced, &second),
            Some(names(&["new", "old", "web"])),
            "changed, new and gone; api is as it was"
        );
        // A problem found in an app that did not change (another's duplicate), or a commit of its own.
        let api = second.manifests.apps.get_mut("api").expect("api");
        api.problems.push(crate::manifest::Problem {
            file: "api/x.yaml".into(),
            line: 1,
            message: "duplicate".into(),
        });
        assert!(changed_apps(&synced, &second).expect("changed").contains("api"));
        second.manifests.apps.get_mut("api").expect("api").problems.clear();
        second.app_commits.insert("api".into(), "c2".into());
        assert!(changed_apps(&synced, &second).expect("changed").contains("api"));

        // Brought to the second revision, only what changed since is new.
        let changed = changed_apps(&synced, &second).expect("changed");
        let synced = ("c2".to_string(), reprint(synced.1, &second, &changed));
        assert_eq!(synced.1, app_prints(&second));
        let loaded = Trigger::Loaded;
        let drift = Trigger::Drift(Some(seen(key("ConfigMap", Some("web"), "settings"))));
        let owners = owners_of(&[(key("ConfigMap", Some("web"), "settings"), "web")]);
        assert_eq!(
            apps_of_with(&[&loaded, &drift], &owners, Some(&names(&["api"]))),
            Some(names(&["api", "web"]))
        );
        assert_eq!(apps_of_with(&[&loaded], &owners, None), None, "not known: every app");

        let third = Revision::new("c3".into(), second.manifests.clone());
        assert!(changed_by_load(&[&loaded], Some(&synced), &third, false).is_some());
        assert_eq!(
            changed_by_load(&[&loaded], Some(&synced), &third, true),
            None,
            "a write-back to record: every app"
        );
        assert_eq!(
            changed_by_load(&[&drift], Some(&synced), &third, false),
            None,
            "nothing loaded"
        );
        assert_eq!(
            changed_by_load(&[&loaded], None, &third, false),
            None,
            "nothing settled"
        );
    }

    #[test]
    fn an_event_concerns_the_app_that_holds_the_object_and_nothing_else_concerns_all() {
        let owners = owners_of(&[
            (key("ConfigMap", Some("web"), "settings"), "web"),
            (key("Rollout", Some("shop"), "shop"), "shop"),
        ]);
        let drift = Trigger::Drift(Some(seen(key("ConfigMap", Some("web"), "settings"))));
        let signal = Trigger::Signal(Some(seen(key("Rollout", Some("shop"), "shop"))));
        let due = Trigger::Due(vec![(
            "billing".to_string(),
            crate::rollout::plan::RequeueReason::Pause,
        )]);
        let apps = apps_of(&[&drift, &signal, &due], &owners).expect("scoped");
        assert_eq!(apps.into_iter().collect::<Vec<_>>(), vec!["billing", "shop", "web"]);

        let unknown = Trigger::Drift(Some(seen(key("ConfigMap", Some("web"), "nobody's"))));
        assert_eq!(
            apps_of(&[&drift, &unknown], &owners),
            None,
            "an object no app holds: all"
        );
        for everything in [
            Trigger::Loaded,
            Trigger::Decided,
            Trigger::Drift(None),
            Trigger::Signal(None),
        ] {
            assert_eq!(apps_of(&[&drift, &everything], &owners), None, "{everything:?}");
        }
    }

    #[test]
    fn a_canary_object_concerns_its_rollouts_app_and_the_app_whose_git_holds_it_and_a_manifest_without_namespace_is_found_in_the_default()
     {
        let object: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "shop-canary", "namespace": "shop", "uid": "u1", "resourceVersion": "9",
                "ownerReferences": [{"apiVersion": "gitcanary.io/v1alpha1", "kind": "Rollout", "name": "shop", "uid": "r"}]}
        }))
        .expect("an object");
        let canary = Seen::of("apps", "Deployment", &object).expect("seen");
        assert_eq!(canary.rollout, Some(key("Rollout", Some("shop"), "shop")));
        let rollout = (key("Rollout", Some("shop"), "shop"), "shop");
        let owners = owners_of(std::slice::from_ref(&rollout));
        let trigger = Trigger::Drift(Some(canary.clone()));
        assert_eq!(
            apps_of(&[&trigger], &owners),
            Some(["shop".to_string()].into_iter().collect())
        );
        // An object Git holds is its app's too, whatever owns it.
        let mut in_git = canary.key.clone();
        in_git.group = "apps".into();
        let owners = owners_of(&[rollout, (in_git, "platform")]);
        assert_eq!(
            apps_of(&[&trigger], &owners),
            Some(["platform".to_string(), "shop".to_string()].into_iter().collect())
        );

        let owners = super::owners(&set(&[("web", "ConfigMap", "settings")]), "team");
        assert_eq!(
            owners
                .get(&key("ConfigMap", Some("team"), "settings"))
                .map(String::as_str),
            Some("web")
        );
    }

    #[test]
    fn keys_that_share_a_hash_keep_their_own_apps() {
        let held = set(&[
            ("web", "ConfigMap", "settings"),
            ("api", "ConfigMap", "limits"),
            ("zz-copycat", "ConfigMap", "limits"),
        ]);
        let settings = key("ConfigMap", Some("default"), "settings");
        let limits = key("ConfigMap", Some("default"), "limits");
        let mut owners = Owners {
            default_namespace: "default".into(),
            apps: vec![("web".into(), true), ("api".into(), true), ("zz-copycat".into(), true)],
            ..Owners::default()
        };
        // All three claims under the hash of the first key: what two keys
        // that share a hash look like.
        let shared = key_hash("", "ConfigMap", Some("default"), "settings");
        for (app_index, app) in ["web", "api"].into_iter().enumerate() {
            let claim = Claim {
                app: Some(app_index),
                manifests: held.apps[app].manifests.clone(),
                index: 0,
                defaulted: true,
            };
            owners.claim(shared, claim);
        }
        assert_eq!(owners.get(&settings).map(String::as_str), Some("web"));
        assert_eq!(owners.get(&limits).map(String::as_str), Some("api"));
        assert_eq!(owners.get(&key("ConfigMap", Some("default"), "other")), None);
        let copycat = Claim {
            app: Some(2),
            manifests: held.apps["zz-copycat"].manifests.clone(),
            index: 0,
            defaulted: true,
        };
        owners.claim(shared, copycat);
        assert_eq!(owners.get(&limits), None, "claimed twice: nobody's");
        assert_eq!(owners.get(&settings).map(String::as_str), Some("web"));
    }

    #[test]
    fn a_key_two_apps_claim_or_an_invalid_apps_key_is_nobodys() {
        let mut set = set(&[
            ("victim", "ConfigMap", "settings"),
            ("zz-copycat", "ConfigMap", "settings"),
            ("web", "ConfigMap", "web"),
            ("broken", "ConfigMap", "broken"),
        ]);
        set.apps
            .get_mut("broken")
            .expect("app")
            .problems
            .push(crate::manifest::Problem {
                file: "broken/x.yaml".into(),
                line: 1,
                message: "invalid".into(),
            });
        let owners = super::owners(&set, "default");
        assert_eq!(
            owners.get(&key("ConfigMap", None, "settings")),
            None,
            "claimed twice: every app syncs"
        );
        assert_eq!(owners.get(&key("ConfigMap", Some("default"), "settings")), None);
        assert_eq!(owners.get(&key("ConfigMap", None, "broken")), None);
        assert_eq!(
            owners.get(&key("ConfigMap", None, "web")).map(String::as_str),
            Some("web")
        );
    }
}
