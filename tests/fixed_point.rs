//! Real repositories reach a fixed point: once synced, a repository of
//! manifests in the shapes people write them (`tests/real-world/`) syncs
//! again with no write, no drift and a clean `diff`, however the API server
//! normalised them; a real edit is still put back, with one write.

mod support;

use std::path::Path;
use std::time::Duration;

use gitcanary::manifest::ObjectKey;
use gitcanary::sync::{SyncReport, diff, sync};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};

/// Every file of `tests/real-world/` (but its README), with the namespace put in.
fn real_world_files(ns: &str) -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/real-world");
    let mut files = Vec::new();
    for app in std::fs::read_dir(&root).expect("tests/real-world") {
        let app = app.expect("entry").path();
        if !app.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(&app).expect("app dir") {
            let file = file.expect("entry").path();
            let relative = file.strip_prefix(&root).expect("under root").display().to_string();
            let content = std::fs::read_to_string(&file).expect("readable");
            files.push((relative, content.replace("NAMESPACE", ns)));
        }
    }
    files.sort();
    files
}

/// Every (app, object) a sync wrote or healed.
fn writes(report: &SyncReport) -> Vec<(String, ObjectKey)> {
    report
        .apps
        .iter()
        .flat_map(|app| {
            app.applied
                .iter()
                .chain(&app.drifted)
                .map(move |key| (app.app.clone(), key.clone()))
        })
        .collect()
}

#[tokio::test]
async fn real_world_manifests_sync_once_then_never_again_and_an_edit_is_healed_with_one_write() {
    let f = support::library::Fixture::new("fixed").await;
    let files = real_world_files(&f.ns);
    assert!(files.len() >= 11, "the corpus is all there: {files:?}");
    for (path, content) in &files {
        f.repo.write(path, content);
    }
    f.repo.commit_and_push("real-world manifests");
    let options = f.options(true);

    let first = sync(&f.cluster, &f.revision().await, &options)
        .await
        .expect("sync runs");
    assert!(first.is_clean(), "{:?}", first.problems().collect::<Vec<_>>());
    let apps = first.apps.len();
    assert_eq!(apps, 9, "{:?}", first.apps.iter().map(|a| &a.app).collect::<Vec<_>>());
    assert!(first.apps.iter().all(|a| !a.applied.is_empty()));

    // The HPA owns podinfo's replicas (Git sets none): wait until it has set them.
    let deployments: Api<Deployment> = Api::namespaced(f.client.clone(), &f.ns);
    support::eventually(
        "the HPA scales podinfo to its minimum",
        Duration::from_secs(90),
        || async {
            let replicas = deployments.get("podinfo").await.ok()?.spec?.replicas;
            (replicas == Some(2)).then_some(())
        },
    )
    .await;

    // The fixed point: nothing written, nothing healed, nothing to show.
    let second = sync(&f.cluster, &f.revision().await, &options)
        .await
        .expect("sync runs");
    assert!(second.is_clean(), "{:?}", second.problems().collect::<Vec<_>>());
    assert_eq!(writes(&second), vec![], "a resync of what is in place writes nothing");
    let (diffs, problems, _) = diff(&f.cluster, &f.revision().await, &options)
        .await
        .expect("diff runs");
    assert!(problems.is_empty(), "{problems:?}");
    assert!(
        diffs.is_empty(),
        "diff shows no change:\n{}",
        diffs.iter().map(|d| d.unified.as_str()).collect::<String>()
    );
    let podinfo = deployments.get("podinfo").await.expect("podinfo");
    assert_eq!(
        podinfo.spec.as_ref().and_then(|s| s.replicas),
        Some(2),
        "the HPA's replicas stay"
    );

    // A real edit of a field Git sets, as `kubectl edit` makes it.
    let edit = serde_json::json!({"spec": {"template": {"spec": {"containers": [
        {"name": "podinfod", "resources": {"limits": {"cpu": "3"}}}]}}}});
    deployments
        .patch("podinfo", &PatchParams::apply("kubectl-edit"), &Patch::Strategic(&edit))
        .await
        .expect("edited");
    let diffs = diff(&f.cluster, &f.revision().await, &options)
        .await
        .expect("diff runs")
        .0;
    assert_eq!(diffs.len(), 1, "{diffs:?}");
    let changed_lines = diffs[0]
        .unified
        .lines()
        .filter(|l| (l.starts_with('-') || l.starts_with('+')) && !l.starts_with("---") && !l.starts_with("+++"))
        .count();
    assert!(
        diffs[0]
            .unified
            .lines()
            .any(|l| l.starts_with('-') && l.trim_start_matches('-').trim() == "cpu: \"3\"")
            && diffs[0]
                .unified
                .lines()
                .any(|l| l.starts_with('+') && l.trim_start_matches('+').trim() == "cpu: \"2\"")
            && changed_lines == 2,
        "the body shows the field that differs, and only it:\n{}",
        diffs[0].unified
    );
    let healed = sync(&f.cluster, &f.revision().await, &options)
        .await
        .expect("sync runs");
    let podinfo = healed.app("podinfo").expect("podinfo");
    let names = |keys: &[ObjectKey]| {
        keys.iter()
            .map(|k| format!("{}/{}", k.kind, k.name))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(&podinfo.drifted),
        vec!["Deployment/podinfo"],
        "reported as drift healed"
    );
    assert_eq!(
        writes(&healed)
            .iter()
            .filter(|(_, key)| !podinfo.drifted.contains(key))
            .collect::<Vec<_>>(),
        Vec::<&(String, ObjectKey)>::new(),
        "exactly one write"
    );
    let cpu = deployments
        .get("podinfo")
        .await
        .expect("podinfo")
        .spec
        .expect("spec")
        .template
        .spec
        .expect("pod")
        .containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("cpu"))
        .map(|q| q.0.clone());
    assert_eq!(cpu.as_deref(), Some("2"), "Git's 2000m, as the server stores it");

    let third = sync(&f.cluster, &f.revision().await, &options)
        .await
        .expect("sync runs");
    assert_eq!(writes(&third), vec![], "healed, it stays put");
}
