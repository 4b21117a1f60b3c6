//! The agent as `deploy/` installs it: it runs with the ServiceAccount's
//! token and the RBAC of `deploy/cluster-rbac/rbac.yaml`, not as admin, and completes a
//! canary of the quickstart example; and that token reads no Secrets.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use gitcanary::rollout::api::{Phase, Rollout};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::GroupVersionKind;
use kube::{Client, Config};
use support::agent::{AgentProcess, Scenario};
use support::eventually;

const WAIT: Duration = Duration::from_secs(90);
const AGENT_NAMESPACE: &str = "gitcanary-system";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Applies the objects of a file of `deploy/` as admin (server-side apply).
async fn apply_file(client: &Client, path: &Path) {
    let text = std::fs::read(path).expect("readable");
    let set = gitcanary::manifest::load_files([(path.display().to_string(), text)].into_iter());
    for manifest in set.apps.values().flat_map(|a| a.manifests.iter()) {
        let object = &manifest.object;
        let (group, version) = match object["apiVersion"].as_str().expect("apiVersion").split_once('/') {
            Some((group, version)) => (group.to_string(), version.to_string()),
            None => (
                String::new(),
                object["apiVersion"].as_str().unwrap_or_default().to_string(),
            ),
        };
        let gvk = GroupVersionKind::gvk(&group, &version, object["kind"].as_str().expect("kind"));
        let (resource, capabilities) = kube::discovery::pinned_kind(client, &gvk).await.expect("a known kind");
        let name = object["metadata"]["name"].as_str().expect("name");
        let api: Api<DynamicObject> = match (capabilities.scope, object["metadata"]["namespace"].as_str()) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
            _ => Api::all_with(client.clone(), &resource),
        };
        api.patch(
            name,
            &PatchParams::apply("gitcanary-tests").force(),
            &Patch::Apply(object),
        )
        .await
        .unwrap_or_else(|e| panic!("applying {name} from {}: {e}", path.display()));
    }
}

/// The agent's identity as the cluster sees it: a kubeconfig holding a
/// token of the `gitcanary` ServiceAccount, after `deploy/`'s RBAC is in place.
async fn service_account_kubeconfig(admin: &Client, dir: &Path) -> PathBuf {
    for file in [
        "base/namespace.yaml",
        "base/serviceaccount.yaml",
        "cluster-rbac/rbac.yaml",
    ] {
        apply_file(admin, &repo_root().join("deploy").join(file)).await;
    }
    token_kubeconfig(admin, "gitcanary", dir).await
}

/// A kubeconfig holding a token of the ServiceAccount `account` of the agent's namespace.
async fn token_kubeconfig(admin: &Client, account: &str, dir: &Path) -> PathBuf {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), AGENT_NAMESPACE);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let issued: TokenRequest = eventually("a ServiceAccount token", WAIT, || async {
        accounts
            .create_subresource("token", account, &PostParams::default(), &request)
            .await
            .ok()
    })
    .await;
    let token = issued.status.and_then(|s| s.token).expect("a token");
    let admin_config = Kubeconfig::read_from(support::kubeconfig()).expect("admin kubeconfig");
    let cluster = &admin_config.clusters[0];
    let details = cluster.cluster.as_ref().expect("cluster details");
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: testenv\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: gitcanary\n  user:\n    token: {token}\ncontexts:\n- name: gitcanary\n  context: {{cluster: testenv, user: gitcanary}}\ncurrent-context: gitcanary\n",
        details.server.as_deref().expect("server"),
        details.certificate_authority.as_deref().expect("CA file"),
    );
    let path = dir.join(format!("{account}.kubeconfig"));
    std::fs::write(&path, kubeconfig).expect("kubeconfig written");
    path
}

async fn client_from(path: &Path) -> Client {
    let file = Kubeconfig::read_from(path).expect("kubeconfig");
    let config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .expect("valid kubeconfig");
    Client::try_from(config).expect("client")
}

/// The quickstart example, in a namespace of its own that the agent creates
/// from Git, with its gate turned into a short pause.
fn write_quickstart(scenario: &Scenario, app_namespace: &str, image: &str) {
    let example = repo_root().join("examples/quickstart/echoserver");
    for entry in std::fs::read_dir(&example).expect("the example") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path)
            .expect("readable")
            .replace("namespace: demo", &format!("namespace: {app_namespace}"))
            .replace("name: demo", &format!("name: {app_namespace}"))
            .replace("pause: {}", "pause: {duration: 1}")
            .replace("echoserver:1.0.0", &format!("echoserver:{image}"));
        let name = path.file_name().expect("a file name").to_string_lossy().to_string();
        scenario.repo.write(&format!("{app_namespace}/{name}"), &text);
    }
}

#[tokio::test]
async fn the_agent_completes_a_canary_with_only_the_rbac_of_deploy() {
    let scenario = Scenario::new("rbac").await;
    let kubeconfig = service_account_kubeconfig(&scenario.client, scenario.cache.path()).await;
    let app_namespace = format!("{}-app", scenario.ns);
    write_quickstart(&scenario, &app_namespace, "1.0.0");
    scenario.repo.commit_and_push("echoserver 1.0.0");
    let kubeconfig_arg = kubeconfig.display().to_string();
    let agent = AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &[
            "--kubeconfig",
            &kubeconfig_arg,
            "--state-namespace",
            AGENT_NAMESPACE,
            "--prune",
        ],
        &[],
    );
    let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &app_namespace);
    let status = || async { rollouts.get_opt("echoserver").await.ok().flatten()?.status };
    eventually("healthy on 1.0.0", WAIT, || async {
        (status().await?.phase == Phase::Healthy).then_some(())
    })
    .await;

    write_quickstart(&scenario, &app_namespace, "1.1.0");
    let released = scenario.repo.commit_and_push("echoserver 1.1.0");
    eventually("a canary step", WAIT, || async {
        (status().await?.phase == Phase::Progressing).then_some(())
    })
    .await;
    let done = eventually("1.1.0 promoted", WAIT, || async {
        let status = status().await?;
        (status.phase == Phase::Healthy && status.stable_commit == released).then_some(status)
    })
    .await;
    assert_eq!(done.step_history.len(), 3);
    let status_file = format!("main:.gitcanary/status/{app_namespace}/echoserver.yaml");
    let promoted = eventually("the promote commit", WAIT, || async {
        scenario.try_git(&["show", &status_file])
    })
    .await;
    assert!(promoted.contains("echoserver:1.1.0"), "{promoted}");
    let log = agent.log_text();
    assert!(!log.to_lowercase().contains("forbidden"), "{log}");
    assert!(
        log.contains("leading: this agent acts"),
        "the Lease is within its RBAC: {log}"
    );
}

#[tokio::test]
async fn the_service_account_reads_no_secrets() {
    let scenario = Scenario::new("rbac-secrets").await;
    let kubeconfig = service_account_kubeconfig(&scenario.client, scenario.cache.path()).await;
    let agent = client_from(&kubeconfig).await;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "database"}, "stringData": {"password": "hunter2"}
    }))
    .expect("a secret");
    Api::<Secret>::namespaced(scenario.client.clone(), &scenario.ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("admin creates a secret");

    // The token works: the agent may read what it manages.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(agent.clone(), &scenario.ns);
    deployments
        .list(&Default::default())
        .await
        .expect("deployments are readable");

    let forbidden = |result: Result<_, kube::Error>| matches!(result, Err(kube::Error::Api(s)) if s.code == 403);
    let secrets: Api<Secret> = Api::namespaced(agent.clone(), &scenario.ns);
    assert!(forbidden(secrets.get("database").await.map(|_| ())));
    assert!(forbidden(secrets.list(&Default::default()).await.map(|_| ())));
    let everywhere: Api<Secret> = Api::all(agent.clone());
    assert!(forbidden(everywhere.list(&Default::default()).await.map(|_| ())));
}

#[tokio::test]
async fn deploy_is_accepted_by_the_api_server_and_meets_the_restricted_pod_security() {
    // Namespaced objects cannot be dry-run before their namespace exists.
    let admin = support::client().await;
    apply_file(&admin, &repo_root().join("deploy/base/namespace.yaml")).await;
    apply_file(&admin, &repo_root().join("deploy/tenant-example/tenant.yaml")).await; // team-a
    let kubectl = support::kubeconfig().with_file_name("kubectl");
    for (variant, kinds) in [
        ("deploy", &["clusterrole.rbac.authorization.k8s.io/gitcanary "][..]),
        (
            "deploy/namespaced",
            &[
                "role.rbac.authorization.k8s.io/gitcanary ",
                "clusterrole.rbac.authorization.k8s.io/gitcanary-namespaced ",
            ][..],
        ),
        (
            "deploy/tenant-example",
            &["role.rbac.authorization.k8s.io/gitcanary-tenant "][..],
        ),
        (
            "deploy/sharded",
            &[
                "clusterrole.rbac.authorization.k8s.io/gitcanary ",
                "poddisruptionbudget.policy/gitcanary ",
            ][..],
        ),
    ] {
        let output = std::process::Command::new(&kubectl)
            .args(["--kubeconfig", &support::kubeconfig().display().to_string()])
            .args(["apply", "-k", &repo_root().join(variant).display().to_string()])
            .args(["--dry-run=server", "--server-side", "--force-conflicts"])
            .output()
            .expect("kubectl runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{variant}: {stdout}{stderr}");
        let shared: &[&str] = if variant == "deploy/tenant-example" {
            &[]
        } else {
            &[
                "customresourcedefinition",
                "deployment",
                "service/gitcanary",
                "configmap/gitcanary-config",
            ]
        };
        for kind in shared.iter().chain(kinds) {
            assert!(stdout.contains(kind), "{variant}: {kind} missing from:\n{stdout}");
        }
        assert!(!stderr.contains("PodSecurity"), "{variant}: {stderr}");
    }
}

#[tokio::test]
async fn the_tenant_example_bounds_what_a_commit_to_its_app_may_write() {
    let f = support::library::Fixture::new("tenant-example").await;
    let kubeconfig = service_account_kubeconfig(&f.client, f.cache.path()).await;
    apply_file(&f.client, &repo_root().join("deploy/tenant-example/tenant.yaml")).await;
    let configmap = |name: &str, ns: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata: {{k: v}}\n")
    };
    let inside = format!("{}-config", f.ns);
    f.repo.write("team-a/config.yaml", &configmap(&inside, "team-a"));
    f.repo.write("team-a/outside.yaml", &configmap("outside", &f.ns));
    f.repo.commit_and_push("team-a writes inside and outside its namespace");

    // The agent as deploy/ makes it, with the mapping of the example.
    let agent = gitcanary::cluster::Cluster::connect(Some(&kubeconfig), None)
        .await
        .expect("the agent's identity connects");
    let mut options = f.options(false);
    options.tenants.insert(
        "team-a".into(),
        "team-a/gitcanary-tenant".parse().expect("a ServiceAccount"),
    );
    let report = gitcanary::sync::sync(&agent, &f.revision().await, &options)
        .await
        .expect("sync runs");
    let team = report.app("team-a").expect("team-a");
    let problems: Vec<String> = team.problems.iter().map(ToString::to_string).collect();
    assert!(
        problems.iter().any(|p| p.starts_with("team-a/outside.yaml:1:")
            && p.contains("system:serviceaccount:team-a:gitcanary-tenant")
            && p.contains("forbidden")),
        "{problems:?}"
    );
    let inside_api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(f.client.clone(), "team-a");
    assert!(
        inside_api.get_opt(&inside).await.expect("readable").is_none(),
        "the app is whole or nothing"
    );
    assert!(f.configmaps().get_opt("outside").await.expect("readable").is_none());

    f.repo.remove("team-a/outside.yaml");
    f.repo.commit_and_push("team-a keeps to its namespace");
    let report = gitcanary::sync::sync(&agent, &f.revision().await, &options)
        .await
        .expect("sync runs");
    let team = report.app("team-a").expect("team-a");
    assert!(team.problems.is_empty(), "{:?}", team.problems);
    assert!(inside_api.get_opt(&inside).await.expect("readable").is_some());
}

#[tokio::test]
async fn the_namespaced_variant_syncs_and_heals_with_roles_only() {
    let scenario = Scenario::new("rbac-namespaced").await;
    let admin = &scenario.client;
    // deploy/namespaced/ for an account of this test's own, so that the
    // ClusterRole other tests bind to `gitcanary` plays no part.
    let account = "gitcanary-namespaced-test";
    apply_file(admin, &repo_root().join("deploy/base/namespace.yaml")).await;
    let rbac = std::fs::read_to_string(repo_root().join("deploy/namespaced/rbac.yaml"))
        .expect("readable")
        .replace(
            "  - kind: ServiceAccount\n    name: gitcanary\n",
            &format!("  - kind: ServiceAccount\n    name: {account}\n"),
        );
    let objects = scenario.cache.path().join("rbac.yaml");
    std::fs::write(&objects, rbac).expect("written");
    apply_file(admin, &repo_root().join("deploy/tenant-example/tenant.yaml")).await; // the namespace team-a
    apply_file(admin, &objects).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), AGENT_NAMESPACE);
    let body = serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}});
    accounts
        .patch(account, &PatchParams::apply("gitcanary-tests"), &Patch::Apply(&body))
        .await
        .expect("the account");
    let kubeconfig = token_kubeconfig(admin, account, scenario.cache.path()).await;

    let name = format!("{}-settings", scenario.ns);
    scenario.repo.write(
        "team-a/settings.yaml",
        &format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: team-a}}\ndata: {{color: blue}}\n"
        ),
    );
    scenario.repo.commit_and_push("settings in team-a");
    let kubeconfig_arg = kubeconfig.display().to_string();
    let agent = AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &[
            "--kubeconfig",
            &kubeconfig_arg,
            "--state-namespace",
            AGENT_NAMESPACE,
            "--namespaces",
            "team-a",
        ],
        &[],
    );
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(admin.clone(), "team-a");
    let color = || support::color_of(&configmaps, &name);
    eventually("synced with Roles only", WAIT, || async {
        (color().await.as_deref() == Some("blue")).then_some(())
    })
    .await;
    let edit = serde_json::json!({"data": {"color": "red"}});
    configmaps
        .patch(&name, &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .expect("edited by hand");
    eventually("the edit is put back", WAIT, || async {
        (color().await.as_deref() == Some("blue")).then_some(())
    })
    .await;
    let log = agent.log_text();
    assert!(!log.to_lowercase().contains("forbidden"), "{log}");
    assert!(!log.contains("watch interrupted"), "the watches are namespaced: {log}");
}

#[tokio::test]
async fn the_agent_may_impersonate_only_the_tenants_it_is_given_and_write_pods_only_there() {
    let admin = support::client().await;
    let dir = tempfile::tempdir().expect("dir");
    let _ = service_account_kubeconfig(&admin, dir.path()).await;
    apply_file(&admin, &repo_root().join("deploy/tenant-example/tenant.yaml")).await;
    let kubectl = support::kubeconfig().with_file_name("kubectl");
    let agent = format!("system:serviceaccount:{AGENT_NAMESPACE}:gitcanary");
    let can = |args: &[&str]| {
        let output = std::process::Command::new(&kubectl)
            .args(["--kubeconfig", &support::kubeconfig().display().to_string()])
            .args(["auth", "can-i", "--as", &agent])
            .args(args)
            .output()
            .expect("kubectl runs");
        String::from_utf8_lossy(&output.stdout).trim() == "yes"
    };
    // RBAC is read by the authorizer's cache: wait until the grant shows.
    eventually("the tenant example's grants are in force", WAIT, || async {
        can(&["impersonate", "serviceaccounts/gitcanary-tenant", "-n", "team-a"]).then_some(())
    })
    .await;
    for (args, allowed) in [
        (
            &["impersonate", "serviceaccounts/default", "-n", "kube-system"][..],
            false,
        ),
        (
            &[
                "impersonate",
                "serviceaccounts/generic-garbage-collector",
                "-n",
                "kube-system",
            ][..],
            false,
        ),
        (&["impersonate", "serviceaccounts/default", "-n", "team-a"][..], false),
        (
            &["impersonate", "serviceaccounts/gitcanary", "-n", AGENT_NAMESPACE][..],
            false,
        ),
        (
            &[
                "impersonate",
                "serviceaccounts/gitcanary-untrusted",
                "-n",
                AGENT_NAMESPACE,
            ][..],
            true,
        ),
        (&["impersonate", "users/admin"][..], false),
        (&["patch", "pods", "-n", "kube-system"][..], false),
        (&["patch", "pods", "-n", "team-a"][..], true),
    ] {
        assert_eq!(can(args), allowed, "kubectl auth can-i {}", args.join(" "));
    }
}
