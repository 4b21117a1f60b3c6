//! Offline checks of Rollouts, run with every other manifest check: a bad
//! Rollout keeps its app from being applied, and names its file and line.

use std::collections::BTreeMap;

use super::api::{IntOrPercent, RolloutSpec, is_rollout};
use super::plan::parse_percent;
use crate::manifest::{App, ManifestSet, Problem};

fn holds(app: &App, kind: &str, namespace: &str, name: &str) -> bool {
    app.manifests
        .iter()
        .any(|m| m.kind() == kind && m.name() == name && m.namespace().unwrap_or("default") == namespace)
}

/// Every offline check of a revision's manifests, Rollouts included: what
/// `sync`, `diff` and `gitcanary validate` run.
pub fn validate(set: &mut ManifestSet, allowed_namespaces: &[String]) {
    set.validate_with(allowed_namespaces, problems);
}

/// Problems of every Rollout in the app.
pub fn problems(app: &App) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut governed: BTreeMap<(String, String, String), String> = BTreeMap::new();
    for manifest in app.manifests.iter().filter(|m| is_rollout(m)) {
        let spec: RolloutSpec = match serde_json::from_value(manifest.object["spec"].clone()) {
            Ok(spec) => spec,
            Err(e) => {
                problems.push(manifest.problem(format!("invalid Rollout spec: {e}")));
                continue;
            }
        };
        let namespace = manifest.namespace().unwrap_or("default");
        problems.extend(spec_problems(&spec).into_iter().map(|m| manifest.problem(m)));
        problems.extend(
            super::analysis::problems(&spec)
                .into_iter()
                .map(|m| manifest.problem(m)),
        );
        let target = &spec.workload_ref;
        if !holds(app, &target.kind, namespace, &target.name) {
            problems.push(manifest.problem(format!(
                "workloadRef names {} {namespace}/{}, which is not in this app",
                target.kind, target.name
            )));
        }
        let key = (target.kind.clone(), namespace.to_string(), target.name.clone());
        if let Some(first) = governed.get(&key) {
            problems.push(manifest.problem(format!(
                "{} {namespace}/{} already has a Rollout ({first}); a workload takes one",
                target.kind, target.name
            )));
        } else {
            governed.insert(key, manifest.location());
        }
        for routing in &spec.strategy.canary.traffic_routings {
            if !holds(app, "Service", namespace, &routing.service) {
                problems.push(manifest.problem(format!(
                    "trafficRoutings names Service {namespace}/{}, which is not in this app",
                    routing.service
                )));
            }
            if let Some(gateway) = &routing.gateway
                && !holds(app, "HTTPRoute", namespace, &gateway.http_route_name)
            {
                problems.push(manifest.problem(format!(
                    "trafficRoutings names HTTPRoute {namespace}/{}, which is not in this app",
                    gateway.http_route_name
                )));
            }
            if let Some(ingress) = &routing.ingress
                && !holds(app, "Ingress", namespace, &ingress.name)
            {
                problems.push(manifest.problem(format!(
                    "trafficRoutings names Ingress {namespace}/{}, which is not in this app",
                    ingress.name
                )));
            }
        }
    }
    problems
}

/// Checks that need only the spec.
pub fn spec_problems(spec: &RolloutSpec) -> Vec<String> {
    let mut problems = Vec::new();
    let canary = &spec.strategy.canary;
    if !matches!(spec.workload_ref.kind.as_str(), "Deployment" | "StatefulSet") {
        problems.push(format!(
            "workloadRef.kind {:?} is not supported: use Deployment or StatefulSet",
            spec.workload_ref.kind
        ));
    }
    if canary.steps.is_empty() {
        problems.push("strategy.canary.steps is empty: give at least one step".to_string());
    }
    let mut previous: Option<(usize, u32)> = None;
    for (i, step) in canary.steps.iter().enumerate() {
        let n = i + 1;
        if let Some(traffic) = &step.traffic {
            match parse_percent(traffic) {
                Ok(t) if t > 100 => problems.push(format!("step {n}: traffic {traffic} is more than 100%")),
                Ok(t) => {
                    if let Some((p, before)) = previous
                        && t < before
                    {
                        problems.push(format!(
                            "step {n}: traffic {traffic} is less than step {p}'s {before}%: traffic may only grow"
                        ));
                    }
                    previous = Some((n, t));
                }
                Err(e) => problems.push(format!("step {n}: traffic {e}")),
            }
            if canary.traffic_routings.is_empty() {
                problems.push(format!(
                    "step {n}: traffic needs a trafficRouting (a Service with an HTTPRoute or Ingress); without one, split by replicas"
                ));
            }
            if canary.canary_service.as_ref().is_some_and(|c| c.disabled) {
                problems.push(format!(
                    "step {n}: traffic needs a canary Service, and canaryService.disabled is true: without one, traffic follows replicas through the stable Service (drop traffic, or the disabled)"
                ));
            }
        }
        match &step.replicas {
            Some(IntOrPercent::Int(r)) if *r < 0 => problems.push(format!("step {n}: replicas {r} is negative")),
            Some(IntOrPercent::Percent(p)) => match parse_percent(p) {
                Ok(v) if v > 100 => problems.push(format!("step {n}: replicas {p} is more than 100%")),
                Ok(_) if !p.trim().ends_with('%') => problems.push(format!(
                    "step {n}: replicas {p:?} must be a number or a percentage such as \"50%\""
                )),
                Ok(_) => {}
                Err(e) => problems.push(format!("step {n}: replicas {e}")),
            },
            _ => {}
        }
        if let Some(duration) = step.pause.as_ref().and_then(|p| p.duration.as_ref())
            && let Err(e) = duration.to_std()
        {
            problems.push(format!("step {n}: pause {e}"));
        }
    }
    if let Some(Err(e)) = canary.progress_deadline.as_ref().map(|d| d.to_std()) {
        problems.push(format!("progressDeadline: {e}"));
    }
    for routing in &canary.traffic_routings {
        if routing.gateway.is_none() && routing.ingress.is_none() {
            problems.push(format!(
                "trafficRoutings for Service {}: give gateway.httpRouteName or ingress.name",
                routing.service
            ));
        }
        if let Some(ingress) = &routing.ingress
            && ingress.class_type != "nginx"
        {
            problems.push(format!(
                "ingress classType {:?} is not supported: only nginx",
                ingress.class_type
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use crate::manifest::load_files;

    fn problems(files: &[(&str, &str)]) -> Vec<String> {
        let mut set = load_files(files.iter().map(|(p, c)| (p.to_string(), c.as_bytes().to_vec())));
        super::validate(&mut set, &[]);
        set.problems().map(ToString::to_string).collect()
    }

    #[test]
    fn traffic_without_a_canary_service_is_refused() {
        let mut files = vec![("a/w.yaml", WORKLOAD)];
        let rollout = rollout("      - {traffic: 10%}\n")
            .replace("      steps:", "      canaryService: {disabled: true}\n      steps:");
        files.push(("a/r.yaml", &rollout));
        let problems = problems(&files);
        assert!(
            problems
                .iter()
                .any(|p| p.contains("step 1: traffic needs a canary Service")),
            "{problems:?}"
        );
    }

    const WORKLOAD: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: echo, namespace: demo}\nspec: {}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: echo, namespace: demo}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: echo, namespace: demo}\n";

    fn rollout(steps: &str) -> String {
        format!(
            "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata: {{name: echo, namespace: demo}}\nspec:\n  workloadRef: {{kind: Deployment, name: echo}}\n  strategy:\n    canary:\n      trafficRoutings: [{{service: echo, gateway: {{httpRouteName: echo}}}}]\n      steps:\n{steps}"
        )
    }

    #[test]
    fn a_good_rollout_passes() {
        let r = rollout("      - {traffic: 10%, replicas: 1, pause: {duration: 30s}}\n      - {traffic: 100%}\n");
        assert_eq!(
            problems(&[("echo/app.yaml", WORKLOAD), ("echo/rollout.yaml", &r)]),
            Vec::<String>::new()
        );
    }

    #[test]
    fn traffic_over_100_or_decreasing_is_refused_with_file_and_line() {
        let r = rollout("      - {traffic: 50%}\n      - {traffic: 20%}\n      - {traffic: 150%}\n");
        let found = problems(&[("echo/app.yaml", WORKLOAD), ("echo/rollout.yaml", &r)]);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("echo/rollout.yaml:1: step 2: traffic 20% is less than step 1's 50%"));
        assert!(found[1].contains("step 3: traffic 150% is more than 100%"));
    }

    #[test]
    fn unknown_workload_and_missing_route_are_named() {
        let r = rollout("      - {traffic: 10%}\n").replace("name: echo}\n  strategy", "name: nope}\n  strategy");
        let found = problems(&[("echo/rollout.yaml", &r)]);
        assert!(
            found
                .iter()
                .any(|p| p.contains("workloadRef names Deployment demo/nope, which is not in this app"))
        );
        assert!(
            found
                .iter()
                .any(|p| p.contains("trafficRoutings names HTTPRoute demo/echo"))
        );
    }

    #[test]
    fn two_rollouts_for_one_workload_are_refused() {
        let r = rollout("      - {traffic: 10%}\n");
        let second = r.replace("metadata: {name: echo,", "metadata: {name: echo-2,");
        let found = problems(&[
            ("echo/app.yaml", WORKLOAD),
            ("echo/a.yaml", &r),
            ("echo/b.yaml", &second),
        ]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("already has a Rollout (echo/a.yaml:1)"));
    }

    #[test]
    fn bad_replicas_and_durations_are_refused() {
        let r = rollout("      - {traffic: 10%, replicas: 150%, pause: {duration: soon}}\n");
        let found = problems(&[("echo/app.yaml", WORKLOAD), ("echo/rollout.yaml", &r)]);
        assert!(
            found.iter().any(|p| p.contains("replicas 150% is more than 100%")),
            "{found:?}"
        );
        assert!(
            found.iter().any(|p| p.contains("pause invalid duration \"soon\"")),
            "{found:?}"
        );
    }
}
