//! A brand-new app is whole or nothing, whatever the API server answers:
//! for each status it may refuse an object with (400, 403, 404, 409, 422,
//! 500), what was applied of that app is taken back, and the app's problem
//! is one line naming the object and the server's reason.

mod support;

use gitcanary::sync::{AppResult, sync};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use support::library::Fixture;

/// The status the API server gives to a server-side apply of `object` (as
/// gitcanary makes it: not forced, strict field validation), asked as a dry run.
async fn status_for(client: &kube::Client, object: &Value) -> u16 {
    let (group, version) = object["apiVersion"]
        .as_str()
        .expect("apiVersion")
        .rsplit_once('/')
        .unwrap_or(("", object["apiVersion"].as_str().expect("apiVersion")));
    let gvk = GroupVersionKind::gvk(group, version, object["kind"].as_str().expect("kind"));
    let (resource, _) = kube::discovery::pinned_kind(client, &gvk).await.expect("a served kind");
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        object["metadata"]["namespace"].as_str().expect("namespaced"),
        &resource,
    );
    let name = object["metadata"]["name"].as_str().expect("name");
    match api
        .patch(
            name,
            &PatchParams::apply("gitcanary").validation_strict().dry_run(),
            &Patch::Apply(object),
        )
        .await
    {
        Ok(_) => 200,
        Err(kube::Error::Api(status)) => status.code,
        Err(other) => panic!("no answer from the API server: {other}"),
    }
}

fn to_yaml(object: &Value) -> String {
    serde_saphyr::to_string(object).expect("YAML")
}

#[tokio::test]
async fn a_new_app_refused_with_any_status_is_taken_back_whole() {
    let f = Fixture::new("take-back").await;
    let (client, ns, repo) = (&f.client, &f.ns, &f.repo);
    let create = PostParams::default();

    // 403: a quota that allows no Service in this namespace.
    let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> = Api::namespaced(client.clone(), ns);
    let quota =
        serde_json::from_value(json!({"metadata": {"name": "no-services"}, "spec": {"hard": {"services": "0"}}}))
            .expect("a quota");
    quotas.create(&create, &quota).await.expect("quota");
    // 409: someone else's ConfigMap, whose field gitcanary's manifest sets otherwise.
    let theirs: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "contested"}, "data": {"color": "red"}}))
            .expect("a ConfigMap");
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    configmaps
        .patch("contested", &PatchParams::apply("someone-else"), &Patch::Apply(&theirs))
        .await
        .expect("their ConfigMap");
    // 500: an admission webhook that cannot be reached, for objects labelled for it.
    let webhook_name = format!("{ns}.unreachable.test");
    let webhooks: Api<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration> =
        Api::all(client.clone());
    let webhook = serde_json::from_value(json!({
        "metadata": {"name": webhook_name},
        "webhooks": [{
            "name": webhook_name,
            "clientConfig": {"url": "https://127.0.0.1:1/validate"},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "objectSelector": {"matchLabels": {"test.gitcanary.io/webhook": "unreachable"}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 2,
        }]
    }))
    .expect("a webhook configuration");
    webhooks.create(&create, &webhook).await.expect("webhook");

    let cases: Vec<(u16, Value)> = vec![
        // Exported with `kubectl get -o yaml`: the server's own bookkeeping in the body.
        (
            400,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "exported", "namespace": ns,
                "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {}}]}}),
        ),
        (
            403,
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "over-quota", "namespace": ns},
                "spec": {"ports": [{"port": 80}]}}),
        ),
        (
            404,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "lost", "namespace": format!("{ns}-missing")}}),
        ),
        (
            409,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "contested", "namespace": ns},
                "data": {"color": "blue"}}),
        ),
        (
            422,
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bad-port", "namespace": ns},
                "spec": {"ports": [{"port": 99999}]}}),
        ),
        (
            500,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unreachable", "namespace": ns,
                "labels": {"test.gitcanary.io/webhook": "unreachable"}}}),
        ),
    ];
    for (status, object) in &cases {
        assert_eq!(
            status_for(client, object).await,
            *status,
            "the API server answers {status} for {}",
            object["metadata"]["name"]
        );
        let app = format!("refused-{status}");
        repo.write(
            &format!("{app}/config.yaml"),
            &format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {app}-config\n  namespace: {ns}\ndata: {{color: blue}}\n"),
        );
        repo.write(&format!("{app}/refused.yaml"), &to_yaml(object));
    }
    repo.write(
        "fine/config.yaml",
        &format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fine\n  namespace: {ns}\ndata: {{color: blue}}\n"
        ),
    );
    repo.commit_and_push("six new apps the API server refuses, one it accepts");

    let report = sync(&f.cluster, &f.revision().await, &f.options(false))
        .await
        .expect("sync runs");
    for (status, object) in &cases {
        let app = format!("refused-{status}");
        let found = report.app(&app).expect("the app");
        assert_eq!(found.result, AppResult::Invalid, "{app}: {:?}", found.problems);
        let problems: Vec<String> = found.problems.iter().map(ToString::to_string).collect();
        assert_eq!(problems.len(), 1, "{app}: {problems:?}");
        let name = object["metadata"]["name"].as_str().expect("name");
        // Refused by the dry run before anything is written, or, for an
        // object the dry run cannot reach (a namespace that does not exist),
        // when it is applied.
        assert!(
            problems[0].starts_with(&format!("{app}/refused.yaml:1: "))
                && (problems[0].contains(&format!("{name} refused by the API server: "))
                    || problems[0].contains("applying "))
                && problems[0].contains(name),
            "{app}: {problems:?}"
        );
        assert!(
            !problems[0].contains('\n') && !problems[0].contains("ErrorResponse") && !problems[0].contains("Status {"),
            "{app}: one line in the server's words: {problems:?}"
        );
        assert!(
            configmaps
                .get_opt(&format!("{app}-config"))
                .await
                .expect("readable")
                .is_none(),
            "{app}: what was applied is taken back"
        );
    }
    let contested = configmaps.get("contested").await.expect("their ConfigMap stays");
    assert_eq!(
        contested.data.and_then(|d| d.get("color").cloned()).as_deref(),
        Some("red")
    );
    assert_eq!(report.app("fine").expect("fine").result, AppResult::Synced);
    assert!(configmaps.get_opt("fine").await.expect("readable").is_some());
    webhooks
        .delete(&webhook_name, &Default::default())
        .await
        .expect("webhook removed");
}
