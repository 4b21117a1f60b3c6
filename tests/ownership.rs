//! gitcanary writes and deletes only what it made: a canary's name taken by
//! someone else's object stops the release, and that object is left alone.

mod support;

use std::time::Duration;

use gitcanary::rollout::api::{Phase, Rollout};
use gitcanary::sync::{SyncOptions, SyncReport, sync};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DeleteParams, PostParams};
use support::library::Fixture;

const STEPS: &str = "  strategy:\n    canary:\n      trafficRoutings: [{service: echo, gateway: {httpRouteName: echo}}]\n      steps:\n      - {traffic: 50%, replicas: 1, pause: {}}\n      - {traffic: 100%}\n";

async fn sync_once(f: &Fixture, options: &SyncOptions) -> SyncReport {
    sync(&f.cluster, &f.revision().await, options).await.expect("sync runs")
}

/// echo 1.0 pushed, and synced until it is available.
async fn echo_available(f: &Fixture, options: &SyncOptions, steps: &str) {
    support::agent::write_echo_app(&f.repo, &f.ns, "1.0", steps);
    f.repo.commit_and_push("echo 1.0");
    support::eventually(
        "echo 1.0 is synced and available",
        Duration::from_secs(60),
        async || {
            let report = sync_once(f, options).await;
            (report.is_clean() && report.app("echo").is_some_and(|a| a.health == "Healthy")).then_some(())
        },
    )
    .await;
}

fn image_of(deployment: &Deployment) -> Option<String> {
    deployment
        .spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .image
        .clone()
}

#[tokio::test]
async fn a_canary_name_someone_else_holds_stops_the_release_and_is_never_touched() {
    let f = Fixture::with_rollouts("own-canary").await;
    let (client, ns, repo, options) = (&f.client, &f.ns, &f.repo, f.options(false));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let rollouts: Api<Rollout> = Api::namespaced(client.clone(), ns);

    // Someone's own Deployment, named as gitcanary names a canary.
    let theirs: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "echo-canary", "namespace": ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "theirs"}},
            "template": {"metadata": {"labels": {"app": "theirs"}},
                "spec": {"containers": [{"name": "theirs", "image": "registry.test/theirs:1"}]}}}
    }))
    .expect("a Deployment");
    let params = PostParams {
        field_manager: Some("kubectl-create".into()),
        ..PostParams::default()
    };
    deployments.create(&params, &theirs).await.expect("created by hand");

    echo_available(&f, &options, STEPS).await;
    // Several syncs with no release: their Deployment is still there.
    let kept = deployments.get_opt("echo-canary").await.expect("readable");
    assert_eq!(
        kept.as_ref().and_then(image_of).as_deref(),
        Some("registry.test/theirs:1"),
        "someone else's Deployment was deleted or changed"
    );

    support::agent::write_echo_app(repo, ns, "2.0", STEPS);
    repo.commit_and_push("echo 2.0");
    let report = sync_once(&f, &options).await;
    assert!(report.app("echo").expect("echo").canary_applied.is_empty());
    let status = rollouts.get("echo").await.expect("rollout").status.expect("a status");
    assert_eq!(status.phase, Phase::Failed);
    let message = status.canary_status.expect("canary status").message;
    assert!(
        message.contains(&format!(
            "Deployment {ns}/echo-canary already exists and gitcanary did not make it (managed by "
        )) && message.contains("kubectl-create"),
        "{message}"
    );
    assert!(message.contains("rename or delete"), "{message}");
    let kept = deployments.get("echo-canary").await.expect("still there");
    assert_eq!(image_of(&kept).as_deref(), Some("registry.test/theirs:1"));

    // Once the name is free, the release starts with a canary of gitcanary's own.
    deployments
        .delete("echo-canary", &DeleteParams::default())
        .await
        .expect("deleted");
    support::eventually(
        "the hand-made Deployment is gone",
        Duration::from_secs(30),
        async || {
            deployments
                .get_opt("echo-canary")
                .await
                .expect("readable")
                .is_none()
                .then_some(())
        },
    )
    .await;
    let report = sync_once(&f, &options).await;
    assert_eq!(
        report
            .app("echo")
            .expect("echo")
            .canary_applied
            .iter()
            .map(|k| k.name.as_str())
            .collect::<Vec<_>>(),
        vec!["echo-canary"]
    );
    let canary = deployments.get("echo-canary").await.expect("the canary");
    assert_eq!(image_of(&canary).as_deref(), Some("registry.test/echo:2.0"));
    assert_eq!(
        rollouts
            .get("echo")
            .await
            .expect("rollout")
            .status
            .expect("status")
            .phase,
        Phase::Progressing
    );
}

#[tokio::test]
async fn a_canary_is_its_rollouts_own_and_a_suffix_frees_a_taken_name() {
    let f = Fixture::with_rollouts("own-rollout").await;
    let (client, ns, repo, options) = (&f.client, &f.ns, &f.repo, f.options(false));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let rollouts: Api<Rollout> = Api::namespaced(client.clone(), ns);

    // Another Rollout's canary, made by this instance: same label, same name.
    let other: Rollout = serde_json::from_value(serde_json::json!({
        "apiVersion": "gitcanary.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": "other", "namespace": ns},
        "spec": {"workloadRef": {"kind": "Deployment", "name": "elsewhere"},
            "strategy": {"canary": {"steps": [{"replicas": 1}]}}}
    }))
    .expect("a Rollout");
    let other = rollouts.create(&PostParams::default(), &other).await.expect("created");
    let others: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "echo-canary", "namespace": ns,
            "labels": {"gitcanary.io/managed-by": options.instance},
            "ownerReferences": [{"apiVersion": "gitcanary.io/v1alpha1", "kind": "Rollout",
                "name": "other", "uid": other.metadata.uid.clone().expect("a uid")}]},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "other"}},
            "template": {"metadata": {"labels": {"app": "other"}},
                "spec": {"containers": [{"name": "other", "image": "registry.test/other:1"}]}}}
    }))
    .expect("a Deployment");
    deployments
        .create(&PostParams::default(), &others)
        .await
        .expect("created");

    echo_available(&f, &options, STEPS).await;
    // Syncs with no release clean up echo's canary: the other Rollout's stays.
    let kept = deployments.get_opt("echo-canary").await.expect("readable");
    assert_eq!(
        kept.as_ref().and_then(image_of).as_deref(),
        Some("registry.test/other:1"),
        "another Rollout's canary was deleted"
    );

    support::agent::write_echo_app(repo, ns, "2.0", STEPS);
    repo.commit_and_push("echo 2.0");
    sync_once(&f, &options).await;
    let status = rollouts.get("echo").await.expect("rollout").status.expect("a status");
    assert_eq!(status.phase, Phase::Failed);
    let message = status.canary_status.expect("canary status").message;
    assert!(
        message.contains(&format!(
            "Deployment {ns}/echo-canary already exists and it is the canary of Rollout {ns}/other"
        )) && message.contains("set spec.strategy.canary.canarySuffix"),
        "{message}"
    );

    // Another suffix: the next release runs beside the taken name.
    let suffixed = STEPS.replace("    canary:\n", "    canary:\n      canarySuffix: -next\n");
    support::agent::write_echo_app(repo, ns, "3.0", &suffixed);
    repo.commit_and_push("echo 3.0, canaries named -next");
    let report = sync_once(&f, &options).await;
    let applied: Vec<&str> = report
        .app("echo")
        .expect("echo")
        .canary_applied
        .iter()
        .map(|k| k.name.as_str())
        .collect();
    assert_eq!(applied, vec!["echo-next"]);
    let canary = deployments.get("echo-next").await.expect("the canary");
    assert_eq!(image_of(&canary).as_deref(), Some("registry.test/echo:3.0"));
    let echo = rollouts.get("echo").await.expect("rollout");
    let owners = canary.metadata.owner_references.unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!((owners[0].kind.as_str(), owners[0].name.as_str()), ("Rollout", "echo"));
    assert_eq!(Some(&owners[0].uid), echo.metadata.uid.as_ref());
    assert_eq!(echo.status.expect("status").phase, Phase::Progressing);
    let kept = deployments.get("echo-canary").await.expect("still there");
    assert_eq!(image_of(&kept).as_deref(), Some("registry.test/other:1"));
}

#[tokio::test]
async fn under_namespaces_an_object_lands_only_where_allowed_whatever_its_manifest_omits() {
    let f = Fixture::new("own-allow").await;
    let (client, ns, repo) = (&f.client, &f.ns, &f.repo);
    repo.write(
        "sneaky/cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: no-namespace}\ndata: {color: blue}\n",
    )
    .write(
        "sneaky/binding.yaml",
        &format!("apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: {ns}-everyone-admin}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}}\nsubjects: [{{kind: Group, name: system:authenticated, apiGroup: rbac.authorization.k8s.io}}]\n"),
    )
    .write(
        "fine/cm.yaml",
        &format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: fine, namespace: {ns}}}\ndata: {{color: blue}}\n"),
    );
    repo.commit_and_push("one app reaches outside its namespace");
    let options = SyncOptions {
        allowed: gitcanary::manifest::Allowed {
            namespaces: vec![ns.clone()],
            ..Default::default()
        },
        ..f.options(false)
    };
    let report = sync_once(&f, &options).await;
    let sneaky = report.app("sneaky").expect("sneaky");
    assert!(sneaky.applied.is_empty());
    let problems: Vec<String> = sneaky.problems.iter().map(ToString::to_string).collect();
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("sneaky/cm.yaml:1: no namespace: it would land in \"default\"")),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p
                .starts_with("sneaky/binding.yaml:1: rbac.authorization.k8s.io/ClusterRoleBinding is cluster-scoped")),
        "{problems:?}"
    );
    assert_eq!(report.app("fine").expect("fine").applied.len(), 1);
    let defaults: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), "default");
    assert!(defaults.get_opt("no-namespace").await.expect("readable").is_none());
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(client.clone());
    assert!(
        bindings
            .get_opt(&format!("{ns}-everyone-admin"))
            .await
            .expect("readable")
            .is_none()
    );

    // With --default-namespace, that ConfigMap lands in the allowed namespace.
    repo.remove("sneaky/binding.yaml");
    repo.commit_and_push("only the ConfigMap without a namespace");
    let mut options = options.clone();
    options.allowed.default_namespace = ns.clone();
    let report = sync_once(&f, &options).await;
    let sneaky = report.app("sneaky").expect("sneaky");
    assert!(sneaky.problems.is_empty(), "{:?}", sneaky.problems);
    assert!(
        f.configmaps()
            .get_opt("no-namespace")
            .await
            .expect("readable")
            .is_some()
    );
    assert!(defaults.get_opt("no-namespace").await.expect("readable").is_none());
}

#[tokio::test]
async fn an_existing_object_is_taken_over_only_when_asked_and_an_adopted_namespace_survives_prune() {
    let f = Fixture::new("own-adopt").await;
    let ns = f.ns.clone();
    let team = format!("{ns}-team");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(f.client.clone());
    let params = PostParams {
        field_manager: Some("kubectl-create".into()),
        ..PostParams::default()
    };
    // Objects that were there before gitcanary: a ConfigMap and a Namespace.
    let existing: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "existing", "namespace": ns}, "data": {"color": "blue"}}),
    )
    .expect("a ConfigMap");
    f.configmaps()
        .create(&params, &existing)
        .await
        .expect("created by hand");
    let namespace: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": team}})).expect("a Namespace");
    namespaces.create(&params, &namespace).await.expect("created by hand");
    let managed_by = |labels: Option<&std::collections::BTreeMap<String, String>>| {
        labels.and_then(|l| l.get("gitcanary.io/managed-by").cloned())
    };

    // A brand-new app that names the existing ConfigMap: refused, nothing of it kept.
    let configmap = |annotations: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: existing\n  namespace: {ns}\n{annotations}data:\n  color: blue\n"
        )
    };
    f.repo.write("a/existing.yaml", &configmap("")).write(
        "a/new.yaml",
        &format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: new, namespace: {ns}}}\ndata: {{color: blue}}\n"),
    );
    f.repo.commit_and_push("claims an existing ConfigMap");
    let report = sync_once(&f, &f.options(true)).await;
    let a = report.app("a").expect("a");
    assert_eq!(a.result, gitcanary::sync::AppResult::Invalid);
    let problem = a
        .problems
        .iter()
        .map(ToString::to_string)
        .find(|p| p.starts_with("a/existing.yaml:1:"))
        .expect("named");
    assert!(
        problem.contains("already exists and this instance does not manage it (field managers: kubectl-create)"),
        "{problem}"
    );
    assert!(problem.contains("gitcanary.io/adopt: \"true\""), "{problem}");
    assert_eq!(f.color("new").await, None, "the new app is taken back whole");
    let kept = f.configmaps().get("existing").await.expect("still there");
    assert_eq!(
        managed_by(kept.metadata.labels.as_ref()),
        None,
        "gitcanary's label was taken back"
    );

    // Asked for: adopted, and recorded as adopted.
    f.repo.write(
        "a/existing.yaml",
        &configmap("  annotations: {gitcanary.io/adopt: \"true\"}\n"),
    );
    f.repo.write(
        "b/team.yaml",
        &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {team}\n  annotations: {{gitcanary.io/adopt: \"true\"}}\n"),
    );
    f.repo.commit_and_push("adopts them");
    let report = sync_once(&f, &f.options(true)).await;
    assert!(report.is_clean(), "{:?}", report.problems().collect::<Vec<_>>());
    let adopted = f.configmaps().get("existing").await.expect("adopted");
    assert_eq!(managed_by(adopted.metadata.labels.as_ref()), Some(format!("test-{ns}")));
    let status = f
        .configmaps()
        .get(&format!("test-{ns}-app-b"))
        .await
        .expect("app b's status");
    let inventory = status.data.expect("data")["inventory"].clone();
    assert!(inventory.contains("\"adopted\":true"), "{inventory}");

    // The Namespace leaves Git: released, never deleted.
    f.repo.remove("b/team.yaml");
    f.repo.write(
        "b/other.yaml",
        &format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: other, namespace: {ns}}}\ndata: {{color: blue}}\n"
        ),
    );
    f.repo.commit_and_push("the Namespace leaves Git");
    let report = sync_once(&f, &f.options(true)).await;
    let b = report.app("b").expect("b");
    assert!(b.pruned.is_empty(), "{:?}", b.pruned);
    assert_eq!(
        b.released.iter().map(|k| k.name.clone()).collect::<Vec<_>>(),
        vec![team.clone()]
    );
    let released = namespaces.get(&team).await.expect("the Namespace is still there");
    assert!(released.metadata.deletion_timestamp.is_none());
    assert_eq!(
        managed_by(released.metadata.labels.as_ref()),
        None,
        "gitcanary's label is gone"
    );
}

#[tokio::test]
async fn a_new_app_never_writes_into_someone_elses_object_before_refusing_it() {
    let f = Fixture::new("own-fresh").await;
    let ns = f.ns.clone();
    let params = PostParams {
        field_manager: Some("kubectl-create".into()),
        ..PostParams::default()
    };
    let theirs: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "theirs", "namespace": ns}, "data": {"color": "blue"}}),
    )
    .expect("a ConfigMap");
    let before = f.configmaps().create(&params, &theirs).await.expect("created by hand");

    // A brand-new app whose first write would merge its fields into it (no
    // field of theirs is touched, so an apply meets no conflict).
    f.repo
        .write(
            "newcomer/theirs.yaml",
            &format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: theirs\n  namespace: {ns}\ndata:\n  extra: added\n"
            ),
        )
        .write(
            "newcomer/own.yaml",
            &format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: newcomer-own, namespace: {ns}}}\ndata: {{a: b}}\n"
            ),
        );
    f.repo.commit_and_push("a new app names someone else's ConfigMap");
    let report = sync_once(&f, &f.options(true)).await;
    let newcomer = report.app("newcomer").expect("newcomer");
    assert_eq!(newcomer.result, gitcanary::sync::AppResult::Invalid);
    assert!(
        newcomer
            .problems
            .iter()
            .any(|p| p.to_string().starts_with("newcomer/theirs.yaml:1:")
                && p.message
                    .contains("already exists and this instance does not manage it")),
        "{:?}",
        newcomer.problems
    );
    let after = f.configmaps().get("theirs").await.expect("still there");
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "never written, not even for a moment"
    );
    assert_eq!(after.data, before.data);
    assert!(
        f.configmaps()
            .get_opt("newcomer-own")
            .await
            .expect("readable")
            .is_none(),
        "nothing of the refused app is written"
    );
}
