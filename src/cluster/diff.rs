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
        let (live, after) = (live.map(normalize), after.map(normalize));
        // By the key, not the body: a live object read back may carry no `kind`.
        let (live, after) = if is_secret(&key) {
            mask_secret_values(live, after)
        } else {
            (live, after)
        };
        // Equal as values is equal, whatever order each side's keys come in.
        if live == after {
            return None;
        }
        let after = match (&live, after) {
            (Some(live), Some(after)) => Some(in_order_of(after, live)),
            (_, after) => after,
        };
        let before_text = live.as_ref().map(to_yaml).unwrap_or_default();
        let after_text = after.as_ref().map(to_yaml).unwrap_or_default();
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

/// What stands for a Secret value in a diff, as `kubectl diff` does: the
/// same marker on both sides when the value is unchanged, a before/after
/// pair when it changed, never the value itself.
pub const SECRET_UNCHANGED: &str = "***";
pub const SECRET_BEFORE: &str = "*** (before)";
pub const SECRET_AFTER: &str = "*** (after)";

/// A core Secret; a CRD of another group named `Secret` holds no Secret data.
pub fn is_secret(key: &ObjectKey) -> bool {
    key.group.is_empty() && key.kind == "Secret"
}

/// Replaces every value under a Secret's `data` and `stringData` with a
/// marker, so a diff shows which keys were added, removed or changed but
/// no value. Either side may be absent (create, prune).
pub fn mask_secret_values(before: Option<Value>, after: Option<Value>) -> (Option<Value>, Option<Value>) {
    let (mut before, mut after) = (before, after);
    for field in ["data", "stringData"] {
        let before_values = before.as_ref().and_then(|o| o.get(field)).cloned();
        let after_values = after.as_ref().and_then(|o| o.get(field)).cloned();
        let marker = |mine: &Value, other: Option<&Value>, changed: &'static str| match other {
            Some(theirs) if theirs == mine => Value::from(SECRET_UNCHANGED),
            _ => Value::from(changed),
        };
        if let Some(values) = before.as_mut().and_then(|o| o.get_mut(field)) {
            *values = mask_map(values, after_values.as_ref(), |mine, other| {
                marker(mine, other, SECRET_BEFORE)
            });
        }
        if let Some(values) = after.as_mut().and_then(|o| o.get_mut(field)) {
            *values = mask_map(values, before_values.as_ref(), |mine, other| {
                marker(mine, other, SECRET_AFTER)
            });
        }
    }
    (before, after)
}

/// Masks each entry of `values` given the same key's entry on the other
/// side; anything that is not a map is masked whole.
fn mask_map(values: &Value, other: Option<&Value>, marker: impl Fn(&Value, Option<&Value>) -> Value) -> Value {
    match values.as_object() {
        Some(map) => Value::Object(
            map.iter()
                .map(|(key, value)| (key.clone(), marker(value, other.and_then(|o| o.get(key)))))
                .collect(),
        ),
        None => marker(values, other),
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

/// `value` with the keys of every map in the order `model` has them (keys
/// `model` lacks after), so a diff shows changes, not key order.
fn in_order_of(value: Value, model: &Value) -> Value {
    match (value, model) {
        (Value::Object(mut map), Value::Object(model)) => {
            let mut ordered = serde_json::Map::new();
            for (key, model_value) in model {
                if let Some(value) = map.remove(key) {
                    ordered.insert(key.clone(), in_order_of(value, model_value));
                }
            }
            ordered.extend(map);
            Value::Object(ordered)
        }
        (Value::Array(items), Value::Array(model)) => Value::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(i, item)| match model.get(i) {
                    Some(model) => in_order_of(item, model),
                    None => item,
                })
                .collect(),
        ),
        (value, _) => value,
    }
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
    fn key_order_alone_is_no_change_and_does_not_show_in_a_diff() {
        let live = json!({"metadata": {"namespace": "demo", "labels": {"a": "1"}, "name": "a"}, "data": {"k": "v"}});
        let same = json!({"data": {"k": "v"}, "metadata": {"name": "a", "labels": {"a": "1"}, "namespace": "demo"}});
        assert!(ObjectDiff::between(key(), String::new(), Some(&live), Some(&same)).is_none());
        let changed = json!({"data": {"k": "w"}, "metadata": {"name": "a", "labels": {"a": "1"}, "namespace": "demo"}});
        let diff = ObjectDiff::between(key(), String::new(), Some(&live), Some(&changed)).expect("differs");
        let lines: Vec<&str> = diff
            .unified
            .lines()
            .filter(|l| (l.starts_with('-') || l.starts_with('+')) && !l.starts_with("---") && !l.starts_with("+++"))
            .collect();
        assert_eq!(lines, ["-  k: v", "+  k: w"], "{}", diff.unified);
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

    fn secret_key() -> ObjectKey {
        ObjectKey {
            kind: "Secret".into(),
            ..key()
        }
    }

    fn secret(data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a", "namespace": "demo"}, "data": data})
    }

    #[test]
    fn secret_values_are_markers_changed_or_not() {
        let live = secret(json!({"password": "b2xkLXB3", "user": "YWRtaW4=", "gone": "Z29uZQ=="}));
        let after = secret(json!({"password": "bmV3LXB3", "user": "YWRtaW4=", "added": "YWRkZWQ="}));
        let (before, after) = mask_secret_values(Some(live), Some(after));
        assert_eq!(
            before.expect("live")["data"],
            json!({"password": "*** (before)", "user": "***", "gone": "*** (before)"})
        );
        assert_eq!(
            after.expect("after")["data"],
            json!({"password": "*** (after)", "user": "***", "added": "*** (after)"})
        );
    }

    #[test]
    fn a_secret_diff_never_shows_a_value() {
        let live = secret(json!({"password": "b2xkLXB3"}));
        let mut after = secret(json!({"password": "bmV3LXB3"}));
        after["stringData"] = json!({"token": "plain-token"});
        let diff = ObjectDiff::between(secret_key(), "a/s.yaml:1".into(), Some(&live), Some(&after)).expect("differs");
        for value in ["b2xkLXB3", "bmV3LXB3", "plain-token"] {
            assert!(!diff.unified.contains(value), "{value} in {}", diff.unified);
        }
        assert!(
            diff.unified.contains("-  password: \"*** (before)\""),
            "{}",
            diff.unified
        );
        assert!(
            diff.unified.contains("+  password: \"*** (after)\""),
            "{}",
            diff.unified
        );
        // Created and pruned Secrets are masked too.
        let created = ObjectDiff::between(secret_key(), String::new(), None, Some(&after)).expect("created");
        assert!(!created.unified.contains("bmV3LXB3") && !created.unified.contains("plain-token"));
        let pruned = ObjectDiff::between(secret_key(), String::new(), Some(&live), None).expect("pruned");
        assert!(!pruned.unified.contains("b2xkLXB3"), "{}", pruned.unified);
    }

    #[test]
    fn a_secret_with_only_a_changed_value_still_shows_a_change() {
        let live = secret(json!({"password": "b2xkLXB3"}));
        let after = secret(json!({"password": "bmV3LXB3"}));
        assert!(ObjectDiff::between(secret_key(), String::new(), Some(&live), Some(&after)).is_some());
        assert!(ObjectDiff::between(secret_key(), String::new(), Some(&live), Some(&live)).is_none());
    }

    #[test]
    fn other_kinds_keep_their_values() {
        let live = json!({"metadata": {"name": "a"}, "data": {"k": "old"}});
        let after = json!({"metadata": {"name": "a"}, "data": {"k": "new"}});
        let diff = ObjectDiff::between(key(), String::new(), Some(&live), Some(&after)).expect("differs");
        assert!(diff.unified.contains("+  k: new"), "{}", diff.unified);
        assert!(is_secret(&secret_key()));
        assert!(!is_secret(&ObjectKey {
            group: "evil.example.com".into(),
            ..secret_key()
        }));
    }
}
