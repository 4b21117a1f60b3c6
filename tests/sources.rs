//! Kustomize and Helm sources, rendered by the real programs (built by
//! scripts/renderers.sh and put on PATH by scripts/test.sh).

mod support;

use std::path::Path;

use gitcanary::manifest::{Manifest, ManifestSet, load_dir};
use gitcanary::render::{Capabilities, Renderers};

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
