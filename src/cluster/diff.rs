//! What the next sync would change, object by object, as unified diffs of
//! the fields that matter (server-managed metadata and status left out).

use serde_json::Value;

use crate::APPLIED_HASH_ANNOTATION;
use crate::manifest::ObjectKey;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Create,
    Update,
    Delete,
}

#[derive(Debug, Clone)]
pub struct ObjectDiff {
    pub key: ObjectKey,
    /// `file:line` of the manifest, or empty for an object to be pruned.
    pub location: String,
    pub change: Change,
    pub unified: String,
}

impl ObjectDiff {
    /// Compares the live object (if any) with what the API server would
    /// store after apply (a dry run), or with nothing for a prune.
    pub fn between(
        key: ObjectKey,
        location: String,
        live: Option<&Value>,
        after: Option<&Value>,
    ) -> Option<ObjectDiff> {
        let before_text = live.map(|v| to_yaml(&normalize(v))).unwrap_or_default();
        let after_text = after.map(|v| to_yaml(&normalize(v))).unwrap_or_default();
        if before_text == after_text {
            return None;
        }
        let change = match (live, after) {
            (None, _) => Change::Create,
            (_, None) => Change::Delete,
            _ => Change::Update,
        };
        let label = key.to_string();
        let unified = similar::TextDiff::from_lines(&before_text, &after_text)
            .unified_diff()
            .context_radius(3)
            .header(&format!("live: {label}"), &format!("git: {label}"))
            .to_string();
        Some(ObjectDiff {
            key,
            location,
            change,
            unified,
        })
    }
}

/// Drops what the server manages and the user never writes.
fn normalize(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in [
            "managedFields",
            "resourceVersion",
            "uid",
            "generation",
            "creationTimestamp",
            "selfLink",
        ] {
            metadata.remove(field);
        }
        if let Some(annotations) = metadata.get_mut("annotations").and_then(Value::as_object_mut) {
            annotations.remove(APPLIED_HASH_ANNOTATION);
            annotations.remove("deployment.kubernetes.io/revision");
            annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
            if annotations.is_empty() {
                metadata.remove("annotations");
            }
        }
    }
    object
}

fn to_yaml(value: &Value) -> String {
    serde_saphyr::to_string(value).unwrap_or_else(|_| serde_json::to_string_pretty(value).unwrap_or_default())
}

/// Renders diffs for a terminal; `color` adds ANSI red and green.
pub fn render_diff(diffs: &[ObjectDiff], color: bool) -> String {
    let mut out = String::new();
    for diff in diffs {
        let verb = match diff.change {
            Change::Create => "create",
            Change::Update => "update",
            Change::Delete => "prune",
        };
        let origin = if diff.location.is_empty() {
            String::new()
        } else {
            format!(" ({})", diff.location)
        };
        out.push_str(&format!("{verb} {}{origin}\n", diff.key));
        for line in diff.unified.lines() {
            let painted = match line.chars().next() {
                Some('+') if color && !line.starts_with("+++") => format!("\x1b[32m{line}\x1b[0m"),
                Some('-') if color && !line.starts_with("---") => format!("\x1b[31m{line}\x1b[0m"),
                Some('@') if color => format!("\x1b[36m{line}\x1b[0m"),
                _ => line.to_string(),
            };
            out.push_str(&painted);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key() -> ObjectKey {
        ObjectKey {
            group: String::new(),
            kind: "ConfigMap".into(),
            namespace: Some("demo".into()),
            name: "a".into(),
        }
    }

    #[test]
    fn server_fields_never_show_up() {
        let live = json!({"metadata": {"name": "a", "resourceVersion": "1", "uid": "x", "managedFields": []}, "data": {"k": "v"}});
        let after = json!({"metadata": {"name": "a", "resourceVersion": "2", "uid": "x"}, "data": {"k": "v"}});
        assert!(ObjectDiff::between(key(), String::new(), Some(&live), Some(&after)).is_none());
    }

    #[test]
    fn a_changed_value_is_a_one_line_change() {
        let live = json!({"metadata": {"name": "a"}, "data": {"k": "old", "x": "same"}});
        let after = json!({"metadata": {"name": "a"}, "data": {"k": "new", "x": "same"}});
        let diff = ObjectDiff::between(key(), "a/cm.yaml:1".into(), Some(&live), Some(&after)).expect("differs");
        assert_eq!(diff.change, Change::Update);
        assert!(diff.unified.contains("-  k: old"), "{}", diff.unified);
        assert!(diff.unified.contains("+  k: new"), "{}", diff.unified);
        let text = render_diff(&[diff], true);
        assert!(text.starts_with("update ConfigMap demo/a (a/cm.yaml:1)"));
        assert!(text.contains("\x1b[32m+  k: new\x1b[0m"));
    }
}
