//! Which apps a burst of triggers concerns: a watch event concerns the app
//! whose Git holds the object (or the Rollout that owns it), a due requeue
//! the app that asked for it. Anything else (a new revision, a GitHub
//! decision, an object no app holds) concerns every app. Pure.

use std::collections::{BTreeSet, HashMap};

use kube::api::DynamicObject;

use super::Trigger;
use crate::manifest::{ManifestSet, ObjectKey};

/// A watched object that changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub uid: String,
    pub version: String,
    /// The object's key, or the key of the Rollout that owns it (a canary object).
    pub key: ObjectKey,
}

impl Seen {
    /// What a watch event of `object` (of `group`/`kind`) names.
    pub(super) fn of(group: &str, kind: &str, object: &DynamicObject) -> Option<Seen> {
        let metadata = &object.metadata;
        let rollout_owner = metadata.owner_references.iter().flatten().find(|owner| {
            owner.kind == crate::rollout::api::KIND && owner.api_version.split('/').next() == Some(crate::API_GROUP)
        });
        let key = match rollout_owner {
            Some(owner) => ObjectKey {
                group: crate::API_GROUP.to_string(),
                kind: owner.kind.clone(),
                namespace: metadata.namespace.clone(),
                name: owner.name.clone(),
            },
            None => ObjectKey {
                group: group.to_string(),
                kind: kind.to_string(),
                namespace: metadata.namespace.clone(),
                name: metadata.name.clone()?,
            },
        };
        Some(Seen {
            uid: metadata.uid.clone()?,
            version: metadata.resource_version.clone()?,
            key,
        })
    }
}

/// Which app holds each object of a revision.
pub(super) type Owners = HashMap<ObjectKey, String>;

/// Which app holds each object of a revision. An object whose manifest
/// names no namespace is found under `default_namespace` too.
pub(super) fn owners(manifests: &ManifestSet, default_namespace: &str) -> HashMap<ObjectKey, String> {
    let mut owners = HashMap::new();
    for app in manifests.apps.values() {
        for manifest in &app.manifests {
            let key = manifest.key();
            if key.namespace.is_none() {
                let defaulted = ObjectKey {
                    namespace: Some(default_namespace.to_string()),
                    ..key.clone()
                };
                owners.insert(defaulted, app.name.clone());
            }
            owners.insert(key, app.name.clone());
        }
    }
    owners
}

/// The apps `triggers` concern, or `None` for all of them.
pub(super) fn apps_of(triggers: &[&Trigger], owners: &HashMap<ObjectKey, String>) -> Option<BTreeSet<String>> {
    let mut apps = BTreeSet::new();
    for trigger in triggers {
        match trigger {
            Trigger::Due(due) => apps.extend(due.iter().cloned()),
            Trigger::Drift(Some(seen)) | Trigger::Signal(Some(seen)) => {
                apps.insert(owners.get(&seen.key)?.clone());
            }
            _ => return None,
        }
    }
    Some(apps)
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
        }
    }

    #[test]
    fn an_event_concerns_the_app_that_holds_the_object_and_nothing_else_concerns_all() {
        let owners: HashMap<ObjectKey, String> = [
            (key("ConfigMap", Some("web"), "settings"), "web".to_string()),
            (key("Rollout", Some("shop"), "shop"), "shop".to_string()),
        ]
        .into_iter()
        .collect();
        let drift = Trigger::Drift(Some(seen(key("ConfigMap", Some("web"), "settings"))));
        let signal = Trigger::Signal(Some(seen(key("Rollout", Some("shop"), "shop"))));
        let due = Trigger::Due(["billing".to_string()].into_iter().collect());
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
    fn a_canary_object_is_its_rollouts_and_a_manifest_without_namespace_is_found_in_the_default() {
        let object: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "shop-canary", "namespace": "shop", "uid": "u1", "resourceVersion": "9",
                "ownerReferences": [{"apiVersion": "gitcanary.io/v1alpha1", "kind": "Rollout", "name": "shop", "uid": "r"}]}
        }))
        .expect("an object");
        let seen = Seen::of("apps", "Deployment", &object).expect("seen");
        assert_eq!(seen.key, key("Rollout", Some("shop"), "shop"));

        let manifest = crate::manifest::Manifest {
            app: "web".into(),
            file: "web/cm.yaml".into(),
            line: 1,
            object: serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}}),
        };
        let app = crate::manifest::App {
            name: "web".into(),
            manifests: vec![manifest],
            ..crate::manifest::App::default()
        };
        let set = ManifestSet {
            apps: [("web".to_string(), app)].into_iter().collect(),
        };
        let owners = owners(&set, "team");
        assert_eq!(
            owners
                .get(&key("ConfigMap", Some("team"), "settings"))
                .map(String::as_str),
            Some("web")
        );
    }
}
