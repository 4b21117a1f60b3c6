//! Helm: `helm template` offline, on the chart and its vendored
//! dependencies, for the cluster's version and API versions.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::tree::{self, Entry, SourceTree};
use super::{
    Capabilities, HelmSettings, Plan, RenderConfig, Rendered, Renderers, failure_message, line_of, refusal, sandbox,
};
use crate::manifest::Problem;

pub(super) fn prepare(
    tree: &dyn SourceTree,
    renderers: &Renderers,
    app: &str,
    settings: &HelmSettings,
) -> Result<Plan, Problem> {
    let chart_file = tree::join(app, "Chart.yaml");
    let (program, version) = renderers
        .program("helm", renderers.config.helm.as_deref())
        .map_err(|m| refusal(&chart_file, 1, format!("app {app} is a Helm chart, but {m}")))?;
    check_dependencies(tree, app, &chart_file)?;
    // The settings were checked by `detect`: a valid release name and
    // namespace, values files inside the app.
    let capabilities = renderers.capabilities();
    let config = renderers.config.clone();
    let release = settings.release_name.clone().unwrap_or_else(|| app.to_string());
    let namespace = settings
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let key = format!(
        "helm {version}|{release}|{namespace}|{:?}|{:x}|{app}={}",
        settings.values_files,
        fingerprint(&capabilities),
        tree.id(app).unwrap_or_default()
    );
    let values = settings.values_files.clone();
    let app = app.to_string();
    Ok(Plan {
        key,
        dirs: vec![app.clone()],
        file: chart_file,
        run: Box::new(move |scratch: &Path| {
            let invocation = Invocation {
                program,
                config,
                capabilities,
                release,
                namespace,
                values,
            };
            template(scratch, &invocation, &app)
        }),
    })
}

fn fingerprint(capabilities: &Option<std::sync::Arc<Capabilities>>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    capabilities.hash(&mut hasher);
    hasher.finish()
}

/// Each `dependencies` entry of Chart.yaml must be vendored in `charts/`,
/// as a directory or an archive: Helm renders offline.
fn check_dependencies(tree: &dyn SourceTree, app: &str, chart_file: &str) -> Result<(), Problem> {
    let content = tree.read(chart_file).map_err(|e| refusal(chart_file, 1, e))?;
    let text = String::from_utf8_lossy(&content).to_string();
    let chart: Value = serde_saphyr::from_str(&text).map_err(|e| {
        let line = e.location().map_or(1, |l| l.line() as usize);
        refusal(
            chart_file,
            line,
            format!("invalid YAML: {}", e.to_string().lines().next().unwrap_or_default()),
        )
    })?;
    let vendored = tree.list(&tree::join(app, "charts")).unwrap_or_default();
    for dependency in chart["dependencies"].as_array().into_iter().flatten() {
        let Some(name) = dependency["name"].as_str() else {
            continue;
        };
        let present = vendored.iter().any(|(entry, kind)| match kind {
            Entry::Dir => entry == name,
            Entry::File => entry
                .strip_prefix(&format!("{name}-"))
                .is_some_and(|rest| rest.ends_with(".tgz")),
        });
        if !present {
            return Err(refusal(
                chart_file,
                line_of(&text, &format!("name: {name}")),
                format!(
                    "dependency {name:?} is not vendored in {app}/charts/; gitcanary renders offline, so run `helm dependency build` and commit charts/"
                ),
            ));
        }
    }
    Ok(())
}

struct Invocation {
    program: PathBuf,
    config: RenderConfig,
    capabilities: Option<std::sync::Arc<Capabilities>>,
    release: String,
    namespace: String,
    values: Vec<String>,
}

fn template(scratch: &Path, invocation: &Invocation, app: &str) -> Rendered {
    let chart_file = tree::join(app, "Chart.yaml");
    let chart_dir = scratch.join(app);
    let mut command = std::process::Command::new(&invocation.program);
    // Flags take their value after `=`, and the release and chart come
    // after `--`: nothing from Git is read as a flag.
    command
        .arg("template")
        .arg(format!("--namespace={}", invocation.namespace))
        .arg("--skip-tests");
    for values in &invocation.values {
        let mut flag = std::ffi::OsString::from("--values=");
        flag.push(chart_dir.join(values));
        command.arg(flag);
    }
    if let Some(capabilities) = &invocation.capabilities {
        if !capabilities.kube_version.is_empty() {
            command.arg(format!("--kube-version={}", capabilities.kube_version));
        }
        if !capabilities.api_versions.is_empty() {
            command.arg(format!("--api-versions={}", capabilities.api_versions.join(",")));
        }
    }
    command.arg("--").arg(&invocation.release).arg(&chart_dir);
    sandbox(&mut command, scratch, false);
    let output = match super::process::run(command, invocation.config.timeout, invocation.config.max_output) {
        Ok(output) => output,
        Err(failure) => {
            let message = failure_message("helm", failure, scratch);
            let (file, line) = blamed_template(&message, app).unwrap_or((chart_file.clone(), 1));
            return Rendered {
                manifests: Vec::new(),
                problems: vec![refusal(&file, line, format!("app {app}: {message}"))],
            };
        }
    };
    super::parse_output(app, &output, &chart_file, |text, _| {
        source_of(text, app).unwrap_or_else(|| chart_file.clone())
    })
}

/// `# Source: CHART/templates/x.yaml` -> `APP/templates/x.yaml`.
fn source_of(document: &str, app: &str) -> Option<String> {
    let source = document.lines().find_map(|l| l.trim().strip_prefix("# Source: "))?;
    let (_chart, rest) = source.trim().split_once('/')?;
    Some(tree::join(app, rest))
}

/// The template file and line Helm's error names (`CHART/templates/x.yaml:7:3`).
fn blamed_template(message: &str, app: &str) -> Option<(String, usize)> {
    let start = message.find("/templates/")?;
    // Past the separator's own bytes: a separating space may be multibyte.
    let begin = message[..start]
        .char_indices()
        .rfind(|(_, c)| c.is_whitespace() || *c == '(' || *c == '"')
        .map_or(0, |(i, c)| i + c.len_utf8());
    let token = &message[begin..];
    let end = token
        .find(|c: char| c == ':' || c == ')' || c == '"' || c.is_whitespace())
        .unwrap_or(token.len());
    let path = &token[..end];
    let (_chart, rest) = path.split_once('/')?;
    let line = token[end..]
        .strip_prefix(':')
        .and_then(|after| after.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|digits| digits.parse().ok())
        .unwrap_or(1);
    Some((tree::join(app, rest), line))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_helm_error_names_the_template_and_line() {
        let message = "helm: template: web/templates/deployment.yaml:7:20: executing \"web/templates/deployment.yaml\" at <.Values.x.y>: nil pointer";
        assert_eq!(
            blamed_template(message, "shop"),
            Some(("shop/templates/deployment.yaml".to_string(), 7))
        );
        let parse = "helm: parse error at (web/templates/broken.yaml:3): unexpected \"}\"";
        assert_eq!(
            blamed_template(parse, "shop"),
            Some(("shop/templates/broken.yaml".to_string(), 3))
        );
        assert_eq!(blamed_template("helm: Chart.yaml file is missing", "shop"), None);
    }

    #[test]
    fn a_helm_error_with_multibyte_text_is_read_without_panicking() {
        // U+3000 is whitespace of three bytes: slicing one byte past it panicked.
        let message = "helm: 失敗\u{3000}web/templates/é.yaml:4:1: «nil»";
        assert_eq!(
            blamed_template(message, "shop"),
            Some(("shop/templates/é.yaml".to_string(), 4))
        );
        let long = format!("Error: {}", "é".repeat(400));
        assert!(super::super::error_line(&long, Path::new("/tmp/x")).len() <= 500);
    }

    #[test]
    fn the_source_comment_names_the_template_in_the_app() {
        let document = "# Source: web/charts/redis/templates/svc.yaml\napiVersion: v1\n";
        assert_eq!(
            source_of(document, "shop").as_deref(),
            Some("shop/charts/redis/templates/svc.yaml")
        );
    }
}
