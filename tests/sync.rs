//! Git to cluster: sync, skip unchanged, prune, validation that protects
//! the cluster, server-side dry-run errors with file and line.

mod support;

use std::time::Duration;

use gitcanary::cluster::AppStatus;
use gitcanary::sync::{AppResult, SyncOptions, SyncReport, sync};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};

fn configmap(ns: &str, name: &str, color: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  color: {color}\n")
}

fn deployment(ns: &str, name: &str, replicas: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  replicas: {replicas}\n  selector:\n    matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n    spec:\n      containers:\n      - name: app\n        image: registry.test/{name}:1\n"
    )
}

/// The shared fixture, with `sync` as these tests call it.
struct Fixture(support::library::Fixture);

impl std::ops::Deref for Fixture {
    type Target = support::library::Fixture;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Fixture {
    async fn new(prefix: &str) -> Fixture {
        Fixture(support::library::Fixture::new(prefix).await)
    }

    async fn sync(&self, prune: bool) -> SyncReport {
        sync(&self.cluster, &self.revision().await, &self.options(prune))
            .await
            .expect("sync runs")
    }

    async fn resource_version(&self, name: &str) -> String {
        self.configmaps()
            .get(name)
            .await
            .expect("exists")
            .metadata
            .resource_version
            .expect("has a version")
    }
}

fn applied_names(report: &SyncReport, app: &str) -> Vec<String> {
    let mut names: Vec<String> = report
        .app(app)
        .expect("app reported")
        .applied
        .iter()
        .map(|k| k.name.clone())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn two_apps_sync_and_a_change_reapplies_only_that_object() {
    let f = Fixture::new("sync-two").await;
    f.repo
        .write("a/one.yaml", &configmap(&f.ns, "a1", "blue"))
        .write("a/two.yaml", &configmap(&f.ns, "a2", "blue"))
        .write(
            "b/web.yaml",
            &format!(
                "{}---\n{}",
                configmap(&f.ns, "b1", "red"),
                deployment(&f.ns, "web", "2")
            ),
        );
    let first_commit = f.repo.commit_and_push("two apps");

    let first = f.sync(false).await;
    assert!(first.is_clean(), "{:?}", first.problems().collect::<Vec<_>>());
    assert_eq!(applied_names(&first, "a"), vec!["a1", "a2"]);
    assert_eq!(applied_names(&first, "b"), vec!["b1", "web"]);
    assert_eq!(f.color("a1").await.as_deref(), Some("blue"));

    // Nothing changed in Git: nothing is written, not even the status.
    let versions = (
        f.resource_version("a1").await,
        f.resource_version(&format!("test-{}-app-a", f.ns)).await,
    );
    let again = f.sync(false).await;
    assert!(
        applied_names(&again, "a").is_empty() && applied_names(&again, "b").is_empty(),
        "{:?} {:?}",
        applied_names(&again, "a"),
        applied_names(&again, "b")
    );
    assert_eq!(again.app("a").expect("a").unchanged, 2);
    assert_eq!(
        versions,
        (
            f.resource_version("a1").await,
            f.resource_version(&format!("test-{}-app-a", f.ns)).await
        )
    );

    f.repo.write("a/one.yaml", &configmap(&f.ns, "a1", "green"));
    let second_commit = f.repo.commit_and_push("a1 goes green");
    let third = f.sync(false).await;
    assert_eq!(applied_names(&third, "a"), vec!["a1"]);
    assert!(applied_names(&third, "b").is_empty());
    assert_eq!(f.color("a1").await.as_deref(), Some("green"));

    // The cluster says which commit each app is at.
    let status = AppStatus::load(&f.cluster, &f.ns, &format!("test-{}", f.ns), "a")
        .await
        .expect("readable")
        .expect("status exists");
    assert_eq!(status.commit, second_commit);
    assert_ne!(status.commit, first_commit);
    assert_eq!(status.result, "Synced");
    assert_eq!(status.inventory.len(), 2);
}

#[tokio::test]
async fn prune_deletes_what_left_git_but_never_an_unmanaged_lookalike() {
    let f = Fixture::new("sync-prune").await;
    f.repo
        .write("a/one.yaml", &configmap(&f.ns, "a1", "blue"))
        .write("a/two.yaml", &configmap(&f.ns, "a2", "blue"))
        .write("a/three.yaml", &configmap(&f.ns, "a3", "blue"));
    f.repo.commit_and_push("three objects");
    assert!(f.sync(true).await.is_clean());
    // a3 stays in the inventory, but the object now is someone else's: made
    // again by hand, labelled by another agent.
    f.configmaps().delete("a3", &Default::default()).await.expect("deleted");
    let lookalike: ConfigMap = serde_json::from_str(&format!(
        r#"{{"metadata": {{"name": "a3", "namespace": "{}", "labels": {{"gitcanary.io/managed-by": "another-agent"}}}}, "data": {{"color": "mine"}}}}"#,
        f.ns
    ))
    .expect("a ConfigMap");
    f.configmaps()
        .create(&PostParams::default(), &lookalike)
        .await
        .expect("created by hand");

    f.repo.remove("a/two.yaml").remove("a/three.yaml");
    f.repo.commit_and_push("a2 and a3 leave Git");
    // Without --prune the object stays and stays in the inventory.
    let kept = f.sync(false).await;
    assert!(kept.app("a").expect("a").pruned.is_empty());
    assert_eq!(f.color("a2").await.as_deref(), Some("blue"));

    let pruned = f.sync(true).await;
    let names: Vec<_> = pruned
        .app("a")
        .expect("a")
        .pruned
        .iter()
        .map(|k| k.name.clone())
        .collect();
    assert_eq!(names, vec!["a2"]);
    assert_eq!(f.color("a2").await, None, "a2 is deleted");
    assert_eq!(
        f.color("a3").await.as_deref(),
        Some("mine"),
        "the hand-made object is untouched"
    );
    assert_eq!(f.color("a1").await.as_deref(), Some("blue"));
}

#[tokio::test]
async fn an_invalid_app_keeps_what_it_had_while_the_other_app_syncs() {
    let f = Fixture::new("sync-invalid").await;
    f.repo
        .write("a/one.yaml", &configmap(&f.ns, "a1", "blue"))
        .write("b/one.yaml", &configmap(&f.ns, "b1", "blue"));
    f.repo.commit_and_push("two apps");
    assert!(f.sync(false).await.is_clean());

    f.repo
        .write("a/one.yaml", &configmap(&f.ns, "a1", "green"))
        .write("b/one.yaml", &configmap(&f.ns, "b1", "green"))
        .write(
            "b/broken.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: broken\n  labels: [unclosed\n",
        );
    f.repo.commit_and_push("b breaks");
    let report = f.sync(false).await;
    assert_eq!(report.app("a").expect("a").result, AppResult::Synced);
    assert_eq!(f.color("a1").await.as_deref(), Some("green"));
    let b = report.app("b").expect("b");
    assert_eq!(b.result, AppResult::Invalid);
    assert_eq!(
        f.color("b1").await.as_deref(),
        Some("blue"),
        "no object of an invalid app is applied"
    );
    let problem = &b.problems[0];
    assert_eq!(problem.file, "b/broken.yaml");
    assert!((4..=6).contains(&problem.line), "{problem}");
    let status = AppStatus::load(&f.cluster, &f.ns, &format!("test-{}", f.ns), "b")
        .await
        .expect("readable")
        .expect("exists");
    assert_eq!(status.result, "Invalid");
    assert!(status.message.starts_with("b/broken.yaml:"), "{}", status.message);
}

#[tokio::test]
async fn the_api_server_checks_every_object_before_any_is_applied() {
    let f = Fixture::new("sync-types").await;
    f.repo
        .write("b/settings.yaml", &configmap(&f.ns, "b1", "blue"))
        .write("b/web.yaml", &deployment(&f.ns, "web", "three"))
        .write(
            "c/unknown.yaml",
            &format!(
                "apiVersion: example.test/v1\nkind: Widget\nmetadata:\n  name: w\n  namespace: {}\n",
                f.ns
            ),
        );
    f.repo.commit_and_push("wrong type and unknown kind");
    let report = f.sync(false).await;
    let b = report.app("b").expect("b");
    assert_eq!(b.result, AppResult::Invalid);
    assert_eq!(b.problems.len(), 1, "{:?}", b.problems);
    assert_eq!((b.problems[0].file.as_str(), b.problems[0].line), ("b/web.yaml", 1));
    assert!(b.problems[0].message.contains("replicas"), "{}", b.problems[0]);
    assert_eq!(
        f.color("b1").await,
        None,
        "the valid ConfigMap of the app is not applied either"
    );
    let c = report.app("c").expect("c");
    assert!(
        c.problems[0]
            .to_string()
            .starts_with("c/unknown.yaml:1: unknown kind Widget"),
        "{}",
        c.problems[0]
    );
}

#[tokio::test]
async fn a_crd_and_its_objects_sync_in_one_commit_with_the_namespace_first() {
    let f = Fixture::new("sync-crd").await;
    let group = format!("{}.example.test", f.ns);
    let crd = format!(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: widgets.{group}\nspec:\n  group: {group}\n  scope: Namespaced\n  names: {{plural: widgets, singular: widget, kind: Widget}}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        type: object\n        x-kubernetes-preserve-unknown-fields: true\n"
    );
    let extra_ns = format!("{}-extra", f.ns);
    f.repo
        .write("platform/crd.yaml", &crd)
        .write(
            "platform/ns.yaml",
            &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {extra_ns}\n"),
        )
        .write(
            "platform/widget.yaml",
            &format!("apiVersion: {group}/v1\nkind: Widget\nmetadata:\n  name: w\n  namespace: {extra_ns}\nsize: 3\n"),
        )
        .write("platform/cm.yaml", &configmap(&extra_ns, "in-new-ns", "blue"));
    f.repo.commit_and_push("crd, namespace and objects");
    let report = f.sync(false).await;
    assert!(report.is_clean(), "{:?}", report.problems().collect::<Vec<_>>());
    let applied: Vec<&str> = report
        .app("platform")
        .expect("app")
        .applied
        .iter()
        .map(|k| k.kind.as_str())
        .collect();
    assert_eq!(applied.len(), 4);
    let mut first: Vec<&str> = applied[..2].to_vec();
    first.sort();
    assert_eq!(
        first,
        vec!["CustomResourceDefinition", "Namespace"],
        "the Namespace and the CRD go first: {applied:?}"
    );
    let again = f.sync(false).await;
    assert!(
        again.app("platform").expect("app").applied.is_empty(),
        "a resync changes nothing"
    );
}

#[tokio::test]
async fn what_a_sync_wrote_before_a_crd_was_refused_is_recorded_and_pruned_later() {
    let f = Fixture::new("sync-crd-refused").await;
    let group = format!("{}.example.test", f.ns);
    let crd = |plural: &str| {
        format!(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: {plural}.{group}\nspec:\n  group: {group}\n  scope: Namespaced\n  names: {{plural: {plural}, kind: Widget}}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        type: object\n        x-kubernetes-preserve-unknown-fields: true\n"
        )
    };
    // Someone else's CRD already serves the kind Widget of this group.
    let theirs: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("widgets.{group}")},
            "spec": {"group": group, "scope": "Namespaced", "names": {"plural": "widgets", "kind": "Widget"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
        }))
        .expect("a CRD");
    Api::all(f.client.clone())
        .create(&PostParams::default(), &theirs)
        .await
        .expect("created");
    f.repo.write("a/one.yaml", &configmap(&f.ns, "a1", "blue"));
    f.repo.commit_and_push("a");
    assert!(f.sync(true).await.is_clean());

    // A Namespace, then a CRD whose kind is taken: the API server never serves it.
    let extra_ns = format!("{}-extra", f.ns);
    f.repo
        .write(
            "a/ns.yaml",
            &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {extra_ns}\n"),
        )
        .write("a/crd.yaml", &crd("gizmos"));
    f.repo.commit_and_push("a namespace and a refused CRD");
    let report = f.sync(true).await;
    let a = report.app("a").expect("a");
    assert_eq!(a.result, AppResult::Failed);
    assert!(
        a.problems
            .iter()
            .any(|p| p.file == "a/crd.yaml" && p.to_string().contains("names not accepted")),
        "{:?}",
        a.problems
    );
    let status = AppStatus::load(&f.cluster, &f.ns, &format!("test-{}", f.ns), "a")
        .await
        .expect("readable")
        .expect("status exists");
    let mut recorded: Vec<&str> = status.inventory.iter().map(|e| e.kind.as_str()).collect();
    recorded.sort();
    assert_eq!(
        recorded,
        vec!["ConfigMap", "CustomResourceDefinition", "Namespace"],
        "what was written is recorded"
    );

    // Recorded, they are pruned when they leave Git.
    f.repo.remove("a/ns.yaml").remove("a/crd.yaml");
    f.repo.commit_and_push("both leave");
    let report = f.sync(true).await;
    let mut pruned: Vec<&str> = report
        .app("a")
        .expect("a")
        .pruned
        .iter()
        .map(|k| k.kind.as_str())
        .collect();
    pruned.sort();
    assert_eq!(pruned, vec!["CustomResourceDefinition", "Namespace"]);
}

#[tokio::test]
async fn deployments_report_health_once_available() {
    let f = Fixture::new("sync-health").await;
    f.repo.write("web/deploy.yaml", &deployment(&f.ns, "web", "2"));
    f.repo.commit_and_push("web");
    let first = f.sync(false).await;
    assert_eq!(
        first.app("web").expect("web").health,
        "Progressing",
        "a Deployment just applied has no available pods yet"
    );
    let deployments: Api<Deployment> = Api::namespaced(f.client.clone(), &f.ns);
    support::eventually("web available", Duration::from_secs(60), || async {
        let status = deployments.get("web").await.ok()?.status?;
        (status.available_replicas == Some(2)).then_some(())
    })
    .await;
    let report = f.sync(false).await;
    assert_eq!(report.app("web").expect("web").health, "Healthy");
}

#[tokio::test]
async fn an_edit_by_someone_else_is_put_back_on_the_next_sync() {
    let f = Fixture::new("sync-drift").await;
    f.repo.write("a/one.yaml", &configmap(&f.ns, "a1", "blue"));
    f.repo.commit_and_push("a1");
    f.sync(false).await;
    let edit = serde_json::json!({"data": {"color": "hacked"}});
    f.configmaps()
        .patch("a1", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .expect("edited like kubectl edit");
    let report = f.sync(false).await;
    let a = report.app("a").expect("a");
    assert_eq!(
        a.drifted.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(),
        vec!["a1"]
    );
    assert_eq!(f.color("a1").await.as_deref(), Some("blue"));
}

#[tokio::test]
async fn an_object_someone_else_made_is_not_taken_over() {
    let f = Fixture::new("sync-conflict").await;
    let theirs: ConfigMap = serde_json::from_str(&format!(
        r#"{{"metadata": {{"name": "shared", "namespace": "{}"}}, "data": {{"color": "theirs"}}}}"#,
        f.ns
    ))
    .expect("a ConfigMap");
    f.configmaps()
        .create(
            &PostParams {
                field_manager: Some("kubectl-create".into()),
                ..PostParams::default()
            },
            &theirs,
        )
        .await
        .expect("created by hand");
    f.repo.write("a/shared.yaml", &configmap(&f.ns, "shared", "ours"));
    f.repo.commit_and_push("claims an existing object");
    let report = f.sync(false).await;
    let a = report.app("a").expect("a");
    assert_eq!(a.result, AppResult::Invalid);
    assert!(a.problems[0].message.contains("conflict"), "{}", a.problems[0]);
    assert_eq!(f.color("shared").await.as_deref(), Some("theirs"));
}

#[tokio::test]
async fn an_app_may_use_the_namespace_another_app_creates() {
    let f = Fixture::new("sync-order").await;
    let team_ns = format!("{}-team", f.ns);
    f.repo
        .write("a-web/cm.yaml", &configmap(&team_ns, "web", "blue"))
        .write(
            "z-platform/ns.yaml",
            &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {team_ns}\n"),
        );
    f.repo.commit_and_push("namespace in one app, its user in another");
    let report = f.sync(false).await;
    assert!(report.is_clean(), "{:?}", report.problems().collect::<Vec<_>>());
    let configmaps: Api<ConfigMap> = Api::namespaced(f.client.clone(), &team_ns);
    assert!(configmaps.get_opt("web").await.expect("readable").is_some());
}

#[tokio::test]
async fn an_object_moved_to_another_app_is_not_pruned() {
    let f = Fixture::new("sync-move").await;
    f.repo.write("m/shared.yaml", &configmap(&f.ns, "shared", "blue"));
    f.repo.write("z/other.yaml", &configmap(&f.ns, "other", "blue"));
    f.repo.write("a/early.yaml", &configmap(&f.ns, "early", "blue"));
    // An app holding a Namespace syncs first, alone: a prunes before z applies.
    let first = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {}-first\n", f.ns);
    f.repo.write("a/namespace.yaml", &first);
    f.repo.commit_and_push("shared lives in m, early in a");
    assert!(f.sync(true).await.is_clean());

    // One commit moves shared from app m to app b (b syncs before m, or
    // with it), and early from app a to app z (a syncs first: when it
    // prunes, the live object still names a's file, and only the revision
    // says z holds it).
    f.repo.remove("m/shared.yaml");
    f.repo.write("m/keep.yaml", &configmap(&f.ns, "keep", "blue"));
    f.repo.write("b/shared.yaml", &configmap(&f.ns, "shared", "green"));
    f.repo.remove("a/early.yaml");
    f.repo.write("a/keep.yaml", &configmap(&f.ns, "keep-a", "blue"));
    f.repo.write("z/early.yaml", &configmap(&f.ns, "early", "green"));
    f.repo.commit_and_push("shared moves to b, early to z");
    let report = f.sync(true).await;
    assert!(report.is_clean(), "{:?}", report.problems().collect::<Vec<_>>());
    assert_eq!(
        f.color("shared").await.as_deref(),
        Some("green"),
        "b's object survives m's prune"
    );
    assert!(
        report.app("a").expect("a").pruned.is_empty(),
        "a pruned what z holds now"
    );
    assert_eq!(
        f.color("early").await.as_deref(),
        Some("green"),
        "z's object survives a's prune"
    );
}

#[tokio::test]
async fn an_inventory_that_cannot_be_read_stops_prune_says_so_and_is_kept() {
    let f = Fixture::new("sync-inventory").await;
    f.repo
        .write("a/one.yaml", &configmap(&f.ns, "a1", "blue"))
        .write("a/two.yaml", &configmap(&f.ns, "a2", "blue"));
    f.repo.commit_and_push("two objects");
    assert!(f.sync(true).await.is_clean());
    let status_name = format!("test-{}-app-a", f.ns);
    let broken = serde_json::json!({"data": {"inventory": "[{\"kind\": broken"}});
    f.configmaps()
        .patch(&status_name, &PatchParams::default(), &Patch::Merge(&broken))
        .await
        .expect("the inventory is damaged");

    f.repo.remove("a/two.yaml");
    f.repo.commit_and_push("a2 leaves Git");
    let report = f.sync(true).await;
    let a = report.app("a").expect("a");
    assert_eq!(a.result, AppResult::Failed);
    assert!(a.pruned.is_empty());
    assert!(
        a.problems
            .iter()
            .any(|p| p.message.contains("the recorded inventory cannot be read")
                && p.message.contains("nothing is pruned for this app")),
        "{:?}",
        a.problems
    );
    assert_eq!(f.color("a2").await.as_deref(), Some("blue"), "nothing was pruned");
    let status = f.configmaps().get(&status_name).await.expect("the status");
    assert_eq!(
        status.data.expect("data").get("inventory").map(String::as_str),
        Some("[{\"kind\": broken"),
        "the inventory is kept as it was, never read as empty"
    );
}

#[tokio::test]
async fn an_app_whose_directory_left_git_is_pruned_whole_and_its_status_goes() {
    let f = Fixture::new("sync-app-gone").await;
    f.repo
        .write("a/one.yaml", &configmap(&f.ns, "a1", "blue"))
        .write("b/one.yaml", &configmap(&f.ns, "b1", "blue"))
        .write("b/two.yaml", &configmap(&f.ns, "b2", "blue"));
    f.repo.commit_and_push("two apps");
    assert!(f.sync(true).await.is_clean());
    let instance = format!("test-{}", f.ns);
    let status = |app: &'static str| {
        let instance = instance.clone();
        let f = &f;
        async move {
            AppStatus::load(&f.cluster, &f.ns, &instance, app)
                .await
                .expect("statuses read")
        }
    };
    assert!(status("b").await.is_some());

    f.repo.remove("b/one.yaml").remove("b/two.yaml");
    f.repo.commit_and_push("app b leaves Git");
    // Without --prune what b made stays, and so does its status.
    let kept = f.sync(false).await;
    assert!(kept.app("b").is_none(), "{kept:?}");
    assert_eq!(f.color("b1").await.as_deref(), Some("blue"));
    assert!(status("b").await.is_some());

    // A sync of another source under the same instance (`sync --once` of
    // another path, say) does not take b for one of its own.
    let elsewhere = SyncOptions {
        source: "file:///elsewhere main /".into(),
        ..f.options(true)
    };
    let other = sync(&f.cluster, &f.revision().await, &elsewhere)
        .await
        .expect("sync runs");
    assert!(other.app("b").is_none(), "{other:?}");
    assert_eq!(f.color("b1").await.as_deref(), Some("blue"));

    let pruned = f.sync(true).await;
    let mut names: Vec<_> = pruned
        .app("b")
        .expect("b reported")
        .pruned
        .iter()
        .map(|k| k.name.clone())
        .collect();
    names.sort();
    assert_eq!(names, vec!["b1", "b2"]);
    assert_eq!(f.color("b1").await, None, "b's objects are deleted");
    assert_eq!(f.color("b2").await, None);
    assert!(status("b").await.is_none(), "nothing of b is left: nor its status");
    assert_eq!(f.color("a1").await.as_deref(), Some("blue"), "a is untouched");
    let again = f.sync(true).await;
    assert!(again.app("b").is_none() && again.is_clean(), "{again:?}");

    // A revision without any app prunes nothing: a repository emptied whole
    // is more likely a mistake.
    f.repo.remove("a/one.yaml");
    f.repo.commit_and_push("everything leaves Git");
    let emptied = f.sync(true).await;
    assert!(emptied.apps.is_empty(), "{emptied:?}");
    assert_eq!(f.color("a1").await.as_deref(), Some("blue"));
    assert!(status("a").await.is_some());
}
