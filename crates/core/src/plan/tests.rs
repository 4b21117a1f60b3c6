//! The sync's rules, decided without a cluster.

use std::collections::BTreeMap;

use kube_core::discovery::ApiResource;
use serde_json::{Value, json};

use super::desired::prepare;
use super::*;
use crate::model::{LiveMeta, ServiceAccountRef};

const INSTANCE: &str = "agent";

fn manifest(app: &str, kind: &str, name: &str) -> Manifest {
    let api_version = match kind {
        "Deployment" => "apps/v1",
        "CustomResourceDefinition" => "apiextensions.k8s.io/v1",
        _ => "v1",
    };
    Manifest {
        app: app.to_string(),
        file: format!("{app}/{name}.yaml"),
        line: 1,
        object: json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": "demo"},
            "data": {"color": "blue"}}),
    }
}

fn planned(manifest: &Manifest) -> Planned<'_> {
    let namespaced = !matches!(manifest.kind(), "Namespace" | "CustomResourceDefinition");
    let desired = prepare(manifest, namespaced, INSTANCE, "default");
    let key = key_of(&desired, manifest);
    let (group, version) = manifest
        .api_version()
        .rsplit_once('/')
        .unwrap_or(("", manifest.api_version()));
    Planned {
        manifest,
        resolved: Resolved {
            resource: ApiResource {
                group: group.to_string(),
                version: version.to_string(),
                api_version: manifest.api_version().to_string(),
                kind: manifest.kind().to_string(),
                plural: format!("{}s", manifest.kind().to_lowercase()),
            },
            namespaced,
        },
        desired,
        key,
    }
}

/// The live object as the API server would hold it after applying `desired`.
fn live_copy(desired: &Value) -> Value {
    let mut live = desired.clone();
    live["metadata"]["uid"] = json!("uid-1");
    live["metadata"]["resourceVersion"] = json!("7");
    live
}

fn live_of(objects: &[(ObjectKey, Value)]) -> LiveObjects {
    objects
        .iter()
        .map(|(key, value)| (key.clone(), value.to_string().into_boxed_str()))
        .collect()
}

fn entry(kind: &str, name: &str) -> InventoryEntry {
    InventoryEntry {
        api_version: if kind == "Deployment" { "apps/v1" } else { "v1" }.to_string(),
        kind: kind.to_string(),
        namespace: Some("demo".to_string()),
        name: name.to_string(),
        adopted: false,
    }
}

fn namespace_entry(name: &str, adopted: bool) -> InventoryEntry {
    InventoryEntry {
        api_version: "v1".to_string(),
        kind: "Namespace".to_string(),
        namespace: None,
        name: name.to_string(),
        adopted,
    }
}

fn live_meta(managed_by: Option<&str>, source: &str) -> LeftGit {
    LeftGit::Live(LiveMeta {
        uid: "uid-9".to_string(),
        resource_version: "42".to_string(),
        managed_by: managed_by.map(str::to_string),
        source: Some(source.to_string()),
    })
}

struct Case<'m> {
    objects: Vec<Planned<'m>>,
    live: LiveObjects,
    previous: Vec<InventoryEntry>,
    left_git: BTreeMap<ObjectKey, LeftGit>,
    revision: RevisionKeys,
    unreadable_inventory: Option<&'static str>,
    prune: bool,
}

impl<'m> Case<'m> {
    fn new(objects: Vec<Planned<'m>>) -> Self {
        Case {
            objects,
            live: LiveObjects::default(),
            previous: Vec::new(),
            left_git: BTreeMap::new(),
            revision: RevisionKeys::default(),
            unreadable_inventory: None,
            prune: false,
        }
    }
    /// With `--prune`: the ConfigMap `name` left Git, and observe found it so.
    fn left_git(name: &str, found: LeftGit) -> Self {
        let mut case = Case::new(Vec::new());
        case.prune = true;
        case.previous = vec![entry("ConfigMap", name)];
        case.left_git = BTreeMap::from([(entry("ConfigMap", name).key(), found)]);
        case
    }

    fn plan(self) -> (AppPlan<'m>, Vec<InventoryEntry>) {
        let Case {
            objects,
            live,
            previous,
            left_git,
            revision,
            unreadable_inventory,
            prune,
        } = self;
        let plan = plan_app(AppInputs {
            app: "web",
            objects,
            pending: Vec::new(),
            live: &live,
            previous: &previous,
            left_git: &left_git,
            revision: &revision,
            unreadable_inventory,
            has_rollouts: false,
            instance: INSTANCE,
            default_namespace: "default",
            prune,
        });
        (plan, previous)
    }
}

fn reasons(plan: &AppPlan<'_>) -> Vec<(String, Reason)> {
    plan.writes
        .iter()
        .map(|&(i, reason)| (plan.objects[i].name().to_string(), reason))
        .collect()
}

#[test]
fn a_new_app_creates_every_object_and_is_fresh() {
    let (a, b) = (manifest("web", "ConfigMap", "a"), manifest("web", "Deployment", "b"));
    let (plan, _) = Case::new(vec![planned(&a), planned(&b)]).plan();
    assert_eq!(
        reasons(&plan),
        vec![("a".to_string(), Reason::Create), ("b".to_string(), Reason::Create)]
    );
    assert!(plan.fresh);
    assert!(plan.unchanged.is_empty() && plan.prunes.is_empty() && plan.kept.is_empty());
}

#[test]
fn an_app_that_applied_before_is_not_fresh_and_is_dry_run_first() {
    let a = manifest("web", "ConfigMap", "a");
    let mut case = Case::new(vec![planned(&a)]);
    case.previous = vec![entry("ConfigMap", "a")];
    let (plan, _) = case.plan();
    assert!(!plan.fresh);
}

#[test]
fn an_app_holding_a_crd_is_never_fresh() {
    let crd = manifest("web", "CustomResourceDefinition", "widgets.example.com");
    let (plan, _) = Case::new(vec![planned(&crd)]).plan();
    assert!(!plan.fresh, "a CRD that existed would be deleted by a take-back");
}

#[test]
fn an_object_already_as_git_wants_it_is_left_alone() {
    let a = manifest("web", "ConfigMap", "a");
    let item = planned(&a);
    let live = live_copy(&item.desired);
    let mut case = Case::new(vec![item]);
    case.live = live_of(&[(case.objects[0].key.clone(), live)]);
    let (plan, _) = case.plan();
    assert!(plan.writes.is_empty());
    assert_eq!(plan.unchanged.len(), 1);
    assert!(!plan.fresh);
}

#[test]
fn an_edit_in_the_cluster_is_drift_and_an_edit_in_git_is_a_change() {
    let (a, b) = (manifest("web", "ConfigMap", "a"), manifest("web", "ConfigMap", "b"));
    let (item_a, item_b) = (planned(&a), planned(&b));
    // Someone edited a in the cluster: Git's hash is still the one applied.
    let mut edited = live_copy(&item_a.desired);
    edited["data"]["color"] = json!("red");
    // Git changed b since it was applied: the live hash is an older one.
    let mut older = live_copy(&item_b.desired);
    older["data"]["color"] = json!("green");
    older["metadata"]["annotations"][APPLIED_HASH_ANNOTATION] = json!("an-older-hash");
    let live = live_of(&[(item_a.key.clone(), edited), (item_b.key.clone(), older)]);
    let mut case = Case::new(vec![item_a, item_b]);
    case.live = live;
    let (plan, _) = case.plan();
    assert_eq!(
        reasons(&plan),
        vec![("a".to_string(), Reason::Drift), ("b".to_string(), Reason::Change)]
    );
}

#[test]
fn without_prune_what_left_git_stays_in_the_inventory() {
    let a = manifest("web", "ConfigMap", "a");
    let mut case = Case::new(vec![planned(&a)]);
    case.previous = vec![entry("ConfigMap", "a"), entry("ConfigMap", "gone")];
    let (plan, _) = case.plan();
    assert!(plan.prunes.is_empty());
    assert_eq!(plan.kept, vec![entry("ConfigMap", "gone")]);
}

#[test]
fn prune_deletes_only_this_instances_object_as_it_was_read() {
    let a = manifest("web", "ConfigMap", "a");
    let mut case = Case::new(vec![planned(&a)]);
    case.prune = true;
    case.previous = vec![entry("ConfigMap", "ours"), entry("ConfigMap", "theirs")];
    case.left_git = BTreeMap::from([
        (
            entry("ConfigMap", "ours").key(),
            live_meta(Some(INSTANCE), "web/ours.yaml:1"),
        ),
        (
            entry("ConfigMap", "theirs").key(),
            live_meta(Some("another-agent"), "web/theirs.yaml:1"),
        ),
    ]);
    let (plan, _) = case.plan();
    assert_eq!(
        plan.prunes,
        vec![Deletion {
            api_version: "v1".to_string(),
            key: entry("ConfigMap", "ours").key(),
            uid: "uid-9".to_string(),
            resource_version: Some("42".to_string()),
            foreground: false,
        }]
    );
    assert!(
        plan.kept.is_empty(),
        "someone else's object leaves the inventory, undeleted"
    );
}

#[test]
fn an_unlabelled_lookalike_in_the_inventory_is_never_pruned() {
    let case = Case::left_git("lookalike", live_meta(None, "web/lookalike.yaml:1"));
    let (plan, _) = case.plan();
    assert!(plan.prunes.is_empty());
}

#[test]
fn an_object_moved_to_another_app_in_the_same_commit_is_not_pruned() {
    let case = Case::left_git("moved", live_meta(Some(INSTANCE), "api/moved.yaml:1"));
    let (plan, _) = case.plan();
    assert!(plan.prunes.is_empty());
}

#[test]
fn an_object_another_app_now_holds_is_not_pruned_even_before_that_app_applied_it() {
    // The live object still names this app: the other app has not synced yet.
    let mut case = Case::left_git("moved", live_meta(Some(INSTANCE), "web/moved.yaml:1"));
    let elsewhere = manifest("api", "ConfigMap", "moved");
    case.revision = RevisionKeys::of([&elsewhere].into_iter(), "default");
    let (plan, _) = case.plan();
    assert!(plan.prunes.is_empty());
}

#[test]
fn an_object_that_cannot_be_read_is_kept_and_named() {
    let case = Case::left_git("hidden", LeftGit::Unreadable("forbidden".to_string()));
    let (plan, _) = case.plan();
    assert!(plan.prunes.is_empty());
    assert_eq!(plan.kept, vec![entry("ConfigMap", "hidden")]);
    assert_eq!(plan.problems.len(), 1);
    assert!(
        plan.problems[0]
            .message
            .contains("pruning ConfigMap demo/hidden: forbidden")
    );
}

#[test]
fn prune_deletes_workloads_before_namespaces() {
    let mut case = Case::new(Vec::new());
    case.prune = true;
    let namespace = namespace_entry("demo", false);
    case.previous = vec![namespace.clone(), entry("Deployment", "web")];
    case.left_git = BTreeMap::from([
        (namespace.key(), live_meta(Some(INSTANCE), "web/ns.yaml:1")),
        (
            entry("Deployment", "web").key(),
            live_meta(Some(INSTANCE), "web/web.yaml:1"),
        ),
    ]);
    let (plan, _) = case.plan();
    let kinds: Vec<&str> = plan.prunes.iter().map(|d| d.key.kind.as_str()).collect();
    assert_eq!(kinds, vec!["Deployment", "Namespace"]);
}

#[test]
fn an_object_still_in_git_is_never_a_prune_candidate() {
    let a = manifest("web", "ConfigMap", "a");
    let objects = vec![planned(&a)];
    let previous = vec![entry("ConfigMap", "a"), entry("ConfigMap", "b")];
    assert_eq!(
        left_git(&objects, &[], &previous, "default"),
        vec![entry("ConfigMap", "b")]
    );
    // An object whose kind its CRD has yet to add still counts as in Git.
    let pending = manifest("web", "ConfigMap", "b");
    assert!(left_git(&objects, &[&pending], &previous, "default").is_empty());
    // One that names no namespace is in the default namespace, whichever it is.
    let mut unnamespaced = pending.clone();
    unnamespaced.object["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("namespace");
    assert!(left_git(&objects, &[&unnamespaced], &previous, "demo").is_empty());
    assert_eq!(
        left_git(&objects, &[&unnamespaced], &previous, "team-a"),
        vec![entry("ConfigMap", "b")]
    );
}

#[test]
fn a_source_annotation_names_the_app_by_its_directory() {
    assert!(belongs_to("web/deploy.yaml:3", "web"));
    assert!(!belongs_to("api/deploy.yaml:3", "web"));
    assert!(belongs_to("deploy.yaml:1", ROOT_APP));
}

/// Everything a plan decided, by name: what is written and why, what is
/// unchanged, whether the app is fresh, the prunes, what stays in the inventory.
type Decided = (
    Vec<(String, Reason)>,
    Vec<String>,
    bool,
    Vec<Deletion>,
    Vec<InventoryEntry>,
);

fn decided(plan: &AppPlan<'_>) -> Decided {
    let unchanged = plan
        .unchanged
        .iter()
        .map(|(i, _)| plan.objects[*i].name().to_string())
        .collect();
    (
        reasons(plan),
        unchanged,
        plan.fresh,
        plan.prunes.clone(),
        plan.kept.clone(),
    )
}

#[test]
fn one_commit_that_changes_keeps_and_removes_is_planned_whole() {
    let (kept, edited, added) = (
        manifest("web", "ConfigMap", "kept"),
        manifest("web", "ConfigMap", "edited"),
        manifest("web", "ConfigMap", "added"),
    );
    let (kept, edited, added) = (planned(&kept), planned(&edited), planned(&added));
    let live_kept = live_copy(&kept.desired);
    let mut live_edited = live_copy(&edited.desired);
    live_edited["data"]["color"] = json!("green");
    live_edited["metadata"]["annotations"][APPLIED_HASH_ANNOTATION] = json!("an-older-hash");
    let live = live_of(&[(kept.key.clone(), live_kept), (edited.key.clone(), live_edited)]);
    let mut case = Case::new(vec![kept, edited, added]);
    case.live = live;
    case.prune = true;
    case.previous = vec![
        entry("ConfigMap", "kept"),
        entry("ConfigMap", "edited"),
        entry("ConfigMap", "removed"),
    ];
    case.left_git = BTreeMap::from([(
        entry("ConfigMap", "removed").key(),
        live_meta(Some(INSTANCE), "web/removed.yaml:1"),
    )]);
    let (plan, _) = case.plan();
    assert_eq!(
        decided(&plan),
        (
            vec![
                ("edited".to_string(), Reason::Change),
                ("added".to_string(), Reason::Create)
            ],
            vec!["kept".to_string()],
            false,
            vec![Deletion {
                api_version: "v1".to_string(),
                key: entry("ConfigMap", "removed").key(),
                uid: "uid-9".to_string(),
                resource_version: Some("42".to_string()),
                foreground: false,
            }],
            Vec::new(),
        )
    );
    assert!(plan.pending.is_empty() && plan.problems.is_empty());
}

fn answer(created_at: &str, managers: &[&str]) -> Value {
    let fields: Vec<Value> = managers.iter().map(|m| json!({"manager": m})).collect();
    json!({"metadata": {"creationTimestamp": created_at, "managedFields": fields}})
}

#[test]
fn a_take_back_deletes_only_what_this_sync_made_alone() {
    let started: jiff::Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
    let answer = |created: Option<&str>, managers: &[&str]| {
        let fields: Vec<Value> = managers.iter().map(|m| json!({"manager": m})).collect();
        let mut answer = json!({"metadata": {"managedFields": fields}});
        if let Some(created) = created {
            answer["metadata"]["creationTimestamp"] = json!(created);
        }
        answer
    };
    assert!(made_by_this_sync(
        &answer(Some("2026-12-01T10:00:01Z"), &["gitcanary"]),
        started
    ));
    assert!(
        !made_by_this_sync(&answer(Some("2026-12-01T09:59:59Z"), &["gitcanary"]), started),
        "older"
    );
    assert!(
        !made_by_this_sync(&answer(None, &["gitcanary"]), started),
        "no timestamp"
    );
    assert!(
        !made_by_this_sync(&answer(Some("2026-12-01T10:00:01Z"), &[]), started),
        "no manager"
    );
    assert!(
        !made_by_this_sync(
            &answer(Some("2026-12-01T10:00:01Z"), &["gitcanary", "gitcanary"]),
            started
        ),
        "a second entry, even in gitcanary's name"
    );
    assert!(!made_by_this_sync(
        &answer(Some("2026-12-01T10:00:01Z"), &["kubectl"]),
        started
    ));
    // One entry that names no manager is nobody's known: not deleted.
    let unnamed =
        json!({"metadata": {"creationTimestamp": "2026-12-01T10:00:01Z", "managedFields": [{"operation": "Apply"}]}});
    assert!(!made_by_this_sync(&unnamed, started), "an unnamed manager");
}

#[test]
fn an_object_that_already_existed_is_adopted_only_when_asked() {
    let started: jiff::Timestamp = "2026-12-01T10:00:00Z".parse().expect("a time");
    let fresh = answer("2026-12-01T10:00:00Z", &["gitcanary"]);
    let theirs = answer("2026-11-01T08:00:00Z", &["kubectl-create", "gitcanary"]);
    let plain = manifest("web", "ConfigMap", "a");
    let mut asking = manifest("web", "ConfigMap", "a");
    asking.object["metadata"]["annotations"] = json!({ADOPT_ANNOTATION: "true"});
    let (plain, asking) = (planned(&plain), planned(&asking));

    assert_eq!(creation(&plain, &fresh, started, &[], false), Creation::Created);
    match creation(&plain, &theirs, started, &[], false) {
        Creation::Refused(message) => {
            assert!(message.contains("ConfigMap demo/a already exists and this instance does not manage it"));
            assert!(message.contains("field managers: kubectl-create"));
            assert!(message.contains("gitcanary.io/adopt: \"true\""));
        }
        other => panic!("not refused: {other:?}"),
    }
    assert_eq!(creation(&asking, &theirs, started, &[], false), Creation::Adopted);
    assert_eq!(
        creation(&plain, &theirs, started, &[], true),
        Creation::Adopted,
        "--adopt"
    );
    // Made by another agent under the same field manager name, long before.
    let another_agent = answer("2026-11-01T08:00:00Z", &["gitcanary"]);
    assert!(matches!(
        creation(&plain, &another_agent, started, &[], false),
        Creation::Refused(_)
    ));
    // This app's own object, whose label someone removed, is no stranger;
    // one it adopted stays adopted (its prune releases it, never deletes it).
    let ours = [entry("ConfigMap", "a")];
    assert_eq!(creation(&plain, &theirs, started, &ours, false), Creation::Created);
    let adopted = [InventoryEntry {
        adopted: true,
        ..entry("ConfigMap", "a")
    }];
    assert_eq!(creation(&plain, &theirs, started, &adopted, false), Creation::Adopted);
    // Someone else's, made in the very second the sync began (before its write).
    let same_second = answer("2026-12-01T10:00:00Z", &["kubectl-create", "gitcanary"]);
    assert!(matches!(
        creation(&plain, &same_second, started, &[], false),
        Creation::Refused(_)
    ));
    // gitcanary's field manager alone, one second before the sync began: not this sync's.
    let a_second_before = answer("2026-12-01T09:59:59Z", &["gitcanary"]);
    assert!(matches!(
        creation(&plain, &a_second_before, started, &[], false),
        Creation::Refused(_)
    ));
}

#[test]
fn an_adopted_namespace_that_leaves_git_is_released_never_deleted() {
    let mut case = Case::new(Vec::new());
    case.prune = true;
    let namespace = namespace_entry("team", true);
    let adopted_map = InventoryEntry {
        adopted: true,
        ..entry("ConfigMap", "adopted")
    };
    case.previous = vec![namespace.clone(), adopted_map.clone()];
    case.left_git = BTreeMap::from([
        (namespace.key(), live_meta(Some(INSTANCE), "web/ns.yaml:1")),
        (adopted_map.key(), live_meta(Some(INSTANCE), "web/adopted.yaml:1")),
    ]);
    let (plan, _) = case.plan();
    assert_eq!(
        plan.releases,
        vec![ObjectRelease {
            entry: namespace,
            uid: "uid-9".to_string(),
        }],
        "released as the object observe found, by its uid"
    );
    let pruned: Vec<&str> = plan.prunes.iter().map(|d| d.key.name.as_str()).collect();
    assert_eq!(
        pruned,
        vec!["adopted"],
        "an adopted object was given to gitcanary: prune deletes it"
    );
}

#[test]
fn an_unreadable_inventory_prunes_nothing_and_says_so() {
    let mut case = Case::left_git("gone", live_meta(Some(INSTANCE), "web/gone.yaml:1"));
    case.unreadable_inventory = Some("expected value at line 1");
    let (plan, _) = case.plan();
    assert!(plan.prunes.is_empty());
    assert_eq!(plan.kept, vec![entry("ConfigMap", "gone")]);
    assert_eq!(plan.problems.len(), 1);
    assert!(
        plan.problems[0]
            .message
            .starts_with("the recorded inventory cannot be read (expected value at line 1): nothing is pruned")
    );
}

#[test]
fn tenancy_fails_closed_for_an_app_no_tenant_names() {
    let account = |name: &str| ServiceAccountRef {
        namespace: "tenants".into(),
        name: name.into(),
    };
    let mut options = SyncOptions::default();
    assert_eq!(options.tenant_problem("web"), None, "no tenancy: the agent writes");
    options.tenants.insert("shop".into(), account("shop"));
    assert_eq!(options.tenant_problem("shop"), None);
    let problem = options.tenant_problem("web").expect("refused");
    assert!(problem.contains("app web names no tenant"), "{problem}");
    options.default_tenant = Some(account("restricted"));
    assert_eq!(options.tenant_problem("web"), None);
    assert_eq!(options.tenant_of("web"), Some(&account("restricted")));
}

fn object(app: &str, name: &str, object: Value) -> Manifest {
    Manifest {
        app: app.to_string(),
        file: format!("{app}/{name}.yaml"),
        line: 1,
        object,
    }
}

fn web_and_autoscaler(replicas: Option<i64>) -> (Manifest, Manifest) {
    let mut deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "demo"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {}}});
    if let Some(replicas) = replicas {
        deployment["spec"]["replicas"] = json!(replicas);
    }
    let autoscaler = json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "web-scaler", "namespace": "demo"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "minReplicas": 4, "maxReplicas": 6}});
    (
        object("web", "web", deployment),
        object("web", "web-scaler", autoscaler),
    )
}

/// The live copy of `item` with `count` replicas, as the only live object.
fn live_with_replicas(item: &Planned<'_>, count: i64) -> LiveObjects {
    let mut scaled = live_copy(&item.desired);
    scaled["spec"]["replicas"] = json!(count);
    [(item.key.clone(), scaled.to_string().into_boxed_str())]
        .into_iter()
        .collect()
}

#[test]
fn a_workload_an_autoscaler_scales_keeps_the_live_replica_count() {
    let (deployment, autoscaler) = web_and_autoscaler(Some(2));
    let mut objects = vec![planned(&deployment), planned(&autoscaler)];
    let live = live_with_replicas(&objects[0], 5);

    let left = autoscaled::leave_replicas_to_autoscalers(&mut objects, &live);

    assert_eq!(
        objects[0].desired["spec"]["replicas"], 5,
        "the autoscaler's count, not Git's 2"
    );
    assert_eq!(
        autoscaled::replicas_from(&objects[0].desired),
        Some("HorizontalPodAutoscaler/web-scaler")
    );
    assert_eq!(
        left[0].to_string(),
        "Deployment.apps demo/web: spec.replicas is left to HorizontalPodAutoscaler/web-scaler (Git says 2, applied 5)"
    );
    // Applied so, then moved by the autoscaler: the next sync writes nothing.
    let mut moved = live_copy(&objects[0].desired);
    moved["spec"]["replicas"] = json!(6);
    let mut objects = vec![planned(&deployment), planned(&autoscaler)];
    let key = objects[0].key.clone();
    let live: LiveObjects = [(key, moved.to_string().into_boxed_str())].into_iter().collect();
    autoscaled::leave_replicas_to_autoscalers(&mut objects, &live);
    let mut case = Case::new(objects);
    case.live = live;
    let (plan, _) = case.plan();
    assert!(plan.writes.iter().all(|&(i, _)| i != 0), "{:?}", plan.writes);
    assert!(plan.unchanged.iter().any(|&(i, _)| i == 0));
}

#[test]
fn a_new_workload_an_autoscaler_scales_starts_at_gits_count_or_the_default() {
    for (git, applied) in [(Some(3), Some(3)), (None, None)] {
        let (deployment, autoscaler) = web_and_autoscaler(git);
        let mut objects = vec![planned(&deployment), planned(&autoscaler)];
        autoscaled::leave_replicas_to_autoscalers(&mut objects, &LiveObjects::default());
        assert_eq!(objects[0].desired["spec"]["replicas"].as_i64(), applied);
    }
}

#[test]
fn an_autoscaler_of_another_workload_or_namespace_leaves_replicas_to_git() {
    let (deployment, mut autoscaler) = web_and_autoscaler(Some(2));
    autoscaler.object["spec"]["scaleTargetRef"]["name"] = json!("api");
    let (_, mut elsewhere) = web_and_autoscaler(Some(2));
    elsewhere.object["metadata"]["namespace"] = json!("other");
    let (_, mut other_group) = web_and_autoscaler(Some(2));
    other_group.object["spec"]["scaleTargetRef"]["apiVersion"] = json!("apps.kruise.io/v1alpha1");
    for hpa in [autoscaler, elsewhere, other_group] {
        let mut objects = vec![planned(&deployment), planned(&hpa)];
        let live = live_with_replicas(&objects[0], 5);
        assert!(autoscaled::leave_replicas_to_autoscalers(&mut objects, &live).is_empty());
        assert_eq!(objects[0].desired["spec"]["replicas"], 2);
    }
}

#[test]
fn the_applied_hash_leaves_the_autoscalers_count_out() {
    let (deployment, autoscaler) = web_and_autoscaler(Some(2));
    let hash_at = |count: i64| {
        let mut objects = vec![planned(&deployment), planned(&autoscaler)];
        let live = live_with_replicas(&objects[0], count);
        autoscaled::leave_replicas_to_autoscalers(&mut objects, &live);
        // As a rollout overlay does after it.
        desired::rehash(&mut objects[0].desired);
        objects[0].desired["metadata"]["annotations"][APPLIED_HASH_ANNOTATION].clone()
    };
    assert_eq!(hash_at(5), hash_at(6));
}

#[test]
fn an_autoscaler_of_a_workload_git_holds_in_the_wrong_shape_never_panics() {
    let (_, autoscaler) = web_and_autoscaler(None);
    let odd = object(
        "web",
        "web",
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "demo"}, "spec": "x"}),
    );
    let mut objects = vec![planned(&odd), planned(&autoscaler)];
    let mut live_one = live_copy(&objects[0].desired);
    live_one["spec"] = json!({"replicas": 3});
    let live: LiveObjects = [(objects[0].key.clone(), live_one.to_string().into_boxed_str())]
        .into_iter()
        .collect();
    assert!(autoscaled::leave_replicas_to_autoscalers(&mut objects, &live).is_empty());
    assert_eq!(objects[0].desired["spec"], "x");
}
