//! The test control plane behaves like a cluster: workloads roll out on kwok
//! nodes, chosen pods never become ready, StatefulSet partitions hold, and
//! Gateway API routes are served.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use gateway_api::apis::standard::httproutes::{HttpRoute, HttpRouteRules, HttpRouteRulesBackendRefs, HttpRouteSpec};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn deployment(name: &str, replicas: i32, pod_labels: serde_json::Value) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {"containers": [{"name": "app", "image": "registry.test/echo:1.0"}]}
            }
        }
    }))
    .expect("a valid Deployment")
}

async fn available_replicas(api: &Api<Deployment>, name: &str) -> i32 {
    api.get(name)
        .await
        .expect("deployment readable")
        .status
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

#[tokio::test]
async fn deployment_of_three_replicas_becomes_available() {
    let client = support::client().await;
    let ns = support::namespace(&client, "cp-deploy").await;
    let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &deployment("web", 3, json!({"app": "web"})))
        .await
        .expect("created");
    support::eventually("3 available replicas", Duration::from_secs(60), || async {
        (available_replicas(&api, "web").await == 3).then_some(())
    })
    .await;
}

#[tokio::test]
async fn pods_labelled_never_ready_run_but_stay_unavailable() {
    let client = support::client().await;
    let ns = support::namespace(&client, "cp-never").await;
    let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let labels = json!({"app": "broken", "gitcanary.test/never-ready": "true"});
    api.create(&PostParams::default(), &deployment("broken", 2, labels))
        .await
        .expect("created");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    support::eventually("2 running pods", Duration::from_secs(60), || async {
        let list = pods.list(&ListParams::default().labels("app=broken")).await.ok()?;
        let running = list
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        (running == 2).then_some(())
    })
    .await;
    // The Deployment controller has counted both pods, and found them unavailable.
    support::eventually(
        "the controller counts 2 unavailable",
        Duration::from_secs(60),
        || async {
            let status = api.get("broken").await.ok()?.status?;
            (status.replicas == Some(2) && status.unavailable_replicas == Some(2)).then_some(())
        },
    )
    .await;
    assert_eq!(available_replicas(&api, "broken").await, 0);
    let ready = pods
        .list(&ListParams::default().labels("app=broken"))
        .await
        .expect("pods listed")
        .items
        .iter()
        .flat_map(|p| p.status.iter().flat_map(|s| s.conditions.iter().flatten()))
        .filter(|c| c.type_ == "Ready" && c.status == "True")
        .count();
    assert_eq!(ready, 0, "no pod of a never-ready template may become Ready");
}

#[tokio::test]
async fn statefulset_partition_updates_only_ordinals_at_or_above_it() {
    let client = support::client().await;
    let ns = support::namespace(&client, "cp-sts").await;
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {
            "replicas": 3,
            "serviceName": "db",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "db"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {"containers": [{"name": "db", "image": "registry.test/db:1"}]}
            }
        }
    }))
    .expect("a valid StatefulSet");
    api.create(&PostParams::default(), &sts).await.expect("created");
    support::eventually("3 ready pods", Duration::from_secs(60), || async {
        let status = api.get("db").await.ok()?.status?;
        (status.ready_replicas == Some(3)).then_some(())
    })
    .await;

    let patch =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "db", "image": "registry.test/db:2"}]}}}});
    api.patch("db", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("template updated");

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let images: BTreeMap<String, String> = support::eventually("db-2 updated", Duration::from_secs(60), || async {
        let status = api.get("db").await.ok()?.status?;
        if status.updated_replicas != Some(1) || status.ready_replicas != Some(3) {
            return None;
        }
        let list = pods.list(&ListParams::default().labels("app=db")).await.ok()?;
        Some(
            list.items
                .iter()
                .map(|p| {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    let image = p
                        .spec
                        .as_ref()
                        .map(|s| s.containers[0].image.clone().unwrap_or_default())
                        .unwrap_or_default();
                    (name, image)
                })
                .collect(),
        )
    })
    .await;
    assert_eq!(images["db-2"], "registry.test/db:2");
    assert_eq!(images["db-1"], "registry.test/db:1");
    assert_eq!(images["db-0"], "registry.test/db:1");
}

#[tokio::test]
async fn httproute_with_two_weighted_backends_reads_back_through_gateway_api_types() {
    let client = support::client().await;
    let ns = support::namespace(&client, "cp-route").await;
    let api: Api<HttpRoute> = Api::namespaced(client.clone(), &ns);
    let backend = |name: &str, weight: i32| HttpRouteRulesBackendRefs {
        name: name.to_string(),
        port: Some(80),
        weight: Some(weight),
        ..Default::default()
    };
    let route = HttpRoute::new(
        "echo",
        HttpRouteSpec {
            rules: Some(vec![HttpRouteRules {
                backend_refs: Some(vec![backend("echo", 90), backend("echo-canary", 10)]),
                ..Default::default()
            }]),
            ..Default::default()
        },
    );
    api.create(&PostParams::default(), &route)
        .await
        .expect("the API server accepts the route");
    let read = api.get("echo").await.expect("route readable");
    let weights: Vec<(String, Option<i32>)> = read.spec.rules.expect("rules")[0]
        .backend_refs
        .clone()
        .expect("backend refs")
        .into_iter()
        .map(|b| (b.name, b.weight))
        .collect();
    assert_eq!(
        weights,
        vec![("echo".to_string(), Some(90)), ("echo-canary".to_string(), Some(10))]
    );
}
