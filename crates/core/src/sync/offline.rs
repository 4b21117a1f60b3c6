//! The plan stage without a cluster: every valid app planned against an
//! empty cluster by the sync's own planner, round after round, each of its
//! Rollouts fed its last status until it has walked a release from its
//! start to its promote. `gitcanary validate` runs it, so that a revision
//! the planner would refuse fails offline too; the `pipeline` fuzz target
//! runs it on arbitrary repositories.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use kube_core::{ApiResource, GroupVersionKind};

use super::planner::{AppObserved, PlanContext, plan};
use crate::manifest::{App, CLUSTER_SCOPED_KINDS, Manifest, ManifestSet, Problem};
use crate::model::{Resolved, SyncOptions};
use crate::plan::desired::canonical_hash;
use crate::plan::{LiveObjects, Planned, RevisionKeys};
use crate::rollout::api::{RolloutSpec, RolloutStatus, is_rollout};
use crate::rollout::model::{RolloutObserved, RolloutsObserved, Target};
use crate::rollout::plan::{GatewaySeen, MIRROR_FEATURE, Observed, PERCENT_MIRROR_FEATURE, Revisions};
use crate::rollout::signal;

/// Reconciles of a release walked offline: enough for every step and the promote.
const WALK_EXTRA: usize = 4;

/// Reconciles of one release walked at most: more than any real Rollout
/// needs, and a bound on what one app directory can make `validate` do.
const MAX_ROUNDS: usize = 128;

/// Problems the plan stage finds in a validated revision.
pub fn plan_problems(set: &ManifestSet, options: &SyncOptions) -> Vec<Problem> {
    let default_namespace = &options.allowed.default_namespace;
    let revision = RevisionKeys::of(set.apps.values().flat_map(|a| a.manifests.iter()), default_namespace);
    let live = LiveObjects::default();
    let context = PlanContext {
        live: &live,
        revision: &revision,
        instance: &options.instance,
        default_namespace,
        prune: options.prune,
    };
    let mut problems = Vec::new();
    for app in set.apps.values().filter(|a| a.is_valid()) {
        problems.extend(walk_app(app, options, &context).problems);
    }
    problems
}

/// What walking an app found: its problems, each once, and the status each
/// of its Rollouts ended with.
struct Walked {
    problems: Vec<Problem>,
    statuses: Vec<RolloutStatus>,
}

/// The app planned as a sync plans it: as it stands when it has no
/// Rollout, otherwise once per reconcile of each Rollout's release, one
/// Rollout at a time, so that one Rollout's problem hides no other's.
fn walk_app(app: &App, options: &SyncOptions, context: &PlanContext<'_>) -> Walked {
    let planned = || -> Vec<Planned<'_>> { app.manifests.iter().map(|m| offline_planned(m, options)).collect() };
    let first = planned();
    let mut walked = Walked {
        problems: Vec::new(),
        statuses: Vec::new(),
    };
    // Each Rollout with its steps, or why it cannot be found.
    let rollouts: Vec<(usize, Result<usize, Problem>)> = (0..first.len())
        .filter(|&i| is_rollout(first[i].manifest))
        .map(|i| (i, Target::find(&first, i).map(|t| t.spec.strategy.canary.steps.len())))
        .collect();
    // With no Rollout to walk (none, or none found), the app as it stands.
    if rollouts.iter().all(|(_, found)| found.is_err()) {
        match plan(app_observed(app, first, Vec::new()), context) {
            Ok(prepared) => walked.note(prepared.plan.problems),
            Err(refused) => walked.note(refused),
        }
    }
    for (index, found) in rollouts {
        let status = match found {
            Ok(steps) => walk_release(app, &planned, (index, steps), context, &mut walked),
            Err(problem) => {
                walked.note(vec![problem]);
                offline_stable()
            }
        };
        walked.statuses.push(status);
    }
    walked
}

/// One Rollout's release walked from a template change to its promote:
/// the app planned with it at each reconcile, its status fed to the next;
/// the last status it had.
fn walk_release<'a>(
    app: &'a App,
    planned: &impl Fn() -> Vec<Planned<'a>>,
    (index, steps): (usize, usize),
    context: &PlanContext<'_>,
    walked: &mut Walked,
) -> RolloutStatus {
    // The workload ran another template before this commit.
    let mut status = offline_stable();
    let mut now = Timestamp::UNIX_EPOCH;
    for round in 0..(steps + WALK_EXTRA).min(MAX_ROUNDS) {
        let objects = planned();
        let observed = Target::find(&objects, index).map(|target| {
            let seen = offline_observed(&objects, &target, &status, round, now);
            (target, seen)
        });
        match plan(app_observed(app, objects, vec![observed]), context) {
            Ok(prepared) => {
                walked.note(prepared.plan.problems);
                status = prepared
                    .rollouts
                    .into_iter()
                    .next()
                    .map_or(status, |work| work.plan.status);
            }
            Err(refused) => {
                // The sync would apply nothing of the app: this release goes no further.
                walked.note(refused);
                break;
            }
        }
        now = now.saturating_add(SignedDuration::from_hours(1)).unwrap_or(now);
    }
    status
}

fn app_observed<'a>(
    app: &'a App,
    objects: Vec<Planned<'a>>,
    rollouts: Vec<Result<(Target, RolloutObserved), Problem>>,
) -> AppObserved<'a> {
    AppObserved {
        app: &app.name,
        objects,
        pending: Vec::new(),
        rollouts: RolloutsObserved(rollouts),
        left_git: BTreeMap::new(),
        inventory: &[],
        unreadable_inventory: None,
    }
}

impl Walked {
    /// Adds what was found, each problem once.
    fn note(&mut self, found: Vec<Problem>) {
        for problem in found {
            if !self.problems.contains(&problem) {
                self.problems.push(problem);
            }
        }
    }
}

/// A Rollout whose workload ran another template before this commit.
fn offline_stable() -> RolloutStatus {
    RolloutStatus {
        stable_template_hash: "offline-stable".to_string(),
        stable_commit: "offline-stable-commit".to_string(),
        ..RolloutStatus::default()
    }
}

/// An object as the sync would plan it, with its kind's scope taken from the
/// well-known cluster-scoped kinds.
fn offline_planned<'a>(manifest: &'a Manifest, options: &SyncOptions) -> Planned<'a> {
    let (group, version) = manifest
        .api_version()
        .rsplit_once('/')
        .unwrap_or(("", manifest.api_version()));
    let gvk = GroupVersionKind::gvk(group, version, manifest.kind());
    let plural = format!("{}s", manifest.kind().to_ascii_lowercase());
    let resolved = Resolved {
        resource: ApiResource::from_gvk_with_plural(&gvk, &plural),
        namespaced: !CLUSTER_SCOPED_KINDS.contains(&manifest.kind()),
    };
    Planned::new(manifest, resolved, options)
}

/// What one reconcile of a walked release sees: every pod ready, every
/// route as written, and a person who promotes whatever waits for it, as
/// the CLI allows.
fn offline_observed(
    objects: &[Planned<'_>],
    target: &Target,
    status: &RolloutStatus,
    round: usize,
    now: Timestamp,
) -> RolloutObserved {
    let template = &objects[target.workload].manifest.object["spec"]["template"];
    let replicas = objects[target.workload].desired["spec"]["replicas"]
        .as_i64()
        .unwrap_or(1) as i32;
    let promote_signal = signal::Release::running("offline-uid", status)
        .filter(|_| signal::awaited(crate::rollout::api::Signal::Promote, status).is_ok())
        .map(|release| signal::token(&release, &format!("offline-{round}")));
    RolloutObserved {
        planner: Observed {
            commit: "offline".to_string(),
            git_template_hash: canonical_hash(template),
            workload_exists: true,
            workload_stable_hash: Some("offline-stable".to_string()),
            replicas,
            canary_ready: replicas,
            stable_rolled_out: round > 0,
            promote_signal,
            rollout_uid: "offline-uid".to_string(),
            stable_revision: "stable".to_string(),
            canary_revision: "canary".to_string(),
            now,
            // Offline, every route is as written.
            routes: Some(Vec::new()),
            ..Observed::default()
        },
        previous: Some(status.clone()),
        rollout_uid: Some("offline-uid".to_string()),
        last_command_comment: 0,
        revisions: Revisions {
            stable: "stable".to_string(),
            canary: "canary".to_string(),
        },
        stable_template: Some(template.clone()),
        knative_settled: round > 0,
        canary_live: BTreeMap::new(),
        canary_kinds: canary_kinds(),
        gateways: able_gateways(&target.spec),
        record_problem: None,
    }
}

fn canary_kinds() -> BTreeMap<&'static str, Resolved> {
    [
        ("apps", "v1", "Deployment", "deployments"),
        ("", "v1", "Service", "services"),
        ("networking.k8s.io", "v1", "Ingress", "ingresses"),
    ]
    .into_iter()
    .map(|(group, version, kind, plural)| {
        let gvk = GroupVersionKind::gvk(group, version, kind);
        (
            kind,
            Resolved {
                resource: ApiResource::from_gvk_with_plural(&gvk, plural),
                namespaced: true,
            },
        )
    })
    .collect()
}

/// Offline, every route's gateway can do what the steps ask of it: the
/// cluster's own say is read when the agent runs the release.
fn able_gateways(spec: &RolloutSpec) -> Vec<GatewaySeen> {
    let features = [MIRROR_FEATURE, PERCENT_MIRROR_FEATURE];
    spec.strategy
        .canary
        .gateway_routes()
        .map(|(_, route)| GatewaySeen {
            route: route.to_string(),
            gateway: "offline".to_string(),
            class: "offline".to_string(),
            features: Ok(features.iter().map(|f| f.to_string()).collect()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::load_files;

    fn problems(files: &[(&str, &str)]) -> Vec<String> {
        let mut set = load_files(files.iter().map(|(p, c)| (p.to_string(), c.as_bytes().to_vec())));
        crate::rollout::validate::validate(&mut set, &crate::manifest::Allowed::default());
        let mut found: Vec<String> = set.problems().map(ToString::to_string).collect();
        found.extend(
            plan_problems(&set, &SyncOptions::default())
                .iter()
                .map(ToString::to_string),
        );
        found
    }

    const APP: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: echo, namespace: demo}\nspec:\n  replicas: 4\n  selector: {matchLabels: {app: echo}}\n  template:\n    metadata: {labels: {app: echo}}\n    spec: {containers: [{name: echo, image: echo:2}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: echo, namespace: demo}\nspec: {selector: {app: echo}, ports: [{port: 80}]}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: echo, namespace: demo}\nspec:\n  rules:\n  - backendRefs: [{name: echo, port: 80}]\n---\napiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata: {name: echo, namespace: demo}\nspec:\n  workloadRef: {kind: Deployment, name: echo}\n  strategy:\n    canary:\n      trafficRoutings: [{service: echo, gateway: {httpRouteName: echo}}]\n      steps:\n      - {traffic: 25%, pause: {duration: 60}}\n      - {traffic: 50%, pause: {}}\n      - {traffic: 100%}\n";

    #[test]
    fn a_good_release_walks_to_its_promote_offline() {
        assert_eq!(problems(&[("echo/app.yaml", APP)]), Vec::<String>::new());
    }

    #[test]
    fn the_walk_takes_a_release_through_every_step_to_its_promote() {
        let set = load_files([("echo/app.yaml".to_string(), APP.as_bytes().to_vec())].into_iter());
        let options = SyncOptions::default();
        let revision = RevisionKeys::of(set.apps["echo"].manifests.iter(), "default");
        let live = LiveObjects::default();
        let context = PlanContext {
            live: &live,
            revision: &revision,
            instance: &options.instance,
            default_namespace: "default",
            prune: true,
        };
        let walked = walk_app(&set.apps["echo"], &options, &context);
        assert!(walked.problems.is_empty(), "{:?}", walked.problems);
        let status = &walked.statuses[0];
        assert_eq!(status.phase, crate::rollout::api::Phase::Healthy, "{status:?}");
        assert_eq!(status.stable_commit, "offline", "promoted: {status:?}");
        assert_eq!(status.step_history.len(), 3, "{status:?}");
    }

    /// A small deterministic generator (xorshift), so a failure names its seed.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            from[(self.next() % from.len() as u64) as usize]
        }
        fn number(&mut self) -> String {
            match self.next() % 4 {
                0 => (self.next() % 200).to_string(),
                1 => u64::MAX.to_string(),
                2 => format!("{}", self.next()),
                _ => format!("-{}", self.next() % 1000),
            }
        }
    }

    const DURATIONS: &[&str] = &[
        "30",
        "1h30m",
        "500ms",
        "18446744073709551615s1s",
        "720h",
        "720h1s",
        "99999999999999999999999s",
        "",
        "s",
        "1é",
        "\"5m\"",
        "-1",
        "1.5s",
        "0",
        "2592001",
        "{}",
        "[]",
        "null",
    ];
    const PERCENTS: &[&str] = &[
        "25%",
        "100%",
        "0%",
        "101%",
        "-1%",
        "18446744073709551616%",
        "%",
        "50",
        "1e9%",
        "\"\"",
    ];

    fn rollout(g: &mut Gen) -> String {
        let mut steps = String::new();
        for _ in 0..(g.next() % 5) {
            let duration = match g.next() % 3 {
                0 => g.pick(DURATIONS).to_string(),
                1 => g.number(),
                _ => format!("{}s{}m", g.number(), g.number()),
            };
            steps.push_str(&format!(
                "      - {{traffic: {}, replicas: {}, pause: {{duration: {duration}}}}}\n",
                g.pick(PERCENTS),
                g.pick(&["1", "50%", "-3", "18446744073709551615", "0", "200%"]),
            ));
        }
        format!(
            "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata: {{name: echo, namespace: demo}}\nspec:\n  rolloutID: {}\n  workloadRef: {{kind: {}, name: echo}}\n  strategy:\n    canary:\n      progressDeadline: {}\n      gracePeriodSeconds: {}\n      trafficRoutings: [{{service: echo, gateway: {{httpRouteName: echo}}}}]\n      steps:\n{steps}  analysisTemplates:\n  - name: t\n    interval: {}\n    count: {}\n    failureLimit: {}\n    prometheus: {{name: {}}}\n    metrics: [{{name: m, query: up, successCondition: \"{}\"}}]\n",
            g.pick(&["\"\"", "r1", "\"a\\nGitcanary-Reverts: x\""]),
            g.pick(&["Deployment", "StatefulSet", "Service", "Nonsense"]),
            g.pick(DURATIONS),
            g.number(),
            g.pick(DURATIONS),
            g.number(),
            g.number(),
            g.pick(&["main", "Bad Name", "\"\"", "x"]),
            g.pick(&["> 0", "< 1e309", "== ", ">= -", "&&", "> 0.5"]),
        )
    }

    #[test]
    fn validate_and_plan_never_panic_on_generated_repositories() {
        let workload = APP.split("\n---\n").take(3).collect::<Vec<_>>().join("\n---\n");
        for seed in 1..=1500u64 {
            let mut g = Gen(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let spec = rollout(&mut g);
            let outcome =
                std::panic::catch_unwind(|| problems(&[("echo/app.yaml", &workload), ("echo/rollout.yaml", &spec)]));
            assert!(outcome.is_ok(), "seed {seed} panicked on:\n{spec}");
        }
    }
}
