//! `gitcanary diff` is the next sync's plan run dry: every object it lists
//! is one the sync then writes or deletes, and the sync touches nothing it
//! did not list.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use gitcanary::cluster::{Change, ObjectDiff};
use gitcanary::manifest::Problem;
use gitcanary::sync::{AppResult, SyncReport, diff, sync};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

fn configmap(ns: &str, name: &str, color: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  color: {color}\n")
}

/// The shared fixture, with `diff` and `sync` as these tests call them (always with prune).
struct Fixture(support::library::Fixture);

impl std::ops::Deref for Fixture {
    type Target = support::library::Fixture;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// What a diff or a sync changes: (kind, name) written, and deleted.
#[derive(Debug, PartialEq, Eq)]
struct Changes {
    written: BTreeSet<(String, String)>,
    deleted: BTreeSet<(String, String)>,
}

fn listed(diffs: &[ObjectDiff]) -> Changes {
    let names = |deleting: bool| {
        diffs
            .iter()
            .filter(|d| (d.change == Change::Delete) == deleting)
            .map(|d| (d.key.kind.clone(), d.key.name.clone()))
            .collect()
    };
    Changes {
        written: names(false),
        deleted: names(true),
    }
}

fn made(report: &SyncReport) -> Changes {
    let pairs = |keys: Vec<&gitcanary::manifest::ObjectKey>| {
        keys.into_iter().map(|k| (k.kind.clone(), k.name.clone())).collect()
    };
    Changes {
        written: pairs(
            report
                .apps
                .iter()
                .flat_map(|a| a.applied.iter().chain(&a.canary_applied).chain(&a.released))
                .collect(),
        ),
        deleted: pairs(
            report
                .apps
                .iter()
                .flat_map(|a| a.pruned.iter().chain(a.canary_deleted.iter()))
                .collect(),
        ),
    }
}

fn set(items: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    items.iter().map(|(k, n)| (k.to_string(), n.to_string())).collect()
}

impl Fixture {
    async fn new(prefix: &str) -> Fixture {
        Fixture(support::library::Fixture::with_rollouts(prefix).await)
    }

    async fn sync(&self) -> SyncReport {
        sync(&self.cluster, &self.revision().await, &self.options(true))
            .await
            .expect("sync runs")
    }

    async fn diff(&self) -> (Vec<ObjectDiff>, Vec<Problem>) {
        let (diffs, problems, _) = diff(&self.cluster, &self.revision().await, &self.options(true))
            .await
            .expect("diff runs");
        (diffs, problems)
    }

    /// `diff --prune`, then `sync --once --prune`: both must name the same objects.
    async fn diff_then_sync(&self) -> (Changes, SyncReport) {
        let (diffs, _) = self.diff().await;
        let listed = listed(&diffs);
        let report = self.sync().await;
        assert_eq!(made(&report), listed, "the sync did other than the diff listed");
        (listed, report)
    }

    async fn create_by_hand(&self, name: &str, color: &str) {
        let object: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": self.ns}, "data": {"color": color}
        }))
        .expect("a ConfigMap");
        let params = PostParams {
            field_manager: Some("kubectl-create".into()),
            ..PostParams::default()
        };
        self.configmaps()
            .create(&params, &object)
            .await
            .expect("created by hand");
    }
}

#[tokio::test]
async fn diff_lists_exactly_what_the_next_sync_writes_or_deletes() {
    let f = Fixture::new("diff-plain").await;
    let ns = f.ns.clone();
    for name in ["changed", "drifted", "moved", "removed", "recreated"] {
        f.repo.write(&format!("web/{name}.yaml"), &configmap(&ns, name, "blue"));
    }
    f.repo.write("api/steady.yaml", &configmap(&ns, "steady", "blue"));
    f.repo.commit_and_push("first");
    assert!(f.sync().await.is_clean());

    // A change in Git.
    f.repo.write("web/changed.yaml", &configmap(&ns, "changed", "red"));
    // Drift: an edit in the cluster.
    let edit = serde_json::json!({"data": {"color": "green"}});
    f.configmaps()
        .patch("drifted", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .expect("edited");
    // An object moved to another app in the same commit.
    f.repo.remove("web/moved.yaml");
    f.repo.write("api/moved.yaml", &configmap(&ns, "moved", "blue"));
    // A file removed, with --prune.
    f.repo.remove("web/removed.yaml");
    // Still in the inventory, but now someone's own object: deleted and made again by hand.
    f.repo.remove("web/recreated.yaml");
    f.configmaps()
        .delete("recreated", &DeleteParams::default())
        .await
        .expect("deleted");
    f.create_by_hand("recreated", "theirs").await;
    // A new object whose name someone else's object already has, in an app of its own.
    f.create_by_hand("taken", "theirs").await;
    f.repo.write("other/taken.yaml", &configmap(&ns, "taken", "ours"));
    f.repo.commit_and_push("every kind of change");

    let (diffs, problems) = f.diff().await;
    assert_eq!(
        listed(&diffs),
        Changes {
            written: set(&[
                ("ConfigMap", "changed"),
                ("ConfigMap", "drifted"),
                ("ConfigMap", "moved")
            ]),
            deleted: set(&[("ConfigMap", "removed")]),
        }
    );
    assert!(
        problems
            .iter()
            .any(|p| p.file == "other/taken.yaml" && p.message.contains("conflict")),
        "{problems:?}"
    );

    let report = f.sync().await;
    assert_eq!(made(&report), listed(&diffs));
    assert_eq!(report.app("other").expect("other").result, AppResult::Invalid);
    assert_eq!(f.color("changed").await.as_deref(), Some("red"));
    assert_eq!(f.color("drifted").await.as_deref(), Some("blue"));
    assert_eq!(f.color("moved").await.as_deref(), Some("blue"));
    assert_eq!(f.color("removed").await, None);
    assert_eq!(f.color("recreated").await.as_deref(), Some("theirs"));
    assert_eq!(f.color("taken").await.as_deref(), Some("theirs"));

    // And once synced, neither has anything to do.
    let (nothing, _) = f.diff_then_sync().await;
    assert!(nothing.written.is_empty() && nothing.deleted.is_empty(), "{nothing:?}");
}

#[tokio::test]
async fn diff_lists_the_canary_objects_of_a_release_mid_step() {
    let f = Fixture::new("diff-release").await;
    let steps = "  strategy:\n    canary:\n      trafficRoutings: [{service: echo, gateway: {httpRouteName: echo}}]\n      steps:\n      - {traffic: 20%, replicas: 1, pause: {}}\n      - {traffic: 100%}\n";
    support::agent::write_echo_app(&f.repo, &f.ns, "1.0", steps);
    f.repo.commit_and_push("echo 1.0");
    let deployments: Api<Deployment> = Api::namespaced(f.client.clone(), &f.ns);
    support::eventually(
        "echo 1.0 is synced and available",
        Duration::from_secs(60),
        async || {
            let report = f.sync().await;
            (report.is_clean() && report.app("echo").is_some_and(|a| a.health == "Healthy")).then_some(())
        },
    )
    .await;

    // A push starts the release: the stable Deployment (it keeps 1.0, now
    // recorded as the stable template) and the stable Service pinned to its
    // pods; the canary Deployment only once the pin is live, so that its pods
    // never take a request through the stable Service.
    support::agent::write_echo_app(&f.repo, &f.ns, "2.0", steps);
    f.repo.commit_and_push("echo 2.0");
    let (started, _) = f.diff_then_sync().await;
    assert_eq!(started.written, set(&[("Deployment", "echo"), ("Service", "echo")]));
    assert!(started.deleted.is_empty());
    let (canary, _) = f.diff_then_sync().await;
    assert_eq!(canary.written, set(&[("Deployment", "echo-canary")]));
    assert!(canary.deleted.is_empty());

    // Once the canary pod is ready, traffic moves: the canary Service and the routes.
    support::eventually("the canary pod is ready", Duration::from_secs(60), async || {
        let canary = deployments.get_opt("echo-canary").await.ok()??;
        (canary.status?.available_replicas? >= 1).then_some(())
    })
    .await;
    let (routed, _) = f.diff_then_sync().await;
    assert!(
        routed
            .written
            .contains(&("Service".to_string(), "echo-canary".to_string())),
        "{routed:?}"
    );
    assert!(
        routed.written.contains(&("HTTPRoute".to_string(), "echo".to_string())),
        "{routed:?}"
    );

    // An abort while the release waits: the route goes back first; once no
    // route sends to the canary, its objects go. Diff said so before each.
    gitcanary::rollout::cli::send_signal(&f.cluster, &f.ns, "echo", gitcanary::rollout::cli::Signal::Abort)
        .await
        .expect("abort requested");
    let (aborted, _) = f.diff_then_sync().await;
    assert!(
        aborted.written.contains(&("HTTPRoute".to_string(), "echo".to_string())),
        "{aborted:?}"
    );
    assert!(aborted.deleted.is_empty(), "{aborted:?}");
    let (removed, _) = f.diff_then_sync().await;
    assert_eq!(
        removed.deleted,
        set(&[("Deployment", "echo-canary"), ("Service", "echo-canary")]),
        "{removed:?}"
    );
}

#[tokio::test]
async fn diff_of_a_secret_changed_in_git_shows_no_value() {
    let f = Fixture::new("diff-secret").await;
    let ns = f.ns.clone();
    let secret = |value: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\n  namespace: {ns}\nstringData:\n  password: {value}\n  user: admin-user-kept\n"
        )
    };
    f.repo.write("web/creds.yaml", &secret("old-password-value"));
    f.repo.commit_and_push("a secret");
    assert!(f.sync().await.is_clean());

    f.repo.write("web/creds.yaml", &secret("new-password-value"));
    f.repo.commit_and_push("the password changes");
    let (diffs, problems) = f.diff().await;
    assert!(problems.is_empty(), "{problems:?}");
    let text = gitcanary::cluster::render_diff(&diffs, false);
    assert!(text.contains("update Secret"), "{text}");
    for value in ["old-password-value", "new-password-value", "admin-user-kept"] {
        let base64 = base64_of(value);
        assert!(
            !text.contains(value) && !text.contains(&base64),
            "{value} shown:\n{text}"
        );
    }
    assert!(text.contains("*** (before)") && text.contains("*** (after)"), "{text}");
}

fn base64_of(value: &str) -> String {
    use k8s_openapi::ByteString;
    serde_json::to_value(ByteString(value.as_bytes().to_vec()))
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[tokio::test]
async fn diff_meets_the_adoption_rule_and_lists_nothing_of_an_app_the_sync_would_refuse() {
    let f = Fixture::new("diff-adopt").await;
    let ns = f.ns.clone();
    f.repo.write("web/own.yaml", &configmap(&ns, "own", "blue"));
    f.repo.commit_and_push("first");
    assert!(f.sync().await.is_clean());

    // Someone's own object, exactly as Git now has it: a dry-run apply
    // meets no conflict, but the sync may not take it over.
    f.create_by_hand("theirs", "blue").await;
    f.repo.write("web/theirs.yaml", &configmap(&ns, "theirs", "blue"));
    f.repo.write("web/own.yaml", &configmap(&ns, "own", "red"));
    f.repo
        .commit_and_push("someone's object in Git, and a change beside it");

    let (diffs, problems) = f.diff().await;
    assert!(
        diffs.is_empty(),
        "the sync writes nothing of the app: {:?}",
        listed(&diffs)
    );
    assert!(
        problems
            .iter()
            .any(|p| p.file == "web/theirs.yaml" && p.message.contains("does not manage it")),
        "{problems:?}"
    );
    let report = f.sync().await;
    assert_eq!(made(&report), listed(&diffs));
    assert_eq!(report.app("web").expect("web").result, AppResult::Invalid);
    assert_eq!(f.color("own").await.as_deref(), Some("blue"));
}

/// A ServiceAccount that may write ConfigMaps in `ns` but not delete them.
async fn tenant_without_delete(client: &kube::Client, ns: &str) -> gitcanary::model::ServiceAccountRef {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let create = PostParams::default();
    let account = serde_json::from_value(serde_json::json!({"metadata": {"name": "keeper"}})).expect("an account");
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    accounts.create(&create, &account).await.expect("account");
    let role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "keeper"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                   "verbs": ["get", "list", "watch", "create", "update", "patch"]}]
    }))
    .expect("a Role");
    let roles: Api<Role> = Api::namespaced(client.clone(), ns);
    roles.create(&create, &role).await.expect("role");
    let binding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "keeper"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "keeper"},
        "subjects": [{"kind": "ServiceAccount", "name": "keeper", "namespace": ns}]
    }))
    .expect("a RoleBinding");
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
    bindings.create(&create, &binding).await.expect("binding");
    gitcanary::model::ServiceAccountRef {
        namespace: ns.to_string(),
        name: "keeper".to_string(),
    }
}

#[tokio::test]
async fn diff_runs_each_delete_dry_and_shows_the_refusal_the_prune_would_meet() {
    let f = Fixture::new("diff-delete").await;
    let ns = f.ns.clone();
    let mut options = f.options(true);
    options
        .tenants
        .insert("web".to_string(), tenant_without_delete(&f.client, &ns).await);
    f.repo.write("web/kept.yaml", &configmap(&ns, "kept", "blue"));
    f.repo.write("web/left.yaml", &configmap(&ns, "left", "blue"));
    f.repo.commit_and_push("first");
    let revision = f.revision().await;
    assert!(
        sync(&f.cluster, &revision, &options)
            .await
            .expect("sync runs")
            .is_clean()
    );

    f.repo.remove("web/left.yaml");
    f.repo.commit_and_push("left leaves Git");
    let revision = f.revision().await;
    let (diffs, problems, _) = diff(&f.cluster, &revision, &options).await.expect("diff runs");
    assert!(listed(&diffs).deleted.is_empty(), "{:?}", listed(&diffs));
    assert!(
        problems
            .iter()
            .any(|p| p.message.contains("deleting ConfigMap") && p.message.contains("forbidden")),
        "{problems:?}"
    );
    let report = sync(&f.cluster, &revision, &options).await.expect("sync runs");
    assert_eq!(made(&report), listed(&diffs));
    assert_eq!(report.app("web").expect("web").result, AppResult::Failed);
    assert_eq!(f.color("left").await.as_deref(), Some("blue"));
}

#[tokio::test]
async fn diff_lists_what_an_app_that_left_git_would_have_pruned() {
    let f = Fixture::new("diff-gone").await;
    let ns = f.ns.clone();
    f.repo.write("web/kept.yaml", &configmap(&ns, "kept", "blue"));
    f.repo.write("gone/left.yaml", &configmap(&ns, "left", "blue"));
    f.repo.commit_and_push("two apps");
    assert!(f.sync().await.is_clean());
    f.repo.remove("gone/left.yaml");
    f.repo.commit_and_push("app gone leaves Git");
    let (listed, _) = f.diff_then_sync().await;
    assert_eq!(
        listed,
        Changes {
            written: BTreeSet::new(),
            deleted: set(&[("ConfigMap", "left")]),
        }
    );
    assert_eq!(f.color("left").await, None);
    assert_eq!(f.color("kept").await.as_deref(), Some("blue"));
}
