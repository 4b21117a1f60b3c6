//! Offline checks of Rollouts, run with every other manifest check: a bad
//! Rollout keeps its app from being applied, and names its file and line.

use std::collections::BTreeMap;

mod route_steps;

use super::api::{ABORT_ANNOTATION, LAST_COMMENT_ANNOTATION, PROMOTE_ANNOTATION};
use super::api::{IntOrPercent, NGINX_COOKIE, RolloutSpec, Style, is_rollout};
use super::overlay::{SUPPORTED_WORKLOADS, WorkloadKind};
use super::plan::parse_percent;
use serde_json::Value;

use crate::manifest::schema::schema_problems;
use crate::manifest::{Allowed, App, Manifest, ManifestSet, Problem};

/// The app's object of this group and kind, namespace and name.
fn held<'a>(
    app: &'a App,
    default_namespace: &str,
    (group, kind): (&str, &str),
    namespace: &str,
    name: &str,
) -> Option<&'a Manifest> {
    app.manifests.iter().find(|m| {
        m.group() == group
            && m.kind() == kind
            && m.name() == name
            && m.namespace().unwrap_or(default_namespace) == namespace
    })
}

/// The group of an apiVersion ("" for the core group).
fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// A path of keys into an object.
type Path<'a> = &'a [&'a str];

/// A governed object's fields that a rollout's overlays write into must be
/// mappings (lists of mappings where a list is expected): anything else is
/// refused here, with its file and line, rather than met mid-release.
fn shape_problems(manifest: &Manifest) -> Vec<Problem> {
    let object = &manifest.object;
    let at = |path: &[&str]| path.iter().fold(object, |node, key| &node[*key]);
    let mut problems = Vec::new();
    let mut mapping = |path: &[&str]| {
        let node = at(path);
        if !node.is_null() && !node.is_object() {
            problems.push(manifest.problem(format!(
                "{}: {} must be a mapping, for the Rollout that governs it",
                manifest.kind(),
                path.join(".")
            )));
        }
    };
    let (mappings, lists): (&[Path], &[(Path, &str)]) = match manifest.kind() {
        "Service" if manifest.group() == super::knative::GROUP => (
            &[
                &["spec"],
                &["spec", "template"],
                &["spec", "template", "metadata"],
                &["spec", "template", "metadata", "annotations"],
                &["spec", "template", "spec"],
            ],
            &[],
        ),
        "Deployment" | "StatefulSet" => (
            &[
                &["spec"],
                &["spec", "selector"],
                &["spec", "template"],
                &["spec", "template", "metadata"],
                &["spec", "template", "metadata", "labels"],
                &["spec", "template", "spec"],
            ],
            &[],
        ),
        "Service" => (&[&["spec"], &["spec", "selector"]], &[]),
        "HTTPRoute" => (&[&["spec"]], &[(&["spec", "rules"], "backendRefs")]),
        "Ingress" => (&[&["spec"]], &[(&["spec", "rules"], "http")]),
        _ => (&[], &[]),
    };
    for path in mappings {
        mapping(path);
    }
    for (path, inner) in lists {
        let node = at(path);
        let Some(items) = node.as_array() else {
            if !node.is_null() {
                problems.push(manifest.problem(format!("{}: {} must be a list", manifest.kind(), path.join("."))));
            }
            continue;
        };
        for (i, item) in items.iter().enumerate() {
            let where_ = format!("{}[{i}]", path.join("."));
            if !item.is_object() {
                problems.push(manifest.problem(format!("{}: {where_} must be a mapping", manifest.kind())));
                continue;
            }
            let nested: &[&str] = if *inner == "http" { &["http", "paths"] } else { &[inner] };
            let parent = if *inner == "http" { &item["http"] } else { item };
            if *inner == "http" && !parent.is_null() && !parent.is_object() {
                problems.push(manifest.problem(format!("{}: {where_}.http must be a mapping", manifest.kind())));
                continue;
            }
            let list = nested.iter().fold(item, |node, key| &node[*key]);
            match list.as_array() {
                Some(entries) if entries.iter().all(Value::is_object) => {}
                None if list.is_null() => {}
                _ => problems.push(manifest.problem(format!(
                    "{}: {where_}.{} must be a list of mappings",
                    manifest.kind(),
                    nested.join(".")
                ))),
            }
        }
    }
    problems
}

/// Every offline check of a revision's manifests, Rollouts included: what
/// `sync`, `diff` and `gitcanary validate` run.
pub fn validate(set: &mut ManifestSet, allowed: &Allowed) {
    set.validate_with(allowed, |app| problems(app, &allowed.default_namespace));
}

/// The schema of a Rollout's spec, from the CRD that `gitcanary crd` prints.
fn spec_schema() -> &'static Value {
    static SCHEMA: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    SCHEMA.get_or_init(|| {
        use kube_core::CustomResourceExt;
        let crd = serde_json::to_value(super::api::Rollout::crd()).unwrap_or_default();
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
    })
}

/// Problems of every Rollout in the app; objects that name no namespace are
/// in `default_namespace`.
pub fn problems(app: &App, default_namespace: &str) -> Vec<Problem> {
    let mut problems: Vec<Problem> = app.manifests.iter().filter_map(claims_a_rollout).collect();
    let mut governed: BTreeMap<(String, String, String), String> = BTreeMap::new();
    for manifest in app.manifests.iter().filter(|m| is_rollout(m)) {
        problems.extend(signals_from_git(manifest));
        let against_schema = schema_problems(&manifest.object["spec"], spec_schema(), "spec");
        if !against_schema.is_empty() {
            problems.extend(
                against_schema
                    .into_iter()
                    .map(|m| manifest.problem(format!("Rollout {m}"))),
            );
            continue;
        }
        let spec: RolloutSpec = match serde_json::from_value(manifest.object["spec"].clone()) {
            Ok(spec) => spec,
            Err(e) => {
                problems.push(manifest.problem(format!("invalid Rollout spec: {e}")));
                continue;
            }
        };
        let namespace = manifest.namespace().unwrap_or(default_namespace);
        problems.extend(spec_problems(&spec).into_iter().map(|m| manifest.problem(m)));
        problems.extend(
            super::analysis::problems(&spec)
                .into_iter()
                .chain(super::hooks::problems(&spec))
                .chain(super::jobs::problems(&spec))
                .map(|m| manifest.problem(m)),
        );
        problems.extend(reference_problems(app, manifest, &spec, namespace, default_namespace));
        let target = &spec.workload_ref;
        let key = (target.kind.clone(), namespace.to_string(), target.name.clone());
        if let Some(first) = governed.get(&key) {
            problems.push(manifest.problem(format!(
                "{} {namespace}/{} already has a Rollout ({first}); a workload takes one",
                target.kind, target.name
            )));
        } else {
            governed.insert(key, manifest.location());
        }
    }
    problems
}

/// Only gitcanary makes a Rollout's canary objects: a manifest that names a
/// Rollout as its owner would pass for one, and be written over and deleted
/// by that release (or take its canary traffic).
fn claims_a_rollout(manifest: &Manifest) -> Option<Problem> {
    let claims = manifest.object["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| {
            r["kind"] == "Rollout"
                && r["apiVersion"]
                    .as_str()
                    .is_some_and(|v| v.starts_with(super::api::GROUP))
        });
    claims.then(|| {
        manifest.problem(
            "metadata.ownerReferences names a gitcanary Rollout: only gitcanary makes a Rollout's objects (its canaries); remove the reference".to_string(),
        )
    })
}

/// gitcanary's signal annotations, which only it and its commands set.
fn signals_from_git(rollout: &Manifest) -> Vec<Problem> {
    [PROMOTE_ANNOTATION, ABORT_ANNOTATION, LAST_COMMENT_ANNOTATION]
        .into_iter()
        .filter(|signal| !rollout.object["metadata"]["annotations"][*signal].is_null())
        .map(|signal| rollout.problem(format!(
            "annotation {signal} is gitcanary's own signal and cannot come from Git (a merge would act on a release nobody reviewed, and every sync would fire it again): use `gitcanary promote`/`abort`, a `/gitcanary` comment or the promotion pull request"
        )))
        .collect()
}

/// The workload and the routed objects a Rollout names: in its own app, and
/// in the shape a release needs.
fn reference_problems(
    app: &App,
    rollout: &Manifest,
    spec: &RolloutSpec,
    namespace: &str,
    default_namespace: &str,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    let target = &spec.workload_ref;
    let workload_kind = (group_of(&target.api_version), target.kind.as_str());
    match held(app, default_namespace, workload_kind, namespace, &target.name) {
        Some(workload) => {
            problems.extend(shape_problems(workload));
            if super::knative::is_knative_service(&target.api_version, &target.kind)
                && let Some(problem) = super::knative::git_problem(&workload.object)
            {
                problems.push(workload.problem(format!(
                    "Knative Service {namespace}/{}, which Rollout {} governs: {problem}",
                    target.name,
                    rollout.name()
                )));
            }
        }
        None => problems.push(rollout.problem(format!(
            "workloadRef names {} {namespace}/{}, which is not in this app",
            target.kind, target.name
        ))),
    }
    for routing in &spec.strategy.canary.traffic_routings {
        let mut routed = vec![(("", "Service"), routing.service.as_str())];
        routed.extend(
            routing
                .gateway
                .as_ref()
                .map(|g| (("gateway.networking.k8s.io", "HTTPRoute"), g.http_route_name.as_str())),
        );
        routed.extend(
            routing
                .ingress
                .as_ref()
                .map(|i| (("networking.k8s.io", "Ingress"), i.name.as_str())),
        );
        for (kind, name) in routed {
            match held(app, default_namespace, kind, namespace, name) {
                Some(object) if kind.1 == "HTTPRoute" => {
                    problems.extend(shape_problems(object));
                    let rules = route_steps::route_problems(&spec.strategy.canary, &object.object, &routing.service);
                    problems.extend(rules.into_iter().map(|p| {
                        object.problem(format!(
                            "HTTPRoute {namespace}/{name}, which Rollout {} routes through: {p}",
                            rollout.name()
                        ))
                    }));
                }
                Some(object) => problems.extend(shape_problems(object)),
                None => problems.push(rollout.problem(format!(
                    "trafficRoutings names {} {namespace}/{name}, which is not in this app",
                    kind.1
                ))),
            }
        }
    }
    problems
}

/// Checks that need only the spec.
pub fn spec_problems(spec: &RolloutSpec) -> Vec<String> {
    let mut problems = Vec::new();
    let canary = &spec.strategy.canary;
    let kind = WorkloadKind::parse(&spec.workload_ref.api_version, &spec.workload_ref.kind);
    if kind.is_none() {
        problems.push(format!(
            "workloadRef {} {} is not supported: {SUPPORTED_WORKLOADS}",
            spec.workload_ref.api_version, spec.workload_ref.kind
        ));
    }
    let knative = kind == Some(WorkloadKind::KnativeService);
    if knative {
        problems.extend(knative_problems(spec));
    } else if canary.canary_min_scale.is_some() {
        problems.push(
            "canaryMinScale is for a Knative Service (it keeps the canary Revision from scaling to zero); a Deployment or StatefulSet takes replicas in its steps".to_string(),
        );
    }
    if canary.steps.is_empty() {
        problems.push(format!(
            "strategy.{}.steps is empty: give at least one step",
            spec.strategy.style.field()
        ));
    }
    if spec.strategy.style == Style::BlueGreen {
        problems.extend(blue_green_problems(spec, kind));
    }
    problems.extend(kruise_problems(canary, kind));
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
            if canary.traffic_routings.is_empty() && !knative {
                problems.push(format!(
                    "step {n}: traffic needs a trafficRouting (a Service with an HTTPRoute or Ingress); without one, split by replicas"
                ));
            }
            if canary.canary_service_disabled() {
                problems.push(format!(
                    "step {n}: traffic needs a canary Service, and canaryService.disabled (or disableGenerateCanaryService) is true: without one, traffic follows replicas through the stable Service (drop traffic, or the disabled)"
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
    problems.extend(timing_problems(canary));
    problems.extend(naming_problems(spec));
    problems.extend(match_problems(canary, knative));
    problems.extend(route_steps::step_problems(canary, knative));
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

/// What the steps' `matches` may say: Gateway API matches for an HTTPRoute;
/// for an nginx Ingress, the one header its canary annotations can name.
fn match_problems(canary: &super::api::CanaryStrategy, knative: bool) -> Vec<String> {
    let mut problems = Vec::new();
    let nginx = canary.traffic_routings.iter().any(|r| r.ingress.is_some());
    for (i, step) in canary.steps.iter().enumerate().filter(|(_, s)| !s.matches.is_empty()) {
        let n = i + 1;
        let named = step
            .matches
            .iter()
            .flat_map(|m| m.headers.iter().chain(m.query_params.iter()));
        let texts = named
            .flat_map(|m| [&m.name, &m.value])
            .chain(step.matches.iter().filter_map(|m| m.path.as_ref()?.value.as_ref()));
        if texts.clone().any(|t| t.chars().any(char::is_control)) {
            problems.push(format!(
                "step {n}: a match holds a control character (a line break, an escape): requests cannot carry one"
            ));
        }
        if knative {
            problems.push(format!(
                "step {n}: matches cannot be set for a Knative Service: its routes split by percent only"
            ));
        } else if canary.traffic_routings.is_empty() {
            problems.push(format!(
                "step {n}: matches need a trafficRouting (a Service with an HTTPRoute or Ingress) to send matching requests to the canary"
            ));
        }
        for m in &step.matches {
            let named = m
                .headers
                .iter()
                .map(|h| ("header", h))
                .chain(m.query_params.iter().map(|q| ("query parameter", q)));
            for (what, named) in named {
                if named.name.is_empty() {
                    problems.push(format!("step {n}: a {what} match needs a name"));
                }
                if let Some(kind) = named
                    .kind
                    .as_deref()
                    .filter(|k| !matches!(*k, "Exact" | "RegularExpression"))
                {
                    problems.push(format!(
                        "step {n}: {what} {:?}: type {kind:?} is not Exact or RegularExpression",
                        named.name
                    ));
                }
            }
            if let Some(kind) = m.path.as_ref().and_then(|p| p.kind.as_deref())
                && !matches!(kind, "Exact" | "PathPrefix" | "RegularExpression")
            {
                problems.push(format!(
                    "step {n}: path type {kind:?} is not Exact, PathPrefix or RegularExpression"
                ));
            }
            if let Some(path) = &m.path
                && !path.value.as_deref().is_some_and(|v| v.starts_with('/'))
            {
                problems.push(format!(
                    "step {n}: a path match needs a value starting with \"/\" (without one it would match every request)"
                ));
            }
            if m.path.is_none() && m.headers.is_empty() && m.query_params.is_empty() {
                problems.push(format!("step {n}: a match needs a path, headers or queryParams"));
            }
        }
        if canary.canary_service_disabled() {
            problems.push(format!(
                "step {n}: matches need a canary Service to send matching requests to, and canaryService.disabled is true"
            ));
        }
        let earlier_share = canary.steps[..i]
            .iter()
            .filter_map(|s| s.traffic.as_deref().and_then(|t| parse_percent(t).ok()))
            .max()
            .filter(|p| *p > 0);
        if let (None, Some(before)) = (&step.traffic, earlier_share) {
            problems.push(format!(
                "step {n}: matches without traffic send no other request to the canary, which would drop the {before}% of an earlier step: give this step traffic too"
            ));
        }
        problems.extend(cookie_and_nginx_problems(n, step, nginx));
    }
    problems
}

/// What an nginx Ingress can say of a step's matches: one header
/// (canary-by-header) or one cookie (canary-by-cookie, as Kruise writes it:
/// a header match of that name, its value the cookie's name), or one match
/// of each, OR'd as nginx does. The cookie convention is nginx's only.
fn cookie_and_nginx_problems(n: usize, step: &super::api::CanaryStep, nginx: bool) -> Vec<String> {
    let mut problems = Vec::new();
    let one_header =
        |m: &super::api::RequestMatch| m.headers.len() == 1 && m.query_params.is_empty() && m.path.is_none();
    let is_cookie = |m: &super::api::RequestMatch| m.headers.iter().any(|h| h.name == NGINX_COOKIE);
    let cookies = step.matches.iter().filter(|m| is_cookie(m)).count();
    let nginx_can_say = (1..=2).contains(&step.matches.len())
        && step.matches.iter().all(one_header)
        && cookies <= 1
        && step.matches.len() - cookies <= 1;
    if nginx && !nginx_can_say {
        problems.push(format!(
            "step {n}: an nginx Ingress sends requests to its canary by one header (canary-by-header) or one cookie (a header match named {NGINX_COOKIE}, its value the cookie's name), each a match of its own; give those, or route with an HTTPRoute"
        ));
    }
    let cookie_headers = step
        .matches
        .iter()
        .flat_map(|m| m.headers.iter())
        .filter(|h| h.name == NGINX_COOKIE);
    if nginx
        && cookie_headers
            .clone()
            .any(|c| c.kind.as_deref().is_some_and(|k| k != "Exact"))
    {
        problems.push(format!(
            "step {n}: {NGINX_COOKIE} names a cookie (nginx sends requests whose cookie of that name is \"always\" to the canary): its type is Exact"
        ));
    }
    if !nginx && cookies > 0 {
        problems.push(format!(
            "step {n}: a header named {NGINX_COOKIE} is nginx's cookie match (Kruise's convention); an HTTPRoute matches the Cookie header itself (type RegularExpression)"
        ));
    }
    problems
}

/// The release's own clocks: its deadline and the grace after a route change.
fn timing_problems(canary: &super::api::CanaryStrategy) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(Err(e)) = canary.progress_deadline.as_ref().map(|d| d.to_std()) {
        problems.push(format!("progressDeadline: {e}"));
    }
    if let Some(grace) = canary.grace_period_seconds
        && std::time::Duration::from_secs(u64::from(grace)) > super::api::MAX_DURATION
    {
        problems.push(format!(
            "gracePeriodSeconds: {grace} is longer than the maximum of 30 days ({}s)",
            super::api::MAX_DURATION.as_secs()
        ));
    }
    problems
}

/// Kruise's fields, where gitcanary means the same or says why not
/// (`enableExtraWorkloadForCanary: true` on a StatefulSet, which Kruise's
/// own conversion writes, changes nothing: its canary is its partition).
fn kruise_problems(canary: &super::api::CanaryStrategy, kind: Option<WorkloadKind>) -> Vec<String> {
    let mut problems = Vec::new();
    match (canary.enable_extra_workload_for_canary, kind) {
        (Some(false), Some(WorkloadKind::Deployment)) => problems.push(
            "enableExtraWorkloadForCanary: false (Kruise's in-place partition of a Deployment) is not supported: gitcanary runs a Deployment's canary as a second Deployment beside it, the stable one untouched until promote; set it to true or drop it".to_string(),
        ),
        (Some(_), Some(WorkloadKind::KnativeService)) => problems.push(
            "enableExtraWorkloadForCanary is for a Deployment: a Knative Service's canary is a Revision; drop it".to_string(),
        ),
        _ => {}
    }
    match &canary.failure_threshold {
        Some(_) if kind == Some(WorkloadKind::KnativeService) => problems.push(
            "failureThreshold is for pods a step waits for: a Knative step waits for its Revision to be Ready; drop it"
                .to_string(),
        ),
        Some(IntOrPercent::Int(n)) if *n < 0 => problems.push(format!("failureThreshold {n} is negative")),
        Some(IntOrPercent::Percent(p)) => match parse_percent(p) {
            Ok(v) if v > 100 => problems.push(format!("failureThreshold {p} is more than 100%")),
            Ok(_) => {}
            Err(e) => problems.push(format!("failureThreshold {e}")),
        },
        _ => {}
    }
    problems
}

/// What a blue-green release needs: a second workload at full size beside
/// the old one, which only a Deployment gets, and a switch made by routes
/// through the canary Service, never by pods joining the stable Service.
fn blue_green_problems(spec: &RolloutSpec, kind: Option<WorkloadKind>) -> Vec<String> {
    let canary = &spec.strategy.canary;
    let mut problems = Vec::new();
    match kind {
        Some(WorkloadKind::StatefulSet) => problems.push(
            "blueGreen needs a Deployment: a StatefulSet's pods are replaced in place, by partition, with no second set beside the old one (use canary)".to_string(),
        ),
        Some(WorkloadKind::KnativeService) => problems.push(
            "blueGreen needs a Deployment: a Knative Service switches between Revisions by its own traffic (use canary, whose traffic steps do that)".to_string(),
        ),
        _ => {}
    }
    if kind != Some(WorkloadKind::KnativeService) && canary.traffic_routings.is_empty() {
        problems.push(
            "blueGreen needs a trafficRouting (a Service with an HTTPRoute or Ingress): the switch is made by routes, and without one the new version's pods would take requests through the stable Service as they start".to_string(),
        );
    }
    for (i, step) in canary.steps.iter().enumerate() {
        if step.traffic.is_none() {
            problems.push(format!(
                "step {}: blueGreen steps say how much traffic the new version takes (traffic: 0% for a preview)",
                i + 1
            ));
        }
    }
    let last = canary
        .steps
        .last()
        .and_then(|s| s.traffic.as_deref())
        .and_then(|t| parse_percent(t).ok());
    if last.is_some_and(|t| t < 100) {
        problems.push(
            "blueGreen switches every request before promote: give the last step traffic: 100% (the old version is replaced on promote)".to_string(),
        );
    }
    if canary.canary_service_disabled() {
        problems.push(
            "blueGreen needs the canary Service (the preview and the switch go through it): drop canaryService.disabled or disableGenerateCanaryService".to_string(),
        );
    }
    problems
}

/// What a Rollout of a Knative Service may not say, and why.
fn knative_problems(spec: &RolloutSpec) -> Vec<String> {
    let canary = &spec.strategy.canary;
    let mut problems = Vec::new();
    for (i, step) in canary.steps.iter().enumerate() {
        if step.replicas.is_some() {
            problems.push(format!(
                "step {}: replicas cannot be set for a Knative Service: Knative scales each Revision by its requests, so a step gives the canary Revision a traffic share only (set canaryMinScale to keep it from scaling to zero)",
                i + 1
            ));
        }
    }
    if !canary.traffic_routings.is_empty() {
        problems.push(
            "trafficRoutings cannot be set for a Knative Service: Knative routes its own traffic, and the release splits it in the Service's spec.traffic".to_string(),
        );
    }
    if canary.patch_pod_template_metadata.is_some() {
        problems.push(
            "patchPodTemplateMetadata cannot be set for a Knative Service: its canary is a Revision of Git's template, with no template of its own to patch".to_string(),
        );
    }
    if canary.canary_service.is_some() {
        problems.push(
            "canaryService cannot be set for a Knative Service: the canary Revision has its own URL (tag canary) instead of a Service".to_string(),
        );
    }
    problems
}

/// Names the Rollout makes: its rolloutID (in branch names, labels and
/// comments) and its canaries' names.
fn naming_problems(spec: &RolloutSpec) -> Vec<String> {
    let mut problems = Vec::new();
    let canary = &spec.strategy.canary;
    if let Some(id) = &spec.rollout_id
        && !is_label_value(id)
    {
        problems.push(format!(
            "rolloutID {id:?} must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit (it names branches and labels)"
        ));
    }
    if let Some(suffix) = &canary.canary_suffix
        && (suffix.is_empty()
            || !suffix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
    {
        problems.push(format!(
            "canarySuffix {suffix:?} must be lowercase letters, digits and '-' (it ends Kubernetes names)"
        ));
    }
    let mut named = vec![spec.workload_ref.name.as_str()];
    named.extend(canary.traffic_routings.iter().map(|r| r.service.as_str()));
    named.extend(
        canary
            .traffic_routings
            .iter()
            .filter_map(|r| Some(r.ingress.as_ref()?.name.as_str())),
    );
    for name in named {
        let canary_name = canary.canary_name(name);
        if canary_name.len() > 63 {
            problems.push(format!(
                "the canary of {name} would be called {canary_name}, longer than Kubernetes' 63 characters: shorten the name or canarySuffix"
            ));
        }
    }
    problems
}

/// A Kubernetes label value, and so also safe in branch names and comments.
fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    let edge = |b: &u8| b.is_ascii_alphanumeric();
    value.len() <= 63
        && bytes.first().is_none_or(edge)
        && bytes.last().is_none_or(edge)
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(b))
        && !value.contains("..")
}

#[cfg(test)]
mod tests {
    use crate::manifest::load_files;

    fn problems(files: &[(&str, &str)]) -> Vec<String> {
        let mut set = load_files(files.iter().map(|(p, c)| (p.to_string(), c.as_bytes().to_vec())));
        super::validate(&mut set, &crate::manifest::Allowed::default());
        set.problems().map(ToString::to_string).collect()
    }

    #[test]
    fn governed_objects_in_the_wrong_shape_are_refused_with_file_and_line() {
        let workload = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: echo, namespace: demo}\nspec:\n  template: [not, a, mapping]\n---\napiVersion: v1\nkind: Service\nmetadata: {name: echo, namespace: demo}\nspec: {selector: labels}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: echo, namespace: demo}\nspec:\n  rules:\n  - backendRefs: [echo]\n";
        let rollout = rollout("      - {traffic: 10%}\n");
        let found = problems(&[("a/w.yaml", workload), ("a/r.yaml", &rollout)]);
        // Built-in kinds are refused by their types, before the Rollout is read.
        for wanted in [
            "a/w.yaml:1: Deployment echo: spec.template: invalid type: sequence",
            "a/w.yaml:7: Service echo: spec.selector: invalid type: string \"labels\"",
        ] {
            assert!(found.iter().any(|p| p.starts_with(wanted)), "{wanted} in {found:?}");
        }
        let typed_fine = workload
            .replace("  template: [not, a, mapping]\n", "  template: {}\n")
            .replace("spec: {selector: labels}", "spec: {selector: {app: echo}}");
        let found = problems(&[("a/w.yaml", &typed_fine), ("a/r.yaml", &rollout)]);
        assert!(
            found
                .iter()
                .any(|p| p.starts_with("a/w.yaml:12: HTTPRoute: spec.rules[0].backendRefs must be a list of mappings")),
            "{found:?}"
        );
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

    #[test]
    fn header_changes_and_mirrors_are_taken_where_a_route_can_make_them_and_refused_with_why() {
        let with_ingress = |steps: &str| {
            rollout(steps).replace(
                "gateway: {httpRouteName: echo}",
                "ingress: {classType: nginx, name: echo}",
            )
        };
        let ingress =
            "\n---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: echo, namespace: demo}\n";
        let workload = format!("{WORKLOAD}{ingress}");
        let check = |rollout: &str| problems(&[("a/w.yaml", workload.as_str()), ("a/r.yaml", rollout)]);
        let ab = "      - {matches: [{headers: [{name: x-beta, value: \"1\"}]}], requestHeaderModifier: {set: [{name: x-release, value: beta}]}, pause: {}}\n";
        let mirror_first = "      - {mirror: {percent: 50}, pause: {}}\n      - {traffic: 20%}\n";
        assert_eq!(check(&rollout(&format!("{ab}{mirror_first}"))), Vec::<String>::new());
        let cases = [
            (
                rollout("      - {traffic: 10%, requestHeaderModifier: {set: [{name: x, value: z}]}}\n"),
                "step 1: requestHeaderModifier changes the requests the step's matches send to the canary, and the step has no matches",
            ),
            (
                with_ingress(ab),
                "step 1: requestHeaderModifier needs an HTTPRoute: an nginx Ingress's canary annotations cannot change",
            ),
            (
                rollout(
                    "      - {matches: [{headers: [{name: a, value: b}]}], requestHeaderModifier: {remove: [\"x:y\"]}}\n",
                ),
                "step 1: requestHeaderModifier names header \"x:y\"",
            ),
            (
                rollout(
                    "      - {matches: [{headers: [{name: a, value: b}]}], requestHeaderModifier: {add: [{name: x, value: \"a\\nb\"}]}}\n",
                ),
                "step 1: requestHeaderModifier holds a control character",
            ),
            (
                with_ingress("      - {mirror: {percent: 10}}\n"),
                "step 1: mirror needs an HTTPRoute (Gateway API's RequestMirror filter): an nginx Ingress",
            ),
            (
                rollout(
                    "      - {matches: [{headers: [{name: a, value: b}]}], requestHeaderModifier: {set: [{name: x/y, value: z}]}}\n",
                ),
                "step 1: requestHeaderModifier names header \"x/y\": a header name is 1 to 256 letters",
            ),
            (
                rollout(
                    "      - {matches: [{headers: [{name: a, value: b}]}], requestHeaderModifier: {set: [{name: x, value: z}, {name: X, value: w}]}}\n",
                ),
                "step 1: requestHeaderModifier.set names a header twice",
            ),
            (
                rollout(
                    "      - {matches: [{headers: [{name: a, value: b}]}], requestHeaderModifier: {add: [{name: x, value: \"\"}]}}\n",
                ),
                "step 1: requestHeaderModifier: a header's value is 1 to 4096 characters",
            ),
            (
                rollout("      - {mirror: {percent: 0}}\n"),
                "step 1: mirror percent 0 is not between 1 and 100",
            ),
            (
                rollout("      - {mirror: {percent: 10}, traffic: 5%}\n"),
                "step 1: a step mirrors to the canary or sends it requests, not both",
            ),
            (
                rollout("      - {traffic: 5%}\n      - {mirror: {percent: 10}}\n"),
                "step 2: mirror sends the canary no request of its own, which would drop step 1's 5%",
            ),
        ];
        for (rollout, wanted) in cases {
            let found = check(&rollout);
            assert!(found.iter().any(|p| p.contains(wanted)), "{wanted} in {found:?}");
        }
    }

    #[test]
    fn a_route_that_cannot_take_the_canarys_rules_is_refused_at_its_file_and_line() {
        let rule = |i: usize| format!("  - {{name: r{i}, backendRefs: [{{name: echo, port: 80}}]}}\n");
        let route = |rules: String| format!("{WORKLOAD}spec:\n  rules:\n{rules}");
        let ab = rollout("      - {matches: [{headers: [{name: x-beta, value: \"1\"}]}]}\n");
        let eight: String = (0..8).map(rule).collect();
        assert_eq!(
            problems(&[("a/w.yaml", &route(eight.clone())), ("a/r.yaml", &ab)]),
            Vec::<String>::new()
        );
        let nine: String = (0..9).map(rule).collect();
        let found = problems(&[("a/w.yaml", &route(nine)), ("a/r.yaml", &ab)]);
        assert!(
            found.iter().any(|p| p.starts_with("a/w.yaml:10: HTTPRoute demo/echo, which Rollout echo routes through: its 9 rules, with a rule for the canary before each of the 9 that send to Service echo (steps with matches), would be 18; an HTTPRoute takes at most 16")),
            "{found:?}"
        );
        // Without matches no rule is added: a full route is fine.
        let plain = rollout("      - {traffic: 10%}\n");
        let sixteen: String = (0..16).map(rule).collect();
        assert_eq!(
            problems(&[("a/w.yaml", &route(sixteen)), ("a/r.yaml", &plain)]),
            Vec::<String>::new()
        );
        let mirrored = "  - {backendRefs: [{name: echo, port: 80}], filters: [{type: RequestMirror, requestMirror: {backendRef: {name: shadow, port: 80}}}]}\n";
        let found = problems(&[
            ("a/w.yaml", &route(mirrored.to_string())),
            ("a/r.yaml", &rollout("      - {mirror: {percent: 100}}\n")),
        ]);
        assert!(
            found.iter().any(|p| p.contains("mirrors already: a step's mirror would be a second, which needs a gateway with HTTPRouteRequestMultipleMirrors")),
            "{found:?}"
        );
        let taken = format!("{eight}  - {{name: r0-canary, backendRefs: [{{name: other, port: 80}}]}}\n");
        let found = problems(&[("a/w.yaml", &route(taken)), ("a/r.yaml", &ab)]);
        assert!(
            found.iter().any(|p| p.contains("rule \"r0\" gets a rule \"r0-canary\" for the canary's matching requests, and another rule has that name")),
            "{found:?}"
        );
    }

    const WORKLOAD: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: echo, namespace: demo}\nspec: {}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: echo, namespace: demo}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: echo, namespace: demo}\n";

    fn rollout(steps: &str) -> String {
        format!(
            "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata: {{name: echo, namespace: demo}}\nspec:\n  workloadRef: {{kind: Deployment, name: echo}}\n  strategy:\n    canary:\n      trafficRoutings: [{{service: echo, gateway: {{httpRouteName: echo}}}}]\n      steps:\n{steps}"
        )
    }

    const FUNCTION: &str = "apiVersion: serving.knative.dev/v1\nkind: Service\nmetadata: {name: fn, namespace: demo}\nspec:\n  template:\n    spec:\n      containers: [{image: fn:1}]\n";

    fn function_rollout(canary: &str) -> String {
        format!(
            "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata: {{name: fn, namespace: demo}}\nspec:\n  workloadRef: {{apiVersion: serving.knative.dev/v1, kind: Service, name: fn}}\n  strategy:\n    canary:\n{canary}"
        )
    }

    #[test]
    fn a_function_rollout_needs_no_routes_and_takes_a_minimum_scale() {
        let rollout = function_rollout(
            "      canaryMinScale: 1\n      steps:\n      - {traffic: 10%, pause: {}}\n      - {traffic: 100%}\n",
        );
        assert_eq!(
            problems(&[("fn/s.yaml", FUNCTION), ("fn/r.yaml", &rollout)]),
            Vec::<String>::new()
        );
        // A core Service of the same name is not the function.
        let core = "apiVersion: v1\nkind: Service\nmetadata: {name: fn, namespace: demo}\n";
        let found = problems(&[("fn/s.yaml", core), ("fn/r.yaml", &rollout)]);
        assert!(
            found
                .iter()
                .any(|p| p.contains("workloadRef names Service demo/fn, which is not in this app")),
            "{found:?}"
        );
    }

    #[test]
    fn what_a_function_cannot_take_is_refused_with_why() {
        let rollout = function_rollout(
            "      trafficRoutings: [{service: fn, gateway: {httpRouteName: fn}}]\n      patchPodTemplateMetadata: {labels: {v: c}}\n      steps:\n      - {traffic: 10%, replicas: 1}\n",
        );
        let found = problems(&[("fn/s.yaml", FUNCTION), ("fn/r.yaml", &rollout)]);
        for wanted in [
            "fn/r.yaml:1: step 1: replicas cannot be set for a Knative Service: Knative scales each Revision by its requests",
            "fn/r.yaml:1: trafficRoutings cannot be set for a Knative Service",
            "fn/r.yaml:1: patchPodTemplateMetadata cannot be set for a Knative Service",
        ] {
            assert!(found.iter().any(|p| p.starts_with(wanted)), "{wanted} in {found:?}");
        }
        let deployment = rollout_with_min_scale();
        let found = problems(&[("a/w.yaml", WORKLOAD), ("a/r.yaml", &deployment)]);
        assert!(
            found
                .iter()
                .any(|p| p.contains("canaryMinScale is for a Knative Service")),
            "{found:?}"
        );
    }

    fn rollout_with_min_scale() -> String {
        rollout("      - {traffic: 10%}\n").replace("      steps:", "      canaryMinScale: 1\n      steps:")
    }

    #[test]
    fn traffic_git_pins_to_a_named_revision_is_refused_at_the_service() {
        let pinned = format!("{FUNCTION}  traffic:\n  - {{revisionName: fn-00001, percent: 100}}\n");
        let rollout = function_rollout("      steps:\n      - {traffic: 10%}\n");
        let found = problems(&[("fn/s.yaml", &pinned), ("fn/r.yaml", &rollout)]);
        assert!(
            found.iter().any(|p| p.starts_with("fn/s.yaml:1: Knative Service demo/fn, which Rollout fn governs: spec.traffic sends no share to the latest Revision")),
            "{found:?}"
        );
    }

    /// Kruise's v1beta1 blue-green shape: the new version at half then full
    /// size with no traffic (a preview), then switched in two steps.
    const BLUE_GREEN: &str = "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata: {name: echo, namespace: demo}\nspec:\n  workloadRef: {apiVersion: apps/v1, kind: Deployment, name: echo}\n  strategy:\n    blueGreen:\n      steps:\n      - {replicas: 50%, traffic: 0%, pause: {}}\n      - {replicas: 100%, traffic: 0%}\n      - {replicas: 100%, traffic: 50%}\n      - {replicas: 100%, traffic: 100%}\n      trafficRoutings:\n      - service: echo\n        gateway: {httpRouteName: echo}\n";

    #[test]
    fn a_blue_green_release_of_a_deployment_through_a_route_passes_and_what_it_cannot_switch_is_refused() {
        assert_eq!(
            problems(&[("echo/app.yaml", WORKLOAD), ("echo/rollout.yaml", BLUE_GREEN)]),
            Vec::<String>::new()
        );
        let statefulset = WORKLOAD.replacen("kind: Deployment", "kind: StatefulSet", 1);
        let on_statefulset = BLUE_GREEN.replace("kind: Deployment", "kind: StatefulSet");
        let unrouted = BLUE_GREEN.replace(
            "      trafficRoutings:\n      - service: echo\n        gateway: {httpRouteName: echo}\n",
            "",
        );
        let no_service = BLUE_GREEN.replace("      steps:", "      canaryService: {disabled: true}\n      steps:");
        let unsaid = BLUE_GREEN.replace("{replicas: 100%, traffic: 0%}", "{replicas: 100%}");
        let half = BLUE_GREEN.replace("      - {replicas: 100%, traffic: 100%}\n", "");
        let escape = BLUE_GREEN.replace(
            "traffic: 0%, pause",
            "traffic: 0%, matches: [{headers: [{name: x, value: \"a\\nb\"}]}], pause",
        );
        for (workload, rollout, wanted) in [
            (
                statefulset.as_str(),
                on_statefulset.as_str(),
                "blueGreen needs a Deployment: a StatefulSet's pods are replaced in place",
            ),
            (WORKLOAD, unrouted.as_str(), "blueGreen needs a trafficRouting"),
            (WORKLOAD, no_service.as_str(), "blueGreen needs the canary Service"),
            (
                WORKLOAD,
                unsaid.as_str(),
                "step 2: blueGreen steps say how much traffic the new version takes",
            ),
            (
                WORKLOAD,
                half.as_str(),
                "blueGreen switches every request before promote",
            ),
            (WORKLOAD, escape.as_str(), "step 1: a match holds a control character"),
        ] {
            let found = problems(&[("echo/app.yaml", workload), ("echo/rollout.yaml", rollout)]);
            assert!(
                found
                    .iter()
                    .any(|p| p.starts_with(&format!("echo/rollout.yaml:1: {wanted}"))),
                "{wanted} in {found:?}"
            );
        }
        // One style at a time, and one at least.
        let both = BLUE_GREEN.replace(
            "    blueGreen:\n",
            "    canary: {steps: [{traffic: 10%}]}\n    blueGreen:\n",
        );
        let found = problems(&[("echo/app.yaml", WORKLOAD), ("echo/rollout.yaml", &both)]);
        assert!(
            found.iter().any(|p| p.contains("set canary or blueGreen, not both")),
            "{found:?}"
        );
        let neither = BLUE_GREEN.replace("    blueGreen:\n", "    nothing:\n");
        let found = problems(&[("echo/app.yaml", WORKLOAD), ("echo/rollout.yaml", &neither)]);
        assert!(found.iter().any(|p| p.starts_with("echo/rollout.yaml:")), "{found:?}");
    }

    /// Kruise's v1beta1 canary shape, only its apiVersion changed.
    const KRUISE_CANARY: &str = "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata: {name: echo, namespace: demo}\nspec:\n  workloadRef: {apiVersion: apps/v1, kind: Deployment, name: echo}\n  strategy:\n    canary:\n      enableExtraWorkloadForCanary: true\n      failureThreshold: 20%\n      steps:\n      - {traffic: 20%, replicas: 20%, pause: {}}\n      - {traffic: 100%, replicas: 100%, pause: {duration: 0}}\n      trafficRoutings:\n      - service: echo\n        ingress: {classType: nginx, name: echo}\n";
    const WITH_INGRESS: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: echo, namespace: demo}\nspec: {}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: echo, namespace: demo}\n---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: echo, namespace: demo}\n";

    #[test]
    fn kruise_fields_are_taken_where_they_mean_the_same_and_refused_with_why_where_not() {
        assert_eq!(
            problems(&[("echo/app.yaml", WITH_INGRESS), ("echo/rollout.yaml", KRUISE_CANARY)]),
            Vec::<String>::new()
        );
        let in_place = KRUISE_CANARY.replace(
            "enableExtraWorkloadForCanary: true",
            "enableExtraWorkloadForCanary: false",
        );
        let too_many = KRUISE_CANARY.replace("failureThreshold: 20%", "failureThreshold: 120%");
        let no_service = KRUISE_CANARY.replace("failureThreshold: 20%", "disableGenerateCanaryService: true");
        for (rollout, wanted) in [
            (
                in_place,
                "enableExtraWorkloadForCanary: false (Kruise's in-place partition of a Deployment) is not supported",
            ),
            (too_many, "failureThreshold 120% is more than 100%"),
            (
                no_service,
                "step 1: traffic needs a canary Service, and canaryService.disabled (or disableGenerateCanaryService) is true",
            ),
        ] {
            let found = problems(&[("echo/app.yaml", WITH_INGRESS), ("echo/rollout.yaml", &rollout)]);
            assert!(
                found
                    .iter()
                    .any(|p| p.starts_with(&format!("echo/rollout.yaml:1: {wanted}"))),
                "{wanted} in {found:?}"
            );
        }
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
    fn rollout_ids_and_canary_suffixes_that_cannot_name_things_are_refused() {
        let base = rollout("      - {traffic: 10%}\n");
        let with = |field: &str| base.replace("  strategy:\n", &format!("  {field}\n  strategy:\n"));
        let found = problems(&[
            ("echo/app.yaml", WORKLOAD),
            ("echo/rollout.yaml", &with("rolloutID: \"a\\n/gitcanary promote\"")),
        ]);
        assert!(
            found
                .iter()
                .any(|p| p.contains("rolloutID \"a\\n/gitcanary promote\" must be")),
            "{found:?}"
        );
        let found = problems(&[
            ("echo/app.yaml", WORKLOAD),
            ("echo/rollout.yaml", &with("rolloutID: v1..2")),
        ]);
        assert!(found.iter().any(|p| p.contains("rolloutID \"v1..2\"")), "{found:?}");
        let suffixed = base.replace("    canary:\n", "    canary:\n      canarySuffix: -Next\n");
        let found = problems(&[("echo/app.yaml", WORKLOAD), ("echo/rollout.yaml", &suffixed)]);
        assert!(
            found
                .iter()
                .any(|p| p.contains("canarySuffix \"-Next\" must be lowercase")),
            "{found:?}"
        );
        let long = base.replace(
            "    canary:\n",
            &format!("    canary:\n      canarySuffix: -{}\n", "x".repeat(60)),
        );
        let found = problems(&[("echo/app.yaml", WORKLOAD), ("echo/rollout.yaml", &long)]);
        assert!(
            found
                .iter()
                .any(|p| p.contains("longer than Kubernetes' 63 characters")),
            "{found:?}"
        );
        let fine =
            with("rolloutID: release-2.4_rc1").replace("    canary:\n", "    canary:\n      canarySuffix: -next\n");
        assert_eq!(
            problems(&[("echo/app.yaml", WORKLOAD), ("echo/rollout.yaml", &fine)]),
            Vec::<String>::new()
        );
    }

    #[test]
    fn signals_held_in_git_are_refused() {
        let r = rollout("      - {replicas: 1, pause: {}}\n").replace(
            "metadata: {name: echo, namespace: demo}",
            "metadata: {name: echo, namespace: demo, annotations: {gitcanary.io/promote: \"yes\"}}",
        );
        let found = problems(&[("echo/app.yaml", WORKLOAD), ("echo/rollout.yaml", &r)]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("echo/rollout.yaml:1: annotation gitcanary.io/promote is gitcanary's own signal"),
            "{found:?}"
        );
    }

    #[test]
    fn a_manifest_that_names_a_rollout_as_its_owner_is_refused() {
        let claimed = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: echo-canary\n  ownerReferences:\n  - {apiVersion: gitcanary.io/v1alpha1, kind: Rollout, name: echo, uid: \"1234\"}\nspec: {}\n";
        let found = problems(&[("other/canary.yaml", claimed)]);
        assert!(
            found
                .iter()
                .any(|p| p.starts_with("other/canary.yaml:1: metadata.ownerReferences names a gitcanary Rollout")),
            "{found:?}"
        );
        let owned_elsewhere = claimed.replace("gitcanary.io/v1alpha1, kind: Rollout", "apps/v1, kind: ReplicaSet");
        assert!(problems(&[("other/canary.yaml", &owned_elsewhere)]).is_empty());
    }

    #[test]
    fn durations_that_overflow_or_pass_thirty_days_are_refused_with_file_and_line() {
        let r = rollout(
            "      - {traffic: 10%, pause: {duration: \"18446744073709551615s1s\"}}\n      - {traffic: 20%, pause: {duration: 2592001}}\n",
        )
        .replace(
            "    canary:\n",
            "    canary:\n      progressDeadline: 31d\n      gracePeriodSeconds: 2592001\n",
        )
        .replace("      progressDeadline: 31d", "      progressDeadline: 745h");
        let r = format!(
            "{r}  analysisTemplates:\n  - name: t\n    interval: 18446744073709551615\n    metrics: [{{name: m, query: up, successCondition: \"> 0\"}}]\n"
        );
        let found = problems(&[("echo/app.yaml", WORKLOAD), ("echo/rollout.yaml", &r)]);
        for wanted in [
            "echo/rollout.yaml:1: step 1: pause invalid duration \"18446744073709551615s1s\": too long",
            "echo/rollout.yaml:1: step 2: pause duration 2592001 is longer than the maximum of 30 days",
            "echo/rollout.yaml:1: progressDeadline: duration \"745h\" is longer than the maximum of 30 days",
            "echo/rollout.yaml:1: gracePeriodSeconds: 2592001 is longer than the maximum of 30 days",
            "echo/rollout.yaml:1: analysis template \"t\": interval: duration 18446744073709551615 is longer",
        ] {
            assert!(found.iter().any(|p| p.starts_with(wanted)), "{wanted} in {found:?}");
        }
    }

    #[test]
    fn matches_take_gateway_api_match_types_and_nginx_one_header() {
        let good = rollout(
            "      - matches: [{headers: [{name: x-canary, value: \"yes\"}]}, {path: {type: Exact, value: /beta}, queryParams: [{type: RegularExpression, name: q, value: \"^a\"}]}]\n        pause: {}\n      - {traffic: 100%}\n",
        );
        assert_eq!(
            problems(&[("echo/app.yaml", WORKLOAD), ("echo/rollout.yaml", &good)]),
            Vec::<String>::new()
        );
        let bad = rollout("      - matches: [{headers: [{type: Prefix, name: \"\", value: a}]}, {}]\n");
        let found = problems(&[("echo/app.yaml", WORKLOAD), ("echo/rollout.yaml", &bad)]);
        for expected in [
            "step 1: header \"\": type \"Prefix\" is not Exact or RegularExpression",
            "step 1: a header match needs a name",
            "step 1: a match needs a path, headers or queryParams",
        ] {
            assert!(found.iter().any(|p| p.contains(expected)), "{expected}: {found:?}");
        }
        let after_share = rollout(
            "      - {traffic: 20%, pause: {}}\n      - matches: [{headers: [{name: x, value: \"1\"}], path: {type: Exact}}]\n",
        );
        let found = problems(&[("echo/app.yaml", WORKLOAD), ("echo/rollout.yaml", &after_share)]);
        for expected in [
            "step 2: matches without traffic send no other request to the canary, which would drop the 20% of an earlier step",
            "step 2: a path match needs a value starting with \"/\"",
        ] {
            assert!(found.iter().any(|p| p.contains(expected)), "{expected}: {found:?}");
        }
        let disabled = good.replace(
            "      steps:\n",
            "      canaryService: {disabled: true}\n      steps:\n",
        );
        let found = problems(&[("echo/app.yaml", WORKLOAD), ("echo/rollout.yaml", &disabled)]);
        assert!(
            found
                .iter()
                .any(|p| p.contains("step 1: matches need a canary Service")),
            "{found:?}"
        );
        let nginx = good.replace("gateway: {httpRouteName: echo}", "ingress: {name: echo}");
        let found = problems(&[("echo/app.yaml", WORKLOAD), ("echo/rollout.yaml", &nginx)]);
        assert!(
            found.iter().any(|p| p.contains(
                "step 1: an nginx Ingress sends requests to its canary by one header (canary-by-header) or one cookie"
            )),
            "{found:?}"
        );
        // nginx's cookie, as Kruise writes it: a header match named canary-by-cookie.
        let cookie = rollout(
            "      - matches: [{headers: [{name: canary-by-cookie, value: beta}]}, {headers: [{name: x-canary, value: \"yes\"}]}]\n        traffic: 0%\n        pause: {}\n",
        );
        let on_nginx = cookie.replace("gateway: {httpRouteName: echo}", "ingress: {name: echo}");
        assert_eq!(
            problems(&[("echo/app.yaml", WITH_INGRESS), ("echo/rollout.yaml", &on_nginx)]),
            Vec::<String>::new()
        );
        // nginx ORs the cookie and the header: one match holding both would read as AND.
        let anded = on_nginx.replace("beta}]}, {headers: [{name: x-canary", "beta}, {name: x-canary");
        let found = problems(&[("echo/app.yaml", WITH_INGRESS), ("echo/rollout.yaml", &anded)]);
        assert!(found.iter().any(|p| p.contains("each a match of its own")), "{found:?}");
        let found = problems(&[("echo/app.yaml", WORKLOAD), ("echo/rollout.yaml", &cookie)]);
        assert!(
            found
                .iter()
                .any(|p| p.contains("step 1: a header named canary-by-cookie is nginx's cookie match")),
            "{found:?}"
        );
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
