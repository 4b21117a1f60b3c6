//! `gitcanary.yaml`, the settings of a rendered app: read, checked line by
//! line before any renderer runs, and which renderer an app needs.

use serde::Deserialize;

use super::{SETTINGS_FILE, SourceTree, tree};
use crate::manifest::Problem;

/// Names Kustomize accepts for a kustomization, in its order of preference.
pub const KUSTOMIZATION_FILES: [&str; 3] = ["kustomization.yaml", "kustomization.yml", "Kustomization"];

/// `gitcanary.yaml`: how the app's renderer is to be run.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Settings {
    #[serde(default)]
    pub kustomize: Option<KustomizeSettings>,
    #[serde(default)]
    pub helm: Option<HelmSettings>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KustomizeSettings {
    /// The directory to build, relative to the app (an overlay such as
    /// `overlays/production`, or `../shop/overlays/staging` for an app that
    /// is one overlay of another's base); default the app directory.
    #[serde(default)]
    pub path: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HelmSettings {
    /// Default: the app's name.
    #[serde(default)]
    pub release_name: Option<String>,
    /// `.Release.Namespace`; default the agent's default namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Values files in the app directory, applied in order on top of the
    /// chart's `values.yaml`.
    #[serde(default)]
    pub values_files: Vec<String>,
}

/// How an app's manifests are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Plain,
    /// Built from this directory (relative to the source path).
    Kustomize {
        build_dir: String,
    },
    Helm(HelmSettings),
}

/// The app directory's kind, from its top-level files and settings; a
/// problem when the settings cannot be read or ask for what is not there.
pub fn detect(tree: &dyn SourceTree, app: &str) -> Result<Kind, Problem> {
    let Some(entries) = tree.list(app) else {
        return Ok(Kind::Plain);
    };
    let settings_path = tree::join(app, SETTINGS_FILE);
    let (settings, text) = match entries.get(SETTINGS_FILE) {
        Some(tree::Entry::File) => read_settings(tree, &settings_path)?,
        _ => (Settings::default(), String::new()),
    };
    let has_kustomization = KUSTOMIZATION_FILES.iter().any(|f| entries.contains_key(*f));
    let has_chart = entries.contains_key("Chart.yaml");
    let problem = |message: String| Problem {
        file: settings_path.clone(),
        line: 1,
        message,
    };
    // Every value that reaches a renderer's command line is checked before
    // any renderer runs: it is data, never a flag or a path outside the app.
    let at = |key: &str, value: &str, message: String| Problem {
        file: settings_path.clone(),
        line: line_of_setting(&text, key, value),
        message,
    };
    match (settings.kustomize, settings.helm) {
        (Some(_), Some(_)) => Err(problem("names both kustomize and helm; an app has one renderer".into())),
        (Some(kustomize), None) => {
            let path = kustomize.path.unwrap_or_default();
            if let Err(why) = check_argument(&path) {
                return Err(at("path", &path, format!("kustomize.path {path:?} {why}")));
            }
            let Some(build_dir) = tree::resolve(app, &path) else {
                return Err(at(
                    "path",
                    &path,
                    format!("kustomize.path {path:?} is outside the repository"),
                ));
            };
            let built = tree.list(&build_dir).unwrap_or_default();
            if !KUSTOMIZATION_FILES
                .iter()
                .any(|f| built.get(*f) == Some(&tree::Entry::File))
            {
                return Err(at(
                    "path",
                    &path,
                    format!("kustomize.path {path:?} is no directory holding a kustomization.yaml"),
                ));
            }
            Ok(Kind::Kustomize { build_dir })
        }
        (None, Some(helm)) if has_chart => {
            check_helm(tree, app, &helm, &at)?;
            Ok(Kind::Helm(helm))
        }
        (None, Some(_)) => Err(problem(format!(
            "names helm settings, but {app}/Chart.yaml does not exist"
        ))),
        (None, None) if has_kustomization => Ok(Kind::Kustomize {
            build_dir: app.to_string(),
        }),
        (None, None) if has_chart => Ok(Kind::Helm(HelmSettings::default())),
        (None, None) => Ok(Kind::Plain),
    }
}

/// Longest Helm release name (Helm's own limit).
const MAX_RELEASE_NAME: usize = 53;

/// Why a value from Git cannot be a renderer's argument, if it cannot:
/// nothing a program could take for a flag, and no control characters.
fn check_argument(value: &str) -> Result<(), &'static str> {
    if value.chars().any(char::is_control) {
        return Err("holds a control character (newline, NUL, ...)");
    }
    if value.starts_with('-') {
        return Err("starts with '-', which a renderer would read as a flag");
    }
    Ok(())
}

/// RFC 1123 label: lower-case letters, digits and '-', starting and ending
/// with a letter or digit.
fn is_dns_label(value: &str, max: usize) -> bool {
    !value.is_empty()
        && value.len() <= max
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-')
}

fn check_helm(
    tree: &dyn SourceTree,
    app: &str,
    helm: &HelmSettings,
    at: &dyn Fn(&str, &str, String) -> Problem,
) -> Result<(), Problem> {
    if let Some(release) = &helm.release_name
        && !is_dns_label(release, MAX_RELEASE_NAME)
    {
        return Err(at(
            "releaseName",
            release,
            format!(
                "helm.releaseName {release:?} is not a release name: lower-case letters, digits and '-', at most {MAX_RELEASE_NAME} characters"
            ),
        ));
    }
    if let Some(namespace) = &helm.namespace
        && !is_dns_label(namespace, 63)
    {
        return Err(at(
            "namespace",
            namespace,
            format!(
                "helm.namespace {namespace:?} is not a namespace name: lower-case letters, digits and '-', at most 63 characters"
            ),
        ));
    }
    for values in &helm.values_files {
        if let Err(why) = check_argument(values) {
            return Err(at("valuesFiles", values, format!("values file {values:?} {why}")));
        }
        let inside = tree::resolve(app, values).filter(|path| tree::is_within(path, app));
        let Some(path) = inside else {
            return Err(at(
                "valuesFiles",
                values,
                format!("values file {values:?} is outside the app directory"),
            ));
        };
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path.as_str()));
        if tree.list(dir).and_then(|entries| entries.get(name).copied()) != Some(tree::Entry::File) {
            return Err(at(
                "valuesFiles",
                values,
                format!("values file {values:?} is not a file in {app}"),
            ));
        }
    }
    Ok(())
}

/// The line of a setting: the first line after `key:` that shows the value
/// (as written, or quoted with escapes), else the key's own line.
fn line_of_setting(text: &str, key: &str, value: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let Some(key_index) = lines
        .iter()
        .position(|l| l.trim_start().starts_with(&format!("{key}:")))
    else {
        return 1;
    };
    let quoted = serde_json::to_string(value).unwrap_or_default();
    let shown =
        |line: &str| (!value.is_empty() && !value.contains('\n') && line.contains(value)) || line.contains(&quoted);
    lines[key_index..]
        .iter()
        .position(|l| shown(l))
        .map_or(key_index + 1, |i| key_index + i + 1)
}

fn read_settings(tree: &dyn SourceTree, path: &str) -> Result<(Settings, String), Problem> {
    let problem = |line: usize, message: String| Problem {
        file: path.to_string(),
        line,
        message,
    };
    let content = tree.read(path).map_err(|e| problem(1, e))?;
    let text = String::from_utf8(content).map_err(|_| problem(1, "file is not UTF-8".into()))?;
    if text.trim().is_empty() {
        return Ok((Settings::default(), text));
    }
    let settings = serde_saphyr::from_str::<Settings>(&text).map_err(|error| {
        let line = error.location().map_or(1, |l| l.line() as usize);
        let message = error.to_string();
        let first = message
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or(&message)
            .trim();
        problem(
            line,
            format!("invalid settings: {}", first.strip_prefix("error: ").unwrap_or(first)),
        )
    })?;
    Ok((settings, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_names_and_arguments_follow_the_rules() {
        assert!(is_dns_label("web-1", MAX_RELEASE_NAME));
        assert!(!is_dns_label(&"a".repeat(54), MAX_RELEASE_NAME));
        assert!(!is_dns_label("-x", MAX_RELEASE_NAME));
        assert!(!is_dns_label("Web", MAX_RELEASE_NAME));
        assert!(!is_dns_label("", MAX_RELEASE_NAME));
        assert!(check_argument("overlays/prod").is_ok());
        assert!(check_argument("--flag=x").is_err());
        assert!(check_argument("a\0b").is_err());
    }
}
