//! Kustomize: the kustomizations an app builds are walked first, so a base
//! outside the source path or a remote one is refused before Kustomize runs,
//! and so the cache key holds every directory the build reads.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::tree::{self, Entry, SourceTree};
use super::{KUSTOMIZATION_FILES, Plan, RenderConfig, Rendered, Renderers, failure_message, line_of, refusal, sandbox};
use crate::manifest::Problem;

/// The annotation Kustomize writes when asked for origins.
const ORIGIN_ANNOTATION: &str = "config.kubernetes.io/origin";
/// Kustomization fields that name other kustomizations or resources.
const REFERENCE_FIELDS: [&str; 6] = [
    "resources",
    "bases",
    "components",
    "generators",
    "transformers",
    "validators",
];

pub(super) fn prepare(
    tree: &dyn SourceTree,
    renderers: &Renderers,
    app: &str,
    build_dir: &str,
) -> Result<Plan, Problem> {
    let kustomization = kustomization_file(tree, build_dir).ok_or_else(|| {
        refusal(
            &tree::join(build_dir, "kustomization.yaml"),
            1,
            format!("app {app}: {build_dir} holds no kustomization.yaml"),
        )
    })?;
    let (program, version) = renderers
        .program("kustomize", renderers.config.kustomize.as_deref())
        .map_err(|m| refusal(&kustomization, 1, format!("app {app} is built with Kustomize, but {m}")))?;
    let config = renderers.config.clone();
    let read = dependencies(tree, build_dir, config.allow_remote)?;
    let mut key = format!(
        "kustomize {version}|remote {}|{build_dir}|{app}={}",
        config.allow_remote,
        tree.id(app).unwrap_or_default()
    );
    let mut dirs = vec![app.to_string()];
    for dir in read.iter().filter(|d| !tree::is_within(d, app)) {
        key.push_str(&format!("|{dir}={}", tree.id(dir).unwrap_or_default()));
        dirs.push(dir.clone());
    }
    let app = app.to_string();
    let build_dir = build_dir.to_string();
    let file = kustomization.clone();
    Ok(Plan {
        key,
        dirs,
        file,
        run: Box::new(move |scratch: &Path| build(scratch, &program, &config, &app, &build_dir, &kustomization)),
    })
}

fn kustomization_file(tree: &dyn SourceTree, dir: &str) -> Option<String> {
    let entries = tree.list(dir)?;
    KUSTOMIZATION_FILES
        .iter()
        .find(|name| entries.get(**name) == Some(&Entry::File))
        .map(|name| tree::join(dir, name))
}

/// A reference Kustomize would fetch over the network.
fn is_remote(reference: &str) -> bool {
    reference.contains("://")
        || reference.starts_with("git@")
        || reference.starts_with("git::")
        || reference.contains("?ref=")
        || ["github.com/", "gitlab.com/", "bitbucket.org/"]
            .iter()
            .any(|host| reference.starts_with(host))
}

/// Every kustomization directory the build of `build_dir` reads, itself
/// included; a problem for a reference outside the source path, or a remote
/// one when they are not allowed.
pub(super) fn dependencies(
    tree: &dyn SourceTree,
    build_dir: &str,
    allow_remote: bool,
) -> Result<BTreeSet<String>, Problem> {
    let mut seen = BTreeSet::new();
    let mut pending = vec![build_dir.to_string()];
    while let Some(dir) = pending.pop() {
        if !seen.insert(dir.clone()) {
            continue;
        }
        let Some(file) = kustomization_file(tree, &dir) else {
            continue; // Kustomize names the missing kustomization itself.
        };
        let content = tree.read(&file).map_err(|e| refusal(&file, 1, e))?;
        let text = String::from_utf8_lossy(&content).to_string();
        let kustomization: Value = serde_saphyr::from_str(&text).map_err(|e| {
            let line = e.location().map_or(1, |l| l.line() as usize);
            refusal(
                &file,
                line,
                format!("invalid YAML: {}", e.to_string().lines().next().unwrap_or_default()),
            )
        })?;
        for field in REFERENCE_FIELDS {
            let Some(references) = kustomization[field].as_array() else {
                continue;
            };
            for reference in references.iter().filter_map(Value::as_str) {
                let line = line_of(&text, reference);
                if is_remote(reference) {
                    if allow_remote {
                        continue;
                    }
                    return Err(refusal(
                        &file,
                        line,
                        format!(
                            "{field} entry {reference:?} is remote; remote bases and resources are off (--render-allow-remote turns them on)"
                        ),
                    ));
                }
                let Some(target) = tree::resolve(&dir, reference) else {
                    return Err(refusal(
                        &file,
                        line,
                        format!(
                            "{field} entry {reference:?} is outside the repository; a kustomization may only read files of the source path"
                        ),
                    ));
                };
                if tree.list(&target).is_some() {
                    pending.push(target);
                }
            }
        }
    }
    Ok(seen)
}

fn build(
    scratch: &Path,
    program: &PathBuf,
    config: &RenderConfig,
    app: &str,
    build_dir: &str,
    kustomization: &str,
) -> Rendered {
    let failed = |line: usize, message: String| Rendered {
        manifests: Vec::new(),
        problems: vec![refusal(kustomization, line, message)],
    };
    let asked_for_origins = match ask_for_origins(&scratch.join(kustomization)) {
        Ok(added) => added,
        Err(message) => return failed(1, message),
    };
    let mut command = std::process::Command::new(program);
    command
        .arg("build")
        .arg(scratch.join(build_dir))
        .args(["--load-restrictor", "LoadRestrictionsRootOnly"]);
    sandbox(&mut command, scratch, config.allow_remote);
    let output = match super::process::run(command, config.timeout, config.max_output) {
        Ok(output) => output,
        Err(failure) => {
            return failed(
                1,
                format!("app {app}: {}", failure_message("kustomize", failure, scratch)),
            );
        }
    };
    super::parse_output(app, &output, kustomization, |_, object| {
        source_of(object, build_dir, kustomization, asked_for_origins)
    })
}

/// Adds `buildMetadata: [originAnnotations]` to the copied kustomization
/// (never the user's file); true when it was not there already, so the
/// annotations are gitcanary's to remove.
fn ask_for_origins(path: &Path) -> Result<bool, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading the kustomization: {e}"))?;
    let mut kustomization: Value = serde_saphyr::from_str(&text)
        .map_err(|e| format!("invalid YAML: {}", e.to_string().lines().next().unwrap_or_default()))?;
    let Some(map) = kustomization.as_object_mut() else {
        return Err("the kustomization is not a mapping".into());
    };
    let metadata = map.entry("buildMetadata").or_insert_with(|| Value::Array(Vec::new()));
    let Some(list) = metadata.as_array_mut() else {
        return Err("buildMetadata is not a list".into());
    };
    if list.iter().any(|v| v == "originAnnotations") {
        return Ok(false);
    }
    list.push(Value::from("originAnnotations"));
    // JSON is YAML, and Kustomize reads it as such.
    std::fs::write(path, kustomization.to_string()).map_err(|e| format!("writing the kustomization: {e}"))?;
    Ok(true)
}

/// The file an object came from: its resource file, or the kustomization
/// that generated it.
fn source_of(object: &mut Value, build_dir: &str, kustomization: &str, remove_origin: bool) -> String {
    let annotations = &mut object["metadata"]["annotations"];
    let origin: Value = annotations[ORIGIN_ANNOTATION]
        .as_str()
        .and_then(|text| serde_saphyr::from_str(text).ok())
        .unwrap_or_default();
    if remove_origin && let Some(map) = annotations.as_object_mut() {
        map.remove(ORIGIN_ANNOTATION);
        if map.is_empty()
            && let Some(metadata) = object["metadata"].as_object_mut()
        {
            metadata.remove("annotations");
        }
    }
    if origin["repo"].is_string() {
        return kustomization.to_string();
    }
    origin["path"]
        .as_str()
        .or(origin["configuredIn"].as_str())
        .and_then(|relative| tree::resolve(build_dir, relative))
        .unwrap_or_else(|| kustomization.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::tree::tree_of;

    #[test]
    fn an_overlay_reads_its_bases_and_nothing_outside_the_source() {
        let (_dir, tree) = tree_of(&[
            (
                "web/overlays/prod/kustomization.yaml",
                "resources: [../../base, svc.yaml]\n",
            ),
            (
                "web/base/kustomization.yaml",
                "resources: [deploy.yaml, ../../shared]\n",
            ),
            ("shared/kustomization.yaml", "resources: []\n"),
        ]);
        let read = dependencies(&tree, "web/overlays/prod", false).expect("allowed");
        assert_eq!(
            read.into_iter().collect::<Vec<_>>(),
            ["shared", "web/base", "web/overlays/prod"]
        );

        let (_dir, tree) = tree_of(&[("web/kustomization.yaml", "resources:\n- ../../outside\n")]);
        let problem = dependencies(&tree, "web", false).expect_err("refused");
        assert_eq!((problem.file.as_str(), problem.line), ("web/kustomization.yaml", 2));
        assert!(problem.message.contains("outside the repository"), "{problem}");
    }

    #[test]
    fn a_remote_base_is_refused_unless_allowed() {
        let (_dir, tree) = tree_of(&[(
            "web/kustomization.yaml",
            "resources:\n- deploy.yaml\n- https://github.com/acme/base//web?ref=v1\n",
        )]);
        let problem = dependencies(&tree, "web", false).expect_err("refused");
        assert_eq!(problem.line, 3);
        assert!(problem.message.contains("--render-allow-remote"), "{problem}");
        assert!(dependencies(&tree, "web", true).is_ok());
    }

    #[test]
    fn origins_name_the_resource_file_or_the_generating_kustomization() {
        let mut object = serde_json::json!({"metadata": {"name": "a", "annotations": {ORIGIN_ANNOTATION: "path: ../../base/deploy.yaml\n"}}});
        let file = source_of(
            &mut object,
            "web/overlays/prod",
            "web/overlays/prod/kustomization.yaml",
            true,
        );
        assert_eq!(file, "web/base/deploy.yaml");
        assert!(object["metadata"].get("annotations").is_none(), "{object}");

        let mut object = serde_json::json!({"metadata": {"annotations": {"keep": "1", ORIGIN_ANNOTATION: "configuredIn: ../../base/kustomization.yaml\nconfiguredBy:\n  kind: ConfigMapGenerator\n"}}});
        let file = source_of(
            &mut object,
            "web/overlays/prod",
            "web/overlays/prod/kustomization.yaml",
            true,
        );
        assert_eq!(file, "web/base/kustomization.yaml");
        assert_eq!(object["metadata"]["annotations"], serde_json::json!({"keep": "1"}));
    }
}
