//! A commit to an app can do only what that app's ServiceAccount may: its
//! writes are made impersonating it, so Kubernetes RBAC bounds them.

mod support;

use std::time::Duration;

use gitcanary::model::ServiceAccountRef;
use gitcanary::rollout::api::{Phase, Rollout};
use gitcanary::sync::{AppResult, SyncOptions, SyncReport, sync};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, PostParams};
use serde_json::json;
use support::library::Fixture;

async fn sync_once(f: &Fixture, options: &SyncOptions) -> SyncReport {
    sync(&f.cluster, &f.revision().await, options).await.expect("sync runs")
}

/// A ServiceAccount that may manage an app's kinds in `ns` only.
async fn tenant(client: &kube::Client, ns: &str) -> ServiceAccountRef {
    let create = PostParams::default();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let account = serde_json::from_value(json!({"metadata": {"name": "deployer"}})).expect("an account");
    accounts.create(&create, &account).await.expect("account");
    let verbs = json!(["get", "list", "watch", "create", "update", "patch", "delete"]);
    let role = serde_json::from_value(json!({
        "metadata": {"name": "deployer"},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps", "services"], "verbs": verbs},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": verbs},
            {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["httproutes"], "verbs": verbs},
            {"apiGroups": ["gitcanary.io"], "resources": ["rollouts"], "verbs": verbs},
        ]
    }))
    .expect("a Role");
    let roles: Api<Role> = Api::namespaced(client.clone(), ns);
    roles.create(&create, &role).await.expect("role");
    let binding = serde_json::from_value(json!({
        "metadata": {"name": "deployer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "deployer"},
        "subjects": [{"kind": "ServiceAccount", "name": "deployer", "namespace": ns}]
    }))
    .expect("a RoleBinding");
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
    bindings.create(&create, &binding).await.expect("binding");
    ServiceAccountRef {
        namespace: ns.to_string(),
        name: "deployer".to_string(),
    }
}

fn configmap(name: &str, ns: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata: {{color: blue}}\n")
}

#[tokio::test]
async fn a_tenant_app_cannot_write_beyond_its_service_account_and_other_apps_still_sync() {
    let f = Fixture::new("tenant").await;
    let (client, ns, repo) = (&f.client, &f.ns, &f.repo);
    let elsewhere = support::namespace(client, "tenant-other").await;
    let mut options = f.options(false);
    let deployer = tenant(client, ns).await;
    options.tenants.insert("team".to_string(), deployer.clone());

    // The tenant's own ConfigMap, a Deployment in another namespace and a
    // ClusterRoleBinding that would make it cluster-admin.
    repo.write("team/config.yaml", &configmap("team-config", ns));
    repo.write(
        "team/deployment.yaml",
        &format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: intruder\n  namespace: {elsewhere}\nspec:\n  selector:\n    matchLabels: {{app: intruder}}\n  template:\n    metadata:\n      labels: {{app: intruder}}\n    spec:\n      containers:\n      - {{name: intruder, image: registry.test/intruder:1}}\n"
        ),
    );
    let binding = format!("{ns}-admin");
    repo.write(
        "team/binding.yaml",
        &format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: {binding}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}}\nsubjects:\n- {{kind: ServiceAccount, name: deployer, namespace: {ns}}}\n"
        ),
    );
    // An app no tenant names: under --tenant it is refused (tenancy fails
    // closed), never written as the agent itself.
    repo.write("shared/config.yaml", &configmap("shared-config", ns));
    repo.commit_and_push("a tenant reaches out of its lane");

    let report = sync_once(&f, &options).await;
    let team = report.app("team").expect("team");
    assert_eq!(team.result, AppResult::Invalid, "{:?}", team.problems);
    let problems: Vec<String> = team.problems.iter().map(ToString::to_string).collect();
    let account = format!("system:serviceaccount:{ns}:deployer");
    for (file, object) in [
        ("team/deployment.yaml", format!("Deployment.apps {elsewhere}/intruder")),
        (
            "team/binding.yaml",
            format!("ClusterRoleBinding.rbac.authorization.k8s.io {binding}"),
        ),
    ] {
        assert!(
            problems.iter().any(|p| p.starts_with(&format!("{file}:1:"))
                && p.contains(&object)
                && p.contains(&account)
                && p.contains("forbidden")),
            "{object} refused with the API server's reason: {problems:?}"
        );
    }
    assert!(
        problems
            .iter()
            .all(|p| !p.contains("ApiError") && !p.contains("ErrorResponse")),
        "no debug dump: {problems:?}"
    );

    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    assert!(
        configmaps.get_opt("team-config").await.expect("readable").is_none(),
        "nothing of the tenant app stays applied"
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &elsewhere);
    assert!(deployments.get_opt("intruder").await.expect("readable").is_none());
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    assert!(bindings.get_opt(&binding).await.expect("readable").is_none());

    let shared = report.app("shared").expect("shared");
    assert_eq!(shared.result, AppResult::Invalid, "{:?}", shared.problems);
    assert!(
        shared.problems.iter().any(|p| p
            .to_string()
            .starts_with("shared/config.yaml:1: app shared names no tenant")),
        "{:?}",
        shared.problems
    );
    assert!(configmaps.get_opt("shared-config").await.expect("readable").is_none());

    // Once the tenant keeps to its lane, it syncs, as itself.
    repo.remove("team/deployment.yaml");
    repo.remove("team/binding.yaml");
    repo.commit_and_push("the tenant keeps to its namespace");
    let report = sync_once(&f, &options).await;
    assert_eq!(report.app("team").expect("team").result, AppResult::Synced);
    assert!(configmaps.get_opt("team-config").await.expect("readable").is_some());

    // Given a default account, the app writes as that account.
    options.default_tenant = Some(deployer);
    let report = sync_once(&f, &options).await;
    assert_eq!(report.app("shared").expect("shared").result, AppResult::Synced);
    assert!(configmaps.get_opt("shared-config").await.expect("readable").is_some());
}

#[tokio::test]
async fn a_release_of_a_tenant_app_runs_to_promote_under_its_identity() {
    let f = Fixture::with_rollouts("tenant-release").await;
    let (client, ns, repo) = (&f.client, &f.ns, &f.repo);
    let mut options = f.options(false);
    options.default_tenant = Some(tenant(client, ns).await);
    let steps = "  strategy:\n    canary:\n      trafficRoutings: [{service: echo, gateway: {httpRouteName: echo}}]\n      gracePeriodSeconds: 0\n      steps:\n      - {traffic: 50%, replicas: 1, pause: {duration: 1}}\n      - {traffic: 100%}\n";
    support::agent::write_echo_app(repo, ns, "1.0", steps);
    repo.commit_and_push("echo 1.0");
    support::eventually("echo 1.0 is available", Duration::from_secs(60), async || {
        let report = sync_once(&f, &options).await;
        (report.is_clean() && report.app("echo").is_some_and(|a| a.health == "Healthy")).then_some(())
    })
    .await;

    support::agent::write_echo_app(repo, ns, "2.0", steps);
    repo.commit_and_push("echo 2.0");
    let rollouts: Api<Rollout> = Api::namespaced(client.clone(), ns);
    let canary_seen = std::cell::Cell::new(false);
    support::eventually("echo 2.0 is promoted", Duration::from_secs(90), async || {
        let report = sync_once(&f, &options).await;
        let echo = report.app("echo")?;
        assert!(echo.problems.is_empty(), "{:?}", echo.problems);
        canary_seen.set(canary_seen.get() || !echo.canary_applied.is_empty());
        let status = rollouts.get("echo").await.ok()?.status?;
        (canary_seen.get() && status.phase == Phase::Healthy && status.canary_commit.is_empty()).then_some(())
    })
    .await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let stable = deployments.get("echo").await.expect("echo");
    let image = stable
        .spec
        .and_then(|s| s.template.spec)
        .map(|s| s.containers[0].image.clone());
    assert_eq!(image.flatten().as_deref(), Some("registry.test/echo:2.0"));
    support::eventually("the canary is removed", Duration::from_secs(30), async || {
        sync_once(&f, &options).await;
        deployments
            .get_opt("echo-canary")
            .await
            .expect("readable")
            .is_none()
            .then_some(())
    })
    .await;
}
