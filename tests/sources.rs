//! Kustomize and Helm sources, rendered by the real programs (built by
//! scripts/renderers.sh and put on PATH by scripts/test.sh).

mod support;

use std::path::Path;
use std::time::Duration;

use gitcanary::manifest::{Manifest, ManifestSet};
use gitcanary::render::{Capabilities, Renderers, load_dir};
use gitcanary::rollout::api::{Phase, Rollout};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use support::agent::Scenario;
use support::eventually;
use support::git_server::GitRepo;

fn examples(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(name)
}

fn find<'s>(set: &'s ManifestSet, app: &str, kind: &str, name: &str) -> &'s Manifest {
    set.apps[app]
        .manifests
        .iter()
        .find(|m| m.kind() == kind && m.name() == name)
        .unwrap_or_else(|| {
            panic!(
                "{kind} {name} in {app}: {:?}",
                set.apps[app]
                    .manifests
                    .iter()
                    .map(|m| (m.kind(), m.name()))
                    .collect::<Vec<_>>()
            )
        })
}

#[test]
fn a_kustomize_base_and_its_overlays_render_with_the_files_they_came_from() {
    let set = load_dir(&examples("kustomize"), &Renderers::default()).expect("loads");
    assert_eq!(set.problems().count(), 0, "{:?}", set.problems().collect::<Vec<_>>());

    let production = find(&set, "shop", "Deployment", "shop");
    assert_eq!(production.namespace(), Some("shop"));
    assert_eq!(production.object["spec"]["replicas"], 4, "the overlay's patch");
    let container = &production.object["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "registry.example/shop:1.0");
    assert_eq!(production.file, "shop/base/deployment.yaml");
    assert!(
        production.object["metadata"].get("annotations").is_none(),
        "origin annotations are gitcanary's own, removed"
    );

    // The generator's hashed name, referenced from the pod template.
    let config = set.apps["shop"]
        .manifests
        .iter()
        .find(|m| m.kind() == "ConfigMap")
        .expect("generated");
    assert!(config.name().starts_with("shop-config-"), "{}", config.name());
    assert_eq!(container["envFrom"][0]["configMapRef"]["name"], config.name());
    assert_eq!(config.file, "shop/base/kustomization.yaml");
    assert_eq!(
        find(&set, "shop", "Rollout", "shop").file,
        "shop/overlays/production/rollout.yaml"
    );

    let staging = find(&set, "shop-staging", "Deployment", "staging-shop");
    assert_eq!(staging.namespace(), Some("shop-staging"));
    assert_eq!(
        staging.object["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.example/shop:1.1"
    );
    assert_eq!(staging.app, "shop-staging");
    assert_eq!(staging.file, "shop/base/deployment.yaml");
    assert_eq!(
        find(&set, "shop-staging", "Namespace", "shop-staging").file,
        "shop/overlays/staging/namespace.yaml"
    );
}

#[test]
fn a_chart_renders_with_its_values_files_its_dependency_and_the_clusters_capabilities() {
    let renderers = Renderers::default();
    let set = load_dir(&examples("helm"), &renderers).expect("loads");
    assert_eq!(set.problems().count(), 0, "{:?}", set.problems().collect::<Vec<_>>());
    let deployment = find(&set, "web", "Deployment", "web");
    assert_eq!(
        deployment.object["spec"]["replicas"], 3,
        "values-production.yaml over values.yaml"
    );
    assert_eq!(deployment.namespace(), Some("web"));
    assert_eq!(deployment.file, "web/templates/deployment.yaml");
    assert_eq!(
        find(&set, "web", "ConfigMap", "web-cache").file,
        "web/charts/cache/templates/configmap.yaml"
    );
    assert!(
        !set.apps["web"].manifests.iter().any(|m| m.kind() == "HTTPRoute"),
        "offline, Helm's default API versions have no Gateway API"
    );

    // For a cluster that serves HTTPRoute, the chart's branch on .Capabilities renders it.
    renderers.set_capabilities(Capabilities {
        kube_version: "v1.36.3".into(),
        api_versions: vec![
            "gateway.networking.k8s.io/v1".into(),
            "gateway.networking.k8s.io/v1/HTTPRoute".into(),
        ],
    });
    let set = load_dir(&examples("helm"), &renderers).expect("loads");
    assert_eq!(find(&set, "web", "HTTPRoute", "web").file, "web/templates/route.yaml");
    let service = find(&set, "web", "Service", "web");
    assert_eq!(
        service.object["metadata"]["annotations"]["example.test/rendered-for"],
        "v1.36.3"
    );
    assert_eq!(renderers.renders(), 2);
    // Nothing changed: the same capabilities and files render nothing.
    load_dir(&examples("helm"), &renderers).expect("loads");
    assert_eq!(renderers.renders(), 2);
}

#[test]
fn a_render_kept_on_disk_serves_the_next_process() {
    let disk = tempfile::tempdir().expect("dir");
    let with_disk = || {
        let mut renderers = Renderers::default();
        renderers.disk = Some(disk.path().to_path_buf());
        renderers
    };
    let first = with_disk();
    let rendered = load_dir(&examples("kustomize"), &first).expect("loads");
    assert_eq!(first.renders(), 2);
    let second = with_disk();
    let again = load_dir(&examples("kustomize"), &second).expect("loads");
    assert_eq!(second.renders(), 0, "both apps come from disk");
    let names = |set: &ManifestSet| {
        set.apps["shop"]
            .manifests
            .iter()
            .map(|m| (m.kind().to_string(), m.name().to_string(), m.file.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&again), names(&rendered));
}

const WAIT: Duration = Duration::from_secs(90);

/// A Kustomize app `shop` (base + production overlay with `images:` and a
/// replicas patch, and a Rollout) in `ns`; `overlay_extra` is appended to the
/// overlay's kustomization.
fn write_shop(repo: &GitRepo, ns: &str, tag: &str, overlay_extra: &str) {
    repo.write("shop/gitcanary.yaml", "kustomize:\n  path: overlays/production\n");
    repo.write(
        "shop/base/kustomization.yaml",
        "resources: [deployment.yaml]\nconfigMapGenerator:\n- name: shop-config\n  literals: [greeting=hello]\n",
    );
    repo.write(
        "shop/base/deployment.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: shop\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {app: shop}\n  template:\n    metadata:\n      labels: {app: shop}\n    spec:\n      containers:\n      - name: shop\n        image: registry.test/shop:0\n        envFrom:\n        - configMapRef: {name: shop-config}\n",
    );
    repo.write(
        "shop/overlays/production/rollout.yaml",
        "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata:\n  name: shop\nspec:\n  workloadRef: {apiVersion: apps/v1, kind: Deployment, name: shop}\n  strategy:\n    canary:\n      steps:\n      - {replicas: 1, pause: {duration: 1}}\n      progressDeadline: 3s\n",
    );
    repo.write(
        "shop/overlays/production/kustomization.yaml",
        &format!("namespace: {ns}\nresources: [../../base, rollout.yaml]\nimages:\n- name: registry.test/shop\n  newTag: \"{tag}\"\npatches:\n- target: {{kind: Deployment, name: shop}}\n  patch: |\n    - op: replace\n      path: /spec/replicas\n      value: 2\n{overlay_extra}"),
    );
}

/// A chart `web` whose production values set the replicas.
fn write_chart(repo: &GitRepo, ns: &str, production_replicas: u32) {
    repo.write(
        "web/gitcanary.yaml",
        &format!("helm:\n  namespace: {ns}\n  valuesFiles: [values-production.yaml]\n"),
    );
    repo.write("web/Chart.yaml", "apiVersion: v2\nname: web\nversion: 0.1.0\n");
    repo.write("web/values.yaml", "replicas: 1\n");
    repo.write(
        "web/values-production.yaml",
        &format!("replicas: {production_replicas}\n"),
    );
    repo.write(
        "web/templates/deployment.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ .Release.Name }}\n  namespace: {{ .Release.Namespace }}\n  annotations:\n    example.test/kube-minor: \"{{ .Capabilities.KubeVersion.Minor }}\"\nspec:\n  replicas: {{ .Values.replicas }}\n  selector:\n    matchLabels: {app: web}\n  template:\n    metadata:\n      labels: {app: web}\n    spec:\n      containers:\n      - name: web\n        image: registry.test/web:1\n",
    );
}

async fn deployment(client: &kube::Client, ns: &str, name: &str) -> Option<Deployment> {
    Api::<Deployment>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()
}

fn image_of(deployment: &Deployment) -> Option<String> {
    deployment.spec.as_ref()?.template.spec.as_ref()?.containers[0]
        .image
        .clone()
}

#[tokio::test]
async fn rendered_apps_sync_and_only_the_app_that_changed_is_rendered_again() {
    let scenario = Scenario::new("src-sync").await;
    let ns = scenario.ns.clone();
    write_shop(&scenario.repo, &ns, "1.0", "");
    write_chart(&scenario.repo, &ns, 3);
    scenario.repo.commit_and_push("shop (Kustomize) and web (Helm)");
    let agent = scenario.start_agent();
    let (shop, web) = eventually("both apps synced", WAIT, || async {
        Some((
            deployment(&scenario.client, &ns, "shop").await?,
            deployment(&scenario.client, &ns, "web").await?,
        ))
    })
    .await;
    assert_eq!(
        image_of(&shop).as_deref(),
        Some("registry.test/shop:1.0"),
        "the overlay's newTag"
    );
    assert_eq!(
        shop.spec.as_ref().and_then(|s| s.replicas),
        Some(2),
        "the overlay's patch"
    );
    let annotations = shop.metadata.annotations.unwrap_or_default();
    assert_eq!(annotations["gitcanary.io/source"], "shop/base/deployment.yaml:1");
    assert!(
        !annotations.contains_key("config.kubernetes.io/origin"),
        "{annotations:?}"
    );
    assert_eq!(
        web.spec.as_ref().and_then(|s| s.replicas),
        Some(3),
        "values-production.yaml"
    );
    let web_annotations = web.metadata.annotations.unwrap_or_default();
    assert_eq!(
        web_annotations["gitcanary.io/source"],
        "web/templates/deployment.yaml:1"
    );
    let minor = scenario.client.apiserver_version().await.expect("version").minor;
    assert_eq!(
        web_annotations["example.test/kube-minor"], minor,
        "rendered for the cluster's version"
    );
    eventually("shop healthy", WAIT, || async {
        let rollout = Api::<Rollout>::namespaced(scenario.client.clone(), &ns)
            .get_opt("shop")
            .await
            .ok()??;
        (rollout.status?.phase == Phase::Healthy).then_some(())
    })
    .await;
    assert_eq!(agent.counter("gitcanary_renders_total").await, 2);

    // Resyncs with nothing changed render nothing.
    agent.resyncs(2).await;
    assert_eq!(agent.counter("gitcanary_renders_total").await, 2);

    // One chart's values change: that app alone is rendered again.
    write_chart(&scenario.repo, &ns, 4);
    scenario.repo.commit_and_push("web: 4 replicas");
    eventually("web scaled", WAIT, || async {
        (deployment(&scenario.client, &ns, "web").await?.spec?.replicas == Some(4)).then_some(())
    })
    .await;
    assert_eq!(agent.counter("gitcanary_renders_total").await, 3);
}

#[tokio::test]
async fn a_new_tag_through_kustomize_is_a_canary_release_and_its_revert_restores_the_kustomization() {
    let scenario = Scenario::new("src-release").await;
    let ns = scenario.ns.clone();
    write_shop(&scenario.repo, &ns, "1.0", "");
    scenario.repo.commit_and_push("shop 1.0");
    let _agent = scenario.start_agent();
    let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &ns);
    eventually("shop healthy on 1.0", WAIT, || async {
        let healthy = rollouts.get_opt("shop").await.ok()??.status?.phase == Phase::Healthy;
        let image = image_of(&deployment(&scenario.client, &ns, "shop").await?)?;
        (healthy && image == "registry.test/shop:1.0").then_some(())
    })
    .await;
    let stable = scenario.git(&["show", "main:shop/overlays/production/kustomization.yaml"]);

    // 2.0 never becomes ready (kwok holds pods with this label back).
    let never_ready = "- target: {kind: Deployment, name: shop}\n  patch: |\n    - op: add\n      path: /spec/template/metadata/labels/gitcanary.test~1never-ready\n      value: \"true\"\n";
    write_shop(&scenario.repo, &ns, "2.0", never_ready);
    let broken = scenario.repo.commit_and_push("shop 2.0");
    let canary = eventually("a canary of 2.0", WAIT, || async {
        let canary = deployment(&scenario.client, &ns, "shop-canary").await?;
        (image_of(&canary)? == "registry.test/shop:2.0").then_some(canary)
    })
    .await;
    assert_eq!(
        image_of(&deployment(&scenario.client, &ns, "shop").await.expect("stable")).as_deref(),
        Some("registry.test/shop:1.0"),
        "the stable Deployment waits for the release"
    );
    assert!(canary.metadata.owner_references.is_some_and(|o| o[0].kind == "Rollout"));

    let (revert, message) = scenario
        .wait_for_commit("the revert commit", |m| {
            m.contains(&format!("Gitcanary-Reverts: {broken}"))
        })
        .await;
    assert!(
        message.contains("shop/overlays/production/kustomization.yaml"),
        "{message}"
    );
    assert_eq!(
        scenario.git(&["show", &format!("{revert}:shop/overlays/production/kustomization.yaml")]),
        stable,
        "the source file is restored, not rendered output"
    );
    eventually("canary removed, stable on 1.0", WAIT, || async {
        let gone = deployment(&scenario.client, &ns, "shop-canary").await.is_none();
        let image = image_of(&deployment(&scenario.client, &ns, "shop").await?)?;
        (gone && image == "registry.test/shop:1.0").then_some(())
    })
    .await;
}

#[tokio::test]
async fn bad_sources_are_refused_with_the_app_and_file_named_and_the_other_apps_sync() {
    let scenario = Scenario::new("src-bad").await;
    let ns = scenario.ns.clone();
    let repo = &scenario.repo;
    let config_map =
        |name: &str| format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\n");
    repo.write("good/cm.yaml", &config_map("good"));
    repo.write("outside/kustomization.yaml", "resources:\n- cm.yaml\n- ../../outside\n");
    repo.write("outside/cm.yaml", &config_map("outside"));
    repo.write(
        "remote/kustomization.yaml",
        "resources:\n- cm.yaml\n- https://github.com/acme/bases//web?ref=v1\n",
    );
    repo.write("remote/cm.yaml", &config_map("remote"));
    let chart = |app: &str, chart: &str, template: &str| {
        repo.write(&format!("{app}/Chart.yaml"), chart);
        repo.write(&format!("{app}/templates/cm.yaml"), &config_map(app));
        repo.write(&format!("{app}/templates/extra.yaml"), template);
    };
    let plain_chart = "apiVersion: v2\nname: c\nversion: 0.1.0\n";
    chart(
        "broken-template",
        plain_chart,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  a: {{ .Values.missing.key }}\n",
    );
    chart(
        "missing-dependency",
        "apiVersion: v2\nname: c\nversion: 0.1.0\ndependencies:\n- name: redis\n  version: 1.0.0\n",
        "",
    );
    chart(
        "slow",
        plain_chart,
        "{{- range $i := until 20000 }}{{- range $j := until 20000 }}{{- end }}{{- end }}\n",
    );
    chart(
        "huge",
        plain_chart,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: huge\ndata:\n{{- range $i := until 100000 }}\n  k{{ $i }}: \"0123456789\"\n{{- end }}\n",
    );
    repo.commit_and_push("one good app, six bad ones");

    let (code, stdout, stderr) = scenario.sync_once(&["--render-timeout", "3", "--render-max-output", "1000000"]);
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    let problem = |prefix: &str, words: &[&str]| {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no problem at {prefix}:\n{stdout}"));
        for word in words {
            assert!(line.contains(word), "{line:?} lacks {word:?}");
        }
    };
    problem("outside/kustomization.yaml:3:", &["outside the repository"]);
    problem("remote/kustomization.yaml:3:", &["remote", "--render-allow-remote"]);
    problem(
        "broken-template/templates/extra.yaml:6:",
        &["app broken-template", "nil pointer"],
    );
    problem("missing-dependency/Chart.yaml:5:", &["\"redis\"", "not vendored"]);
    problem("slow/Chart.yaml:1:", &["app slow", "after 3 s"]);
    problem("huge/Chart.yaml:1:", &["app huge", "1000000-byte cap"]);

    let config_maps: Api<ConfigMap> = Api::namespaced(scenario.client.clone(), &ns);
    assert!(
        config_maps.get_opt("good").await.expect("get").is_some(),
        "the good app synced"
    );
    for app in [
        "outside",
        "remote",
        "broken-template",
        "missing-dependency",
        "slow",
        "huge",
    ] {
        assert!(
            config_maps.get_opt(app).await.expect("get").is_none(),
            "nothing of {app} is applied"
        );
    }
}

#[test]
fn validate_renders_offline_and_names_the_template_that_failed() {
    let validate = |dir: &Path| {
        let output = support::agent::gitcanary()
            .args(["validate", &dir.display().to_string()])
            .output()
            .expect("runs");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    for example in ["kustomize", "helm"] {
        let (code, stdout) = validate(&examples(example));
        assert_eq!(code, Some(0), "{stdout}");
    }

    let dir = tempfile::tempdir().expect("dir");
    let write = |path: &str, content: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, content).expect("write");
    };
    write("web/Chart.yaml", "apiVersion: v2\nname: web\nversion: 0.1.0\n");
    write(
        "web/templates/deployment.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: \"three\"\n",
    );
    write(
        "web/templates/broken.yaml",
        "metadata:\n  name: {{ .Values.name | nosuchfunction }}\n",
    );
    let (code, stdout) = validate(dir.path());
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.starts_with("web/templates/broken.yaml:2: app web: helm:"),
        "{stdout}"
    );
    assert!(stdout.contains("nosuchfunction"), "{stdout}");

    // Without the template error, the rendered object's own problem names its template.
    std::fs::remove_file(dir.path().join("web/templates/broken.yaml")).expect("rm");
    let (code, stdout) = validate(dir.path());
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.starts_with("web/templates/deployment.yaml:1:"), "{stdout}");
}

#[test]
fn a_release_name_that_is_a_helm_flag_reads_no_file_and_is_reported_at_its_line() {
    let dir = tempfile::tempdir().expect("dir");
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "the-agents-token-4711").expect("write");
    let app = tempfile::tempdir().expect("dir");
    let write = |path: &str, content: &str| {
        let path = app.path().join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, content).expect("write");
    };
    write("web/Chart.yaml", "apiVersion: v2\nname: web\nversion: 0.1.0\n");
    write("web/templates/leak.yaml", "{{ fail .Values.x }}\n");
    write(
        "web/gitcanary.yaml",
        &format!("helm:\n  releaseName: \"--set-file=x={}\"\n", secret.display()),
    );
    let output = support::agent::gitcanary()
        .args(["validate", &app.path().display().to_string()])
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(!stdout.contains("the-agents-token-4711"), "{stdout}");
    assert!(stdout.starts_with("web/gitcanary.yaml:2: helm.releaseName"), "{stdout}");
}
