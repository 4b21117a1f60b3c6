//! Rendered sources: an app directory holding a kustomization is built with
//! Kustomize, one holding `Chart.yaml` with `helm template`; anything else is
//! plain YAML. Renders run on a copy of the app's files (regular files only),
//! with a deadline and an output cap, and are cached by the Git tree ids they
//! read, so a sync where nothing changed renders nothing.

mod capabilities;
mod helm;
mod kustomize;
pub mod process;
pub(crate) mod settings;
pub mod tree;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::manifest::{App, Manifest, Problem};
pub use capabilities::{Capabilities, SUPPORTED_KUBE_VERSION};
pub use settings::{HelmSettings, KUSTOMIZATION_FILES, Kind, KustomizeSettings, Settings, detect};
pub use tree::{DirTree, GitTree, SourceTree};

pub use crate::manifest::SETTINGS_FILE;
/// How renderers are found and bounded.
#[derive(Debug, Clone)]
pub struct RenderConfig {
    /// The kustomize program; default `kustomize` on PATH.
    pub kustomize: Option<PathBuf>,
    /// The helm program; default `helm` on PATH.
    pub helm: Option<PathBuf>,
    /// Let Kustomize fetch remote bases and resources.
    pub allow_remote: bool,
    pub timeout: Duration,
    /// Largest output of one render, in bytes.
    pub max_output: u64,
    /// Renders run at once.
    pub parallel: usize,
    /// `.Release.Namespace` when the settings name none.
    pub default_namespace: String,
}

impl Default for RenderConfig {
    fn default() -> Self {
        RenderConfig {
            kustomize: None,
            helm: None,
            allow_remote: false,
            timeout: Duration::from_secs(60),
            max_output: 32 * 1024 * 1024,
            parallel: 4,
            default_namespace: crate::manifest::DEFAULT_NAMESPACE.to_string(),
        }
    }
}

/// The manifests and problems of one render.
#[derive(Debug, Clone, Default)]
pub struct Rendered {
    pub manifests: Vec<Manifest>,
    pub problems: Vec<Problem>,
}

/// Renderers, their versions, the cluster's capabilities and the cache of
/// renders; one per source.
#[derive(Debug, Default)]
pub struct Renderers {
    pub config: RenderConfig,
    /// Where clean renders are kept between runs (`sync --once`, a
    /// restarted agent); none: in memory only.
    pub disk: Option<PathBuf>,
    capabilities: RwLock<Option<Arc<Capabilities>>>,
    versions: Mutex<HashMap<PathBuf, String>>,
    cache: Mutex<HashMap<String, Arc<[Manifest]>>>,
    /// Renders that failed or timed out, by key: not run again until their
    /// inputs change, so one broken app cannot spend every sync's time.
    failures: Mutex<HashMap<String, Vec<Problem>>>,
    renders: AtomicU64,
    /// Renders running now, shared with the agent's metrics.
    running: Arc<AtomicU64>,
}

impl Renderers {
    pub fn new(config: RenderConfig) -> Renderers {
        Renderers {
            config,
            ..Renderers::default()
        }
    }

    /// Sets what Helm renders for; renders made for other capabilities are
    /// not reused.
    pub fn set_capabilities(&self, capabilities: impl Into<Arc<Capabilities>>) {
        *self.capabilities.write().unwrap_or_else(|e| e.into_inner()) = Some(capabilities.into());
    }

    /// A clean render of `key`, from memory or disk.
    fn cached(&self, key: &str) -> Option<Vec<Manifest>> {
        if let Some(hit) = self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(key) {
            return Some(hit.to_vec());
        }
        let text = std::fs::read(self.disk.as_ref()?.join(disk_name(key))).ok()?;
        let manifests: Vec<Manifest> = serde_json::from_slice(&text).ok()?;
        let shared: Arc<[Manifest]> = manifests.clone().into();
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string(), shared);
        Some(manifests)
    }

    fn keep(&self, key: &str, manifests: &[Manifest]) {
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string(), manifests.into());
        let Some(disk) = &self.disk else { return };
        // A rendered Secret is in clear in the output: such a render stays in
        // memory only, and is rendered again by the next process.
        if manifests.iter().any(|m| m.kind() == "Secret") {
            return;
        }
        // Written aside and renamed: a reader never sees half a file.
        let written = std::fs::create_dir_all(disk).and_then(|()| {
            let file = disk.join(disk_name(key));
            let partial = file.with_extension(format!("partial-{}", std::process::id()));
            std::fs::write(&partial, serde_json::to_vec(manifests).unwrap_or_default())?;
            std::fs::rename(&partial, &file)
        });
        if let Err(error) = written {
            tracing::warn!(%error, dir = %disk.display(), "a render could not be kept on disk");
        }
    }

    /// Drops the renders no app of the last revision used.
    fn forget_all_but(&self, used: &HashSet<String>) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|key, _| used.contains(key));
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|key, _| used.contains(key));
        let Some(entries) = self.disk.as_ref().and_then(|d| std::fs::read_dir(d).ok()) else {
            return;
        };
        let keep: HashSet<String> = used.iter().map(|k| disk_name(k)).collect();
        for entry in entries.flatten() {
            if !keep.contains(entry.file_name().to_string_lossy().as_ref()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// Renders run so far (cache hits are not renders).
    pub fn renders(&self) -> u64 {
        self.renders.load(Ordering::Relaxed)
    }

    /// The count of renders running now, for a gauge.
    pub fn running(&self) -> Arc<AtomicU64> {
        self.running.clone()
    }

    fn capabilities(&self) -> Option<Arc<Capabilities>> {
        self.capabilities.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The program and its version, or a message for the app that needs it.
    fn program(&self, name: &str, configured: Option<&Path>) -> Result<(PathBuf, String), String> {
        let hint = format!(
            "give --{name} PATH or put {name} on PATH; scripts/renderers.sh builds the pinned version into ~/.cache/gitcanary"
        );
        let path = match configured {
            Some(path) => path.to_path_buf(),
            None => find_on_path(name).ok_or_else(|| format!("the {name} program is not installed ({hint})"))?,
        };
        let mut versions = self.versions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(version) = versions.get(&path) {
            return Ok((path, version.clone()));
        }
        let mut command = std::process::Command::new(&path);
        command.args(if name == "helm" {
            &["version", "--short"][..]
        } else {
            &["version"][..]
        });
        let version = process::run(command, self.config.timeout, 4096)
            .map(|out| String::from_utf8_lossy(&out).trim().to_string())
            .map_err(|e| format!("{} cannot be run ({e:?}; {hint})", path.display()))?;
        versions.insert(path.clone(), version.clone());
        Ok((path, version))
    }
}

/// The file of a render on disk: the hash of its key.
fn disk_name(key: &str) -> String {
    use sha2::Digest;
    format!("{}.json", hex::encode(sha2::Sha256::digest(key.as_bytes())))
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// One app to render: its name, and how.
#[derive(Debug, Clone)]
pub struct Job {
    pub app: String,
    pub kind: Kind,
}

/// What a render reads and how it runs, before its files are copied.
struct Plan {
    /// The render's cache key: the renderer, its settings, and the ids of
    /// every directory it reads.
    key: String,
    /// Directories to copy to the scratch directory.
    dirs: Vec<String>,
    /// The render, on the scratch directory.
    run: Box<dyn FnOnce(&Path) -> Rendered + Send>,
    /// Where a failure to copy is reported.
    file: String,
}

/// A render ready to run on its copied files.
struct Prepared {
    app: String,
    key: String,
    /// Where a render that panicked is reported.
    file: String,
    scratch: tempfile::TempDir,
    run: Box<dyn FnOnce(&Path) -> Rendered + Send>,
}

/// Largest sum of the files one render reads.
const MAX_RENDER_INPUT_BYTES: u64 = crate::manifest::MAX_REVISION_BYTES;

/// Renders the apps (from the cache where their files did not change),
/// several at once, and returns each as an app of manifests and problems.
pub fn render_apps(tree: &dyn SourceTree, renderers: &Renderers, jobs: Vec<Job>) -> Vec<App> {
    let mut done: BTreeMap<String, Rendered> = BTreeMap::new();
    let mut used = HashSet::new();
    let mut pending = Vec::new();
    let failed = |problem| Rendered {
        manifests: Vec::new(),
        problems: vec![problem],
    };
    for job in jobs {
        let prepared = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| prepare(tree, renderers, &job)));
        let prepared = prepared.unwrap_or_else(|_| {
            Err(refusal(
                &job.app,
                1,
                format!("app {}: internal error while rendering", job.app),
            ))
        });
        let plan = match prepared {
            Ok(plan) => plan,
            Err(problem) => {
                done.insert(job.app, failed(problem));
                continue;
            }
        };
        used.insert(plan.key.clone());
        if let Some(manifests) = renderers.cached(&plan.key) {
            done.insert(
                job.app,
                Rendered {
                    manifests,
                    problems: Vec::new(),
                },
            );
            continue;
        }
        let remembered = renderers
            .failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&plan.key)
            .cloned();
        if let Some(problems) = remembered {
            done.insert(
                job.app,
                Rendered {
                    manifests: Vec::new(),
                    problems,
                },
            );
            continue;
        }
        let copied = scratch().and_then(|dir| {
            tree::export(tree, &plan.dirs, dir.path(), MAX_RENDER_INPUT_BYTES)?;
            Ok(dir)
        });
        match copied {
            Ok(scratch) => pending.push(Prepared {
                app: job.app,
                key: plan.key,
                file: plan.file,
                scratch,
                run: plan.run,
            }),
            Err(message) => {
                done.insert(
                    job.app,
                    failed(refusal(&plan.file, 1, format!("cannot render: {message}"))),
                );
            }
        }
    }
    let running = Running::start(&renderers.running, pending.len() as u64);
    let results = run_parallel(pending, renderers.config.parallel);
    drop(running);
    for (prepared, rendered) in results {
        renderers.renders.fetch_add(1, Ordering::Relaxed);
        // A failure (a timeout too) is remembered in memory only, so a
        // restarted agent tries again.
        if rendered.problems.is_empty() {
            renderers.keep(&prepared.key, &rendered.manifests);
        } else {
            renderers
                .failures
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(prepared.key.clone(), rendered.problems.clone());
        }
        done.insert(prepared.app, rendered);
    }
    renderers.forget_all_but(&used);
    done.into_iter()
        .map(|(name, rendered)| App {
            name,
            manifests: rendered.manifests.into(),
            problems: rendered.problems,
            ..App::default()
        })
        .collect()
}

/// Renders counted as running until dropped, however the run ends.
struct Running<'a> {
    count: &'a AtomicU64,
    renders: u64,
}

impl<'a> Running<'a> {
    fn start(count: &'a AtomicU64, renders: u64) -> Running<'a> {
        count.fetch_add(renders, Ordering::Relaxed);
        Running { count, renders }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(self.renders, Ordering::Relaxed);
    }
}

fn prepare(tree: &dyn SourceTree, renderers: &Renderers, job: &Job) -> Result<Plan, Problem> {
    match &job.kind {
        Kind::Plain => Err(refusal(&job.app, 1, "a plain app is parsed, not rendered")),
        Kind::Kustomize { build_dir } => kustomize::prepare(tree, renderers, &job.app, build_dir),
        Kind::Helm(settings) => helm::prepare(tree, renderers, &job.app, settings),
    }
}

fn run_parallel(jobs: Vec<Prepared>, parallel: usize) -> Vec<(Prepared, Rendered)> {
    let jobs: Vec<Mutex<Option<Prepared>>> = jobs.into_iter().map(|j| Mutex::new(Some(j))).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..parallel.max(1).min(jobs.len()) {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(slot) = jobs.get(index) else { break };
                    let Some(mut job) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() else {
                        continue;
                    };
                    let run = std::mem::replace(&mut job.run, Box::new(|_| Rendered::default()));
                    let rendered = run_caught(&job.app, &job.file, run, job.scratch.path());
                    results.lock().unwrap_or_else(|e| e.into_inner()).push((job, rendered));
                }
            });
        }
    });
    results.into_inner().unwrap_or_else(|e| e.into_inner())
}

/// Runs one render; a panic in it is a problem of its app, not of every app.
fn run_caught(app: &str, file: &str, run: Box<dyn FnOnce(&Path) -> Rendered + Send>, scratch: &Path) -> Rendered {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(scratch))) {
        Ok(rendered) => rendered,
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            Rendered {
                manifests: Vec::new(),
                problems: vec![refusal(
                    file,
                    1,
                    format!("app {app}: internal error while rendering: {why}"),
                )],
            }
        }
    }
}

/// A fresh scratch directory for one render.
fn scratch() -> Result<tempfile::TempDir, String> {
    tempfile::Builder::new()
        .prefix("gitcanary-render-")
        .tempdir()
        .map_err(|e| format!("cannot make a scratch directory: {e}"))
}

/// The 1-based line of the first line of `text` holding `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).map_or(1, |i| i + 1)
}

/// The renderer's first error line, with the scratch directory's paths
/// turned back into the repository's.
fn error_line(stderr: &str, scratch: &Path) -> String {
    let scratch = format!("{}/", scratch.display());
    let line = stderr
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("Error:"))
        .or_else(|| stderr.lines().map(str::trim).find(|l| !l.is_empty()))
        .unwrap_or("failed without a message");
    let line = line.strip_prefix("Error: ").unwrap_or(line).replace(&scratch, "");
    let mut end = line.len().min(500);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line[..end].to_string()
}

/// What a render that did not finish says.
fn failure_message(program: &str, failure: process::Failure, scratch: &Path) -> String {
    match failure {
        process::Failure::Spawn(e) => format!("{program} could not be started: {e}"),
        process::Failure::TimedOut(after) => {
            format!(
                "{program} was still rendering after {} s and was stopped; nothing of the app is applied",
                after.as_secs()
            )
        }
        process::Failure::TooLarge(cap) => {
            format!("{program} printed more than the {cap}-byte cap and was stopped; nothing of the app is applied")
        }
        process::Failure::Exited(stderr) => format!("{program}: {}", error_line(&stderr, scratch)),
    }
}

/// Environment of a renderer: nothing of the agent's own (tokens, HOME),
/// and with the network closed unless remote sources are allowed.
fn sandbox(command: &mut std::process::Command, scratch: &Path, allow_remote: bool) {
    command.env_clear();
    command.env("HOME", scratch.join(".home"));
    command.env("HELM_CACHE_HOME", scratch.join(".home/cache"));
    command.env("HELM_CONFIG_HOME", scratch.join(".home/config"));
    command.env("HELM_DATA_HOME", scratch.join(".home/data"));
    command.env("HELM_PLUGINS", scratch.join(".home/plugins"));
    if allow_remote {
        if let Some(path) = std::env::var_os("PATH") {
            command.env("PATH", path);
        }
    } else {
        for proxy in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"] {
            command.env(proxy, "http://127.0.0.1:9");
        }
        command.env("GIT_ALLOW_PROTOCOL", "none");
    }
    command.current_dir(scratch);
}

/// Splits rendered YAML into manifests of `app`; `source_of` names each
/// object's file from the document's text and object.
fn parse_output(
    app: &str,
    output: &[u8],
    fallback_file: &str,
    mut source_of: impl FnMut(&str, &mut serde_json::Value) -> String,
) -> Rendered {
    let mut rendered = Rendered::default();
    let Ok(text) = std::str::from_utf8(output) else {
        rendered.problems.push(Problem {
            file: fallback_file.to_string(),
            line: 1,
            message: "the renderer's output is not UTF-8".into(),
        });
        return rendered;
    };
    for document in crate::manifest::parse::split_documents(text) {
        match serde_saphyr::from_str::<serde_json::Value>(document.text) {
            Ok(serde_json::Value::Null) => {}
            Ok(mut object) => {
                let file = source_of(document.text, &mut object);
                rendered.manifests.push(Manifest {
                    app: app.to_string(),
                    file,
                    line: 1,
                    object,
                });
            }
            Err(error) => rendered.problems.push(Problem {
                file: fallback_file.to_string(),
                line: 1,
                message: format!(
                    "the renderer printed invalid YAML: {}",
                    error.to_string().lines().next().unwrap_or_default()
                ),
            }),
        }
    }
    rendered
}

/// The problem of an app that cannot be rendered, at `file`.
fn refusal(file: &str, line: usize, message: impl Into<String>) -> Problem {
    Problem {
        file: file.to_string(),
        line,
        message: message.into(),
    }
}

/// Which apps of a source are rendered: their directories are not read as
/// manifests; [`Rendering::finish`] renders them into the set.
#[derive(Debug, Default)]
pub struct Rendering {
    /// App directories that are not plain YAML.
    pub skip: HashSet<String>,
    jobs: Vec<Job>,
    /// Apps whose settings could not be read.
    broken: Vec<App>,
}

impl Rendering {
    pub fn plan(tree: &dyn SourceTree) -> Rendering {
        Rendering::plan_except(tree, |_| false)
    }

    /// [`Rendering::plan`], where the apps `known_plain` names are plain
    /// without a look (a load takes them over: their directory is the same).
    pub fn plan_except(tree: &dyn SourceTree, known_plain: impl Fn(&str) -> bool) -> Rendering {
        let mut rendering = Rendering::default();
        let apps = tree.list("").unwrap_or_default();
        let apps = apps
            .into_iter()
            .filter(|(app, kind)| *kind == tree::Entry::Dir && !known_plain(app));
        for (app, _) in apps {
            let detected = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| detect(tree, &app)));
            let detected = detected.unwrap_or_else(|_| {
                Err(refusal(
                    &tree::join(&app, SETTINGS_FILE),
                    1,
                    format!("app {app}: internal error while reading its settings"),
                ))
            });
            match detected {
                Ok(Kind::Plain) => {}
                Ok(kind) => {
                    rendering.skip.insert(app.clone());
                    rendering.jobs.push(Job { app, kind });
                }
                Err(problem) => {
                    rendering.skip.insert(app.clone());
                    rendering.broken.push(App {
                        name: app,
                        problems: vec![problem],
                        ..App::default()
                    });
                }
            }
        }
        rendering
    }

    pub fn finish(self, tree: &dyn SourceTree, renderers: &Renderers, set: &mut crate::manifest::ManifestSet) {
        for app in self.broken.into_iter().chain(render_apps(tree, renderers, self.jobs)) {
            set.apps.insert(app.name.clone(), app);
        }
    }
}

/// Loads a local directory: its plain apps' YAML files, and its Kustomize
/// and Helm apps rendered.
pub fn load_dir(root: &Path, renderers: &Renderers) -> crate::Result<crate::manifest::ManifestSet> {
    let tree = DirTree {
        root: root.to_path_buf(),
    };
    let rendering = Rendering::plan(&tree);
    let mut set = crate::manifest::load_dir(root, &rendering.skip)?;
    rendering.finish(&tree, renderers, &mut set);
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::tree::tree_of;

    #[test]
    fn offline_charts_render_for_the_control_plane_gitcanary_is_tested_on() {
        let versions = include_str!("../../tests/testenv/versions.env");
        assert!(
            versions
                .lines()
                .any(|l| l == format!("KUBE_VERSION={SUPPORTED_KUBE_VERSION}")),
            "SUPPORTED_KUBE_VERSION follows tests/testenv/versions.env"
        );
        let offline = Capabilities::offline(None, &["example.com/v1/Widget".into()]).expect("valid");
        assert_eq!(offline.kube_version, SUPPORTED_KUBE_VERSION);
        assert!(
            offline
                .api_versions
                .contains(&"gitcanary.io/v1alpha1/Rollout".to_string())
        );
        assert!(offline.api_versions.contains(&"example.com/v1/Widget".to_string()));
        for version in ["v1.30", "1.30.2", "v1.31.0-rc.1"] {
            assert!(Capabilities::offline(Some(version), &[]).is_ok(), "{version}");
        }
        for version in ["", "v1", "latest", "v1.30.0 --post-renderer=x", "v1..2"] {
            assert!(Capabilities::offline(Some(version), &[]).is_err(), "{version:?}");
        }
        for api in ["", "a//b", "apps/v1,extra", "x/y/z/w", "apps/v1 --set=a"] {
            assert!(Capabilities::offline(None, &[api.into()]).is_err(), "{api:?}");
        }
    }

    #[test]
    fn app_kinds_come_from_the_directory_and_its_settings() {
        let (_dir, tree) = tree_of(&[
            ("plain/cm.yaml", "a: 1"),
            ("kust/kustomization.yaml", "resources: []"),
            ("chart/Chart.yaml", "name: c"),
            ("overlaid/gitcanary.yaml", "kustomize:\n  path: overlays/prod\n"),
            ("overlaid/overlays/prod/kustomization.yaml", "resources: []"),
            ("wrong/gitcanary.yaml", "helm:\n  releaseName: x\n"),
            ("typo/gitcanary.yaml", "helm:\n  valueFiles: [a.yaml]\n"),
        ]);
        assert_eq!(detect(&tree, "plain"), Ok(Kind::Plain));
        assert_eq!(
            detect(&tree, "kust"),
            Ok(Kind::Kustomize {
                build_dir: "kust".into()
            })
        );
        assert_eq!(detect(&tree, "chart"), Ok(Kind::Helm(HelmSettings::default())));
        assert_eq!(
            detect(&tree, "overlaid"),
            Ok(Kind::Kustomize {
                build_dir: "overlaid/overlays/prod".into()
            })
        );
        let wrong = detect(&tree, "wrong").expect_err("no chart");
        assert!(wrong.message.contains("wrong/Chart.yaml does not exist"), "{wrong}");
        let typo = detect(&tree, "typo").expect_err("unknown field");
        assert_eq!((typo.file.as_str(), typo.line), ("typo/gitcanary.yaml", 2));
        assert!(typo.message.contains("valueFiles"), "{typo}");
    }

    #[test]
    fn a_missing_renderer_is_one_clear_problem_of_the_app() {
        let (_dir, tree) = tree_of(&[
            ("shop/kustomization.yaml", "resources: [cm.yaml]"),
            ("shop/cm.yaml", "a: 1"),
        ]);
        let renderers = Renderers::new(RenderConfig {
            kustomize: Some("/nonexistent/kustomize".into()),
            ..RenderConfig::default()
        });
        let mut set = crate::manifest::ManifestSet::default();
        Rendering::plan(&tree).finish(&tree, &renderers, &mut set);
        let app = &set.apps["shop"];
        assert!(app.manifests.is_empty(), "templates are never read as manifests");
        assert_eq!(app.problems.len(), 1, "{:?}", app.problems);
        let problem = &app.problems[0];
        assert_eq!(problem.file, "shop/kustomization.yaml");
        assert!(
            problem.message.contains("app shop") && problem.message.contains("/nonexistent/kustomize"),
            "{problem}"
        );
        assert!(problem.message.contains("scripts/renderers.sh"), "{problem}");
    }

    /// A renderer program that records every run in `record`.
    fn recording_renderer(dir: &Path) -> (PathBuf, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let record = dir.join("ran");
        let program = dir.join("renderer");
        std::fs::write(
            &program,
            format!("#!/bin/sh\necho \"$@\" >> {}\necho v0.0.1\n", record.display()),
        )
        .expect("write");
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        (program, record)
    }

    #[test]
    fn hostile_renderer_settings_are_refused_at_their_line_before_any_renderer_runs() {
        let hostile = ["--set-file=x=/etc/passwd", "-x", "/etc/passwd", "../x", "a\nb", "a\0b"];
        type Setting = fn(&str) -> String;
        let settings: [(&str, Setting, usize); 4] = [
            ("releaseName", |v| format!("helm:\n  releaseName: {v}\n"), 2),
            (
                "namespace",
                |v| format!("helm:\n  releaseName: ok\n  namespace: {v}\n"),
                3,
            ),
            (
                "valuesFiles",
                |v| format!("helm:\n  valuesFiles:\n  - values.yaml\n  - {v}\n"),
                4,
            ),
            ("path", |v| format!("# an overlay\nkustomize:\n  path: {v}\n"), 3),
        ];
        for (key, yaml, line) in settings {
            for value in hostile {
                let quoted = serde_json::to_string(value).expect("json");
                let (dir, tree) = tree_of(&[
                    ("web/Chart.yaml", "apiVersion: v2\nname: web\nversion: 0.1.0\n"),
                    ("web/values.yaml", "a: 1\n"),
                    ("web/kustomization.yaml", "resources: []\n"),
                    ("x/cm.yaml", "a: 1\n"),
                    ("web/gitcanary.yaml", &yaml(&quoted)),
                ]);
                let (program, record) = recording_renderer(dir.path());
                let renderers = Renderers::new(RenderConfig {
                    helm: Some(program.clone()),
                    kustomize: Some(program),
                    ..RenderConfig::default()
                });
                let mut set = crate::manifest::ManifestSet::default();
                Rendering::plan(&tree).finish(&tree, &renderers, &mut set);
                let problems = &set.apps["web"].problems;
                assert_eq!(problems.len(), 1, "{key} {value:?}: {problems:?}");
                let problem = &problems[0];
                assert_eq!(
                    (problem.file.as_str(), problem.line),
                    ("web/gitcanary.yaml", line),
                    "{key} {value:?}: {problem}"
                );
                assert!(
                    problem.message.contains(key) || problem.message.contains("file"),
                    "{key} {value:?}: {problem}"
                );
                assert!(!record.exists(), "{key} {value:?}: a renderer ran");
            }
        }
        // The recording renderer does record: a valid setting runs it.
        let (dir, tree) = tree_of(&[
            ("web/Chart.yaml", "apiVersion: v2\nname: web\nversion: 0.1.0\n"),
            ("web/gitcanary.yaml", "helm:\n  releaseName: web-1\n"),
        ]);
        let (program, record) = recording_renderer(dir.path());
        let renderers = Renderers::new(RenderConfig {
            helm: Some(program),
            ..RenderConfig::default()
        });
        Rendering::plan(&tree).finish(&tree, &renderers, &mut crate::manifest::ManifestSet::default());
        let ran = std::fs::read_to_string(record).expect("ran");
        assert!(
            ran.contains("template --namespace=default --skip-tests -- web-1 "),
            "{ran}"
        );
    }

    #[test]
    fn a_render_that_panics_is_a_problem_of_its_app_only() {
        let scratch = tempfile::tempdir().expect("dir");
        let jobs = ["calm", "wild"].map(|app| Prepared {
            app: app.to_string(),
            key: app.to_string(),
            file: format!("{app}/Chart.yaml"),
            scratch: tempfile::tempdir().expect("dir"),
            run: if app == "wild" {
                Box::new(|_: &Path| -> Rendered { panic!("chart exploded") })
            } else {
                Box::new(|_: &Path| Rendered::default())
            },
        });
        drop(scratch);
        let results: BTreeMap<String, Rendered> = run_parallel(jobs.into_iter().collect(), 2)
            .into_iter()
            .map(|(job, rendered)| (job.app, rendered))
            .collect();
        assert!(results["calm"].problems.is_empty());
        let problem = &results["wild"].problems[0];
        assert_eq!(problem.file, "wild/Chart.yaml");
        assert!(
            problem
                .message
                .contains("app wild: internal error while rendering: chart exploded"),
            "{problem}"
        );
    }

    #[test]
    fn a_render_with_a_secret_is_not_written_to_disk() {
        let disk = tempfile::tempdir().expect("dir");
        let renderers = Renderers {
            disk: Some(disk.path().to_path_buf()),
            ..Renderers::default()
        };
        let manifest = |kind: &str, value: &str| Manifest {
            app: "web".into(),
            file: "web/x.yaml".into(),
            line: 1,
            object: serde_json::json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": "a"}, "stringData": {"password": value}}),
        };
        renderers.keep(
            "with-secret",
            &[manifest("ConfigMap", "plain"), manifest("Secret", "hunter2-secret")],
        );
        renderers.keep("without", &[manifest("ConfigMap", "plain")]);
        let mut written = String::new();
        for entry in std::fs::read_dir(disk.path()).expect("dir").flatten() {
            written.push_str(&std::fs::read_to_string(entry.path()).expect("read"));
        }
        assert!(written.contains("plain"), "a render without a Secret is kept on disk");
        assert!(!written.contains("hunter2-secret"), "{written}");
        assert_eq!(
            renderers.cached("with-secret").map(|m| m.len()),
            Some(2),
            "kept in memory"
        );
    }

    #[test]
    fn a_failed_render_is_not_run_again_until_its_inputs_change() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, tree) = tree_of(&[("web/Chart.yaml", "apiVersion: v2\nname: web\nversion: 0.1.0\n")]);
        let record = dir.path().join("ran");
        let program = dir.path().join("helm");
        std::fs::write(
            &program,
            format!(
                "#!/bin/sh\necho \"$1\" >> {}\n[ \"$1\" = version ] && echo v0 && exit 0\necho 'Error: broken chart' >&2\nexit 1\n",
                record.display()
            ),
        )
        .expect("write");
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let renderers = Renderers::new(RenderConfig {
            helm: Some(program),
            ..RenderConfig::default()
        });
        let render = || {
            let mut set = crate::manifest::ManifestSet::default();
            Rendering::plan(&tree).finish(&tree, &renderers, &mut set);
            set.apps["web"].problems.clone()
        };
        let runs = || {
            std::fs::read_to_string(&record)
                .unwrap_or_default()
                .lines()
                .filter(|l| *l == "template")
                .count()
        };
        let first = render();
        assert!(first[0].message.contains("broken chart"), "{first:?}");
        assert_eq!(render(), first, "the failure comes from memory");
        assert_eq!(runs(), 1);
        // A changed chart is rendered again.
        std::fs::write(dir.path().join("web/values.yaml"), "a: 1\n").expect("write");
        render();
        assert_eq!(runs(), 2);
    }
}
