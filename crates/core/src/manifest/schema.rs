//! Offline checks of what the API server would refuse: an object against a
//! structural OpenAPI schema (a CRD's, such as gitcanary's own `Rollout`),
//! and built-in kinds through k8s-openapi's types, so that `validate` fails
//! where `sync` would. Each problem names the field.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::Manifest;

/// Checks `value` (at `path`) against a structural schema: types, required
/// fields, enums and unknown fields, as the API server does with strict
/// field validation. Returns one message per problem, each naming its field.
pub fn schema_problems(value: &Value, schema: &Value, path: &str) -> Vec<String> {
    let mut problems = Vec::new();
    check(value, schema, path, &mut problems);
    problems
}

fn check(value: &Value, schema: &Value, path: &str, problems: &mut Vec<String>) {
    if value.is_null() {
        // An absent optional field reads as null in YAML (`field:`).
        return;
    }
    if schema["x-kubernetes-int-or-string"] == true {
        if !(value.is_string() || value.is_i64() || value.is_u64()) {
            problems.push(format!("{path}: must be a number or a string, not {}", kind_of(value)));
        }
        return;
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        let names: Vec<String> = allowed.iter().filter(|v| !v.is_null()).map(Value::to_string).collect();
        problems.push(format!("{path}: {value} is not one of {}", names.join(", ")));
        return;
    }
    match schema["type"].as_str() {
        Some("object") => check_object(value, schema, path, problems),
        Some("array") => match value.as_array() {
            Some(items) => {
                for (index, item) in items.iter().enumerate() {
                    check(item, &schema["items"], &format!("{path}[{index}]"), problems);
                }
            }
            None => problems.push(format!("{path}: must be a list, not {}", kind_of(value))),
        },
        Some("string") if !value.is_string() => {
            problems.push(format!("{path}: must be a string, not {}", kind_of(value)));
        }
        Some("integer") if !(value.is_i64() || value.is_u64()) => {
            problems.push(format!("{path}: must be an integer, not {}", kind_of(value)));
        }
        Some("integer") if schema["format"] == "int32" && value.as_i64().is_none_or(|n| i32::try_from(n).is_err()) => {
            problems.push(format!("{path}: {value} does not fit in 32 bits"));
        }
        Some("number") if !value.is_number() => {
            problems.push(format!("{path}: must be a number, not {}", kind_of(value)));
        }
        Some("boolean") if !value.is_boolean() => {
            problems.push(format!("{path}: must be true or false, not {}", kind_of(value)));
        }
        _ => {}
    }
}

fn check_object(value: &Value, schema: &Value, path: &str, problems: &mut Vec<String>) {
    let Some(fields) = value.as_object() else {
        problems.push(format!("{path}: must be a mapping, not {}", kind_of(value)));
        return;
    };
    for required in schema["required"].as_array().into_iter().flatten() {
        if let Some(name) = required.as_str()
            && fields.get(name).is_none_or(Value::is_null)
        {
            problems.push(format!("{}: required", join(path, name)));
        }
    }
    let properties = schema["properties"].as_object();
    let preserve = schema["x-kubernetes-preserve-unknown-fields"] == true;
    for (name, field) in fields {
        let field_path = join(path, name);
        match properties.and_then(|p| p.get(name)) {
            Some(field_schema) => check(field, field_schema, &field_path, problems),
            None if schema["additionalProperties"].is_object() => {
                check(field, &schema["additionalProperties"], &field_path, problems);
            }
            None if preserve || schema["additionalProperties"] == true => {}
            None => {
                let mut known: Vec<&str> = properties
                    .into_iter()
                    .flat_map(|p| p.keys())
                    .map(String::as_str)
                    .collect();
                known.sort_unstable();
                problems.push(format!("{field_path}: unknown field (known: {})", known.join(", ")));
            }
        }
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// A built-in kind's fields against k8s-openapi's type: a field of the wrong
/// type is named with its path. Kinds it does not know are left to the API
/// server's dry run.
pub fn typed_problem(manifest: &Manifest) -> Option<String> {
    use k8s_openapi::api::{apps, autoscaling, batch, core, networking, policy, rbac};
    let object = &manifest.object;
    match (manifest.api_version(), manifest.kind()) {
        ("v1", "ConfigMap") => typed::<core::v1::ConfigMap>(object),
        ("v1", "Namespace") => typed::<core::v1::Namespace>(object),
        ("v1", "Pod") => typed::<core::v1::Pod>(object),
        ("v1", "Service") => typed::<core::v1::Service>(object),
        ("v1", "ServiceAccount") => typed::<core::v1::ServiceAccount>(object),
        ("v1", "PersistentVolumeClaim") => typed::<core::v1::PersistentVolumeClaim>(object),
        ("apps/v1", "Deployment") => typed::<apps::v1::Deployment>(object),
        ("apps/v1", "StatefulSet") => typed::<apps::v1::StatefulSet>(object),
        ("apps/v1", "DaemonSet") => typed::<apps::v1::DaemonSet>(object),
        ("batch/v1", "Job") => typed::<batch::v1::Job>(object),
        ("batch/v1", "CronJob") => typed::<batch::v1::CronJob>(object),
        ("networking.k8s.io/v1", "Ingress") => typed::<networking::v1::Ingress>(object),
        ("networking.k8s.io/v1", "NetworkPolicy") => typed::<networking::v1::NetworkPolicy>(object),
        ("policy/v1", "PodDisruptionBudget") => typed::<policy::v1::PodDisruptionBudget>(object),
        ("autoscaling/v2", "HorizontalPodAutoscaler") => typed::<autoscaling::v2::HorizontalPodAutoscaler>(object),
        ("rbac.authorization.k8s.io/v1", "Role") => typed::<rbac::v1::Role>(object),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => typed::<rbac::v1::RoleBinding>(object),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => typed::<rbac::v1::ClusterRole>(object),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => typed::<rbac::v1::ClusterRoleBinding>(object),
        _ => None,
    }
}

fn typed<T: DeserializeOwned>(object: &Value) -> Option<String> {
    let error = serde_path_to_error::deserialize::<_, T>(object).err()?;
    let path = error.path().to_string();
    let inner = error.into_inner();
    Some(if path == "." {
        inner.to_string()
    } else {
        format!("{path}: {inner}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"},
            "count": {"type": "integer", "format": "int32", "nullable": true},
            "size": {"x-kubernetes-int-or-string": true},
            "mode": {"type": "string", "enum": ["revert", "hold"]},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "steps": {"type": "array", "items": {"type": "object", "properties": {"on": {"type": "boolean"}}}},
        }})
    }

    #[test]
    fn what_the_api_server_refuses_is_named_by_field() {
        let value = json!({"count": "three", "size": [1], "mode": "undo", "labels": {"a": 1},
            "steps": [{"on": true}, {"on": "yes", "off": 1}], "extra": 1});
        let mut found = schema_problems(&value, &schema(), "spec");
        found.sort();
        assert_eq!(
            found,
            vec![
                "spec.count: must be an integer, not a string",
                "spec.extra: unknown field (known: count, labels, mode, name, size, steps)",
                "spec.labels.a: must be a string, not a number",
                "spec.mode: \"undo\" is not one of \"revert\", \"hold\"",
                "spec.name: required",
                "spec.size: must be a number or a string, not a list",
                "spec.steps[1].off: unknown field (known: on)",
                "spec.steps[1].on: must be true or false, not a string",
            ]
        );
        let good = json!({"name": "x", "count": 3, "size": "50%", "mode": "hold", "labels": {"a": "b"}, "steps": [{"on": false}]});
        assert!(schema_problems(&good, &schema(), "spec").is_empty());
        assert_eq!(
            schema_problems(&json!({"name": "x", "count": 5_000_000_000_i64}), &schema(), "spec"),
            vec!["spec.count: 5000000000 does not fit in 32 bits"]
        );
    }

    #[test]
    fn built_in_kinds_are_checked_through_their_types() {
        let manifest = |object: Value| Manifest {
            app: "web".into(),
            file: "web/deploy.yaml".into(),
            line: 1,
            object,
        };
        let wrong = manifest(
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": "three", "selector": {}, "template": {}}}),
        );
        let problem = typed_problem(&wrong).expect("a problem");
        assert!(
            problem.starts_with("spec.replicas: invalid type: string \"three\""),
            "{problem}"
        );
        let right = manifest(
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": {}}}),
        );
        assert_eq!(typed_problem(&right), None);
        let unknown =
            manifest(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": 1}));
        assert_eq!(typed_problem(&unknown), None);
    }
}
