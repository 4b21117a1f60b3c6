//! The report stage of a Rollout. An app's Rollouts are first all observed
//! (`rollout::observe::observe_rollouts`), then planned together
//! (`desired::plan_rollouts`: pure, overlays on the app's objects and the
//! canary objects to write or delete, all applied by the sync's one
//! executor); once the app is applied, and after prune, they are reported
//! here: pod batch labels, the Rollout's status and Events.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::json;
use tracing::{Instrument, info, info_span, warn};

use super::api::{API_VERSION, KIND, RolloutStatus, annotation_of};
use super::model::RolloutWork;
use super::overlay::{BATCH_ID_LABEL, ROLLOUT_ID_LABEL};
use super::plan::Severity;
use crate::cluster::Writer;
use crate::{Error, Result};

/// Writes a Rollout's whole status with gitcanary's field manager; returns
/// the Rollout as the API server stored it.
async fn apply_status(
    agent: &Writer<'_>,
    namespace: &str,
    name: &str,
    status: &RolloutStatus,
) -> Result<DynamicObject> {
    let body = json!({"apiVersion": API_VERSION, "kind": KIND, "status": status});
    let written = async {
        let resolved = agent.cluster().served(API_VERSION, KIND).await?;
        agent.apply_status(&resolved, Some(namespace), name, &body).await
    };
    written
        .await
        .map_err(Error::kube(format!("writing the status of Rollout {namespace}/{name}")))
}

/// After the app is applied (and the canary objects no longer wanted are
/// deleted): batch labels, status, Events, written by `agent` (the
/// agent's identity, fenced by the app's shard).
pub async fn finish(agent: &Writer<'_>, work: &RolloutWork) -> Result<()> {
    let span = info_span!("rollout", namespace = %work.namespace, rollout = %work.name, rollout_id = %work.plan.status.rollout_id);
    finish_rollout(agent, work).instrument(span).await
}

/// Nothing here reads the Rollout: what it needs (its uid, the signals
/// the planner ignored) was observed, or is in the status write's answer.
async fn finish_rollout(agent: &Writer<'_>, work: &RolloutWork) -> Result<()> {
    if let Some(step) = work.plan.batch_step {
        label_batch(agent, work, step, &work.plan.status.rollout_id).await?;
    }
    let written = match work.plan.changed {
        true => Some(apply_status(agent, &work.namespace, &work.name, &work.plan.status).await?),
        false => None,
    };
    clear_ignored_signals(agent, work).await;
    for transition in &work.plan.transitions {
        info!("{transition}");
    }
    // As the status write answered (a Rollout this sync created has no
    // other uid, and its first status always changes), else as observed.
    let uid = written
        .and_then(|rollout| rollout.metadata.uid)
        .or_else(|| work.rollout_uid.clone());
    if let Some(uid) = uid.filter(|_| !work.plan.transitions.is_empty()) {
        record_events(agent, work, uid).await;
    }
    if let Some(cause) = &work.plan.failed {
        warn!(%cause, "release failed: traffic back on stable, canary removed");
    }
    Ok(())
}

/// Removes the annotations of signals the planner ignored, each only if it
/// still holds the value the planner saw (the patch's `test`: a newer one
/// is left for the next reconcile). Best effort: the status already
/// records them as spent.
async fn clear_ignored_signals(agent: &Writer<'_>, work: &RolloutWork) {
    if work.plan.ignored_signals.is_empty() {
        return;
    }
    let Some(resolved) = agent.cluster().resolve(API_VERSION, KIND).await else {
        return;
    };
    for (signal, value) in &work.plan.ignored_signals {
        let Some(patch) = remove_if_unchanged(annotation_of(*signal), value) else {
            continue;
        };
        match agent
            .patch_json(&resolved, Some(&work.namespace), &work.name, patch)
            .await
        {
            Ok(_) => {}
            Err(error) if agent.may_write().is_err() => {
                info!(%error, "an ignored signal was not cleared: the app's shard is another replica's now");
                return;
            }
            Err(error) => info!(%error, "an ignored signal was not cleared (the Rollout changed meanwhile)"),
        }
    }
}

/// A JSON patch that removes annotation `key` only while it holds `value`.
fn remove_if_unchanged(key: &str, value: &str) -> Option<json_patch::Patch> {
    // RFC 6901: '~' and '/' in a key are escaped.
    let path = format!("/metadata/annotations/{}", key.replace('~', "~0").replace('/', "~1"));
    let operations = json!([
        {"op": "test", "path": path, "value": value},
        {"op": "remove", "path": path},
    ]);
    serde_json::from_value(operations).ok()
}

/// Kubernetes Events on the Rollout, one per transition, so that
/// `kubectl describe rollout` tells the story. Best effort: a lost Event
/// never holds a release back.
async fn record_events(agent: &Writer<'_>, work: &RolloutWork, uid: String) {
    use kube::runtime::events::{Event, EventType};
    let reference = ObjectReference {
        api_version: Some(API_VERSION.to_string()),
        kind: Some(KIND.to_string()),
        namespace: Some(work.namespace.clone()),
        name: Some(work.name.clone()),
        uid: Some(uid),
        ..ObjectReference::default()
    };
    let events: Vec<Event> = work
        .plan
        .transitions
        .iter()
        .map(|transition| {
            let (severity, reason) = transition.event();
            let type_ = match severity {
                Severity::Normal => EventType::Normal,
                Severity::Warning => EventType::Warning,
            };
            Event {
                type_,
                reason: reason.to_string(),
                note: Some(transition.to_string().chars().take(1000).collect()),
                action: "Reconcile".to_string(),
                secondary: None,
            }
        })
        .collect();
    if let Err(error) = agent.publish_events(&events, &reference).await {
        warn!(%error, "cannot record an Event on the Rollout");
    }
}

/// Canary pods carry the release's id and the step that created them.
async fn label_batch(agent: &Writer<'_>, work: &RolloutWork, step: u32, rollout_id: &str) -> Result<()> {
    let cluster = agent.cluster();
    if work.revisions.canary.is_empty() {
        return Ok(());
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &work.namespace);
    let resolved = cluster
        .served("v1", "Pod")
        .await
        .map_err(Error::kube("labelling canary pods"))?;
    let canary = &work.revisions.canary;
    // Without a canary count (a promotion's pods), the pods are listed.
    let kept = work.plan.intent.canary_replicas.and_then(|expected| {
        let expected = expected.max(0) as usize;
        let pods = cluster.revision_pods.of(work.kind);
        pods.read(&work.namespace, |held| {
            crate::cluster::pods::unbatched(held, canary, expected)
        })?
    });
    let unbatched = match kept {
        Some(names) => names,
        None => {
            let selector = format!("{}={canary}", work.kind.revision_label());
            let list = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(Error::kube(format!("listing canary pods in {}", work.namespace)))?;
            list.items
                .into_iter()
                .filter(|pod| {
                    pod.metadata
                        .labels
                        .as_ref()
                        .is_none_or(|l| !l.contains_key(BATCH_ID_LABEL))
                })
                .filter_map(|pod| Some((pod.metadata.name?, pod.metadata.resource_version.unwrap_or_default())))
                .collect()
        }
    };
    for (name, seen) in unbatched {
        // On the version seen only: a pod labelled since keeps its batch.
        let patch = json!({"metadata": {"resourceVersion": seen, "labels": {
            BATCH_ID_LABEL: step.to_string(),
            ROLLOUT_ID_LABEL: rollout_id,
        }}});
        match agent.merge(&resolved, Some(&work.namespace), &name, &patch).await {
            // The next step must not take the pod for one still to label.
            Ok(_) => cluster
                .revision_pods
                .of(work.kind)
                .amend(&work.namespace, &name, |pod| pod.batched = true),
            // Gone, or changed since it was seen (labelled, perhaps): the
            // next step's look decides again.
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
            // Pods are written only where a Role grants it (deploy/): the
            // labels tell batches apart, they never hold a release back.
            Err(kube::Error::Api(status)) if status.code == 403 => {
                warn!(namespace = %work.namespace, "canary pods are not labelled with their batch: no pods patch in this namespace");
                return Ok(());
            }
            Err(e) => return Err(Error::kube(format!("labelling pod {}/{name}", work.namespace))(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ignored_signal_is_removed_only_while_it_holds_the_value_the_planner_saw() {
        let key = annotation_of(crate::rollout::api::Signal::Promote);
        let patch = remove_if_unchanged(key, "abc~1").expect("a patch");
        let operations = serde_json::to_value(&patch).expect("patch");
        let path = format!("/metadata/annotations/{}", key.replace('/', "~1"));
        assert_eq!(
            operations,
            json!([
                {"op": "test", "path": path, "value": "abc~1"},
                {"op": "remove", "path": path},
            ])
        );
        let annotated = |value: &str| {
            let mut rollout = json!({"metadata": {"annotations": {"other": "x"}}});
            rollout["metadata"]["annotations"][key] = json!(value);
            rollout
        };
        let mut rollout = annotated("newer");
        assert!(
            json_patch::patch(&mut rollout, &patch).is_err(),
            "a newer signal is kept"
        );
        let mut rollout = annotated("abc~1");
        json_patch::patch(&mut rollout, &patch).expect("the seen signal is removed");
        assert_eq!(rollout, json!({"metadata": {"annotations": {"other": "x"}}}));
    }
}
