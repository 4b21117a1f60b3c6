use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use git2::{Cred, CredentialType, FetchOptions, RemoteCallbacks, Repository};
use sha2::{Digest, Sha256};

use super::Revision;
use crate::manifest::{self, parse::is_yaml};
use crate::render::{GitTree, Renderers, Rendering};
use crate::{Error, Result};
use std::sync::Arc;

/// Credentials for fetching (and later pushing). Read from the environment or
/// files, never from command-line arguments, and never printed.
#[derive(Clone, Default)]
pub struct Credentials {
    pub username: Option<String>,
    pub password: Option<String>,
    pub ssh_key: Option<PathBuf>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("ssh_key", &self.ssh_key)
            .finish()
    }
}

impl Credentials {
    /// `GITCANARY_GIT_TOKEN` (or `_TOKEN_FILE`) for HTTPS tokens;
    /// `GITCANARY_GIT_USERNAME` with `GITCANARY_GIT_PASSWORD` (or `_PASSWORD_FILE`);
    /// `GITCANARY_GIT_SSH_KEY` for a private key file.
    pub fn from_env() -> Result<Credentials> {
        let secret = |name: &str| -> Result<Option<String>> {
            if let Ok(value) = std::env::var(name) {
                return Ok(Some(value));
            }
            match std::env::var(format!("{name}_FILE")) {
                Ok(path) => std::fs::read_to_string(&path)
                    .map(|s| Some(s.trim_end().to_string()))
                    .map_err(|source| Error::Read { path, source }),
                Err(_) => Ok(None),
            }
        };
        let token = secret("GITCANARY_GIT_TOKEN")?;
        let password = secret("GITCANARY_GIT_PASSWORD")?;
        let username = std::env::var("GITCANARY_GIT_USERNAME").ok();
        Ok(Credentials {
            username: username.or_else(|| token.as_ref().map(|_| "x-access-token".to_string())),
            password: token.or(password),
            ssh_key: std::env::var_os("GITCANARY_GIT_SSH_KEY").map(PathBuf::from),
        })
    }
}

/// A Git branch followed through a bare mirror in a local cache directory.
#[derive(Clone)]
pub struct GitSource {
    url: String,
    branch: String,
    path: String,
    credentials: Credentials,
    mirror: PathBuf,
    pub(crate) renderers: Arc<Renderers>,
    /// gitcanary's commit identity: a status file counts only when its last
    /// change is a commit of this identity.
    pub(crate) record_writer: Arc<crate::identity::Author>,
    /// Where this agent's status files, gates and trailers are.
    pub(crate) records: Arc<crate::rollout::record::Records>,
    /// Fetches into the mirror one at a time: the loader's and a
    /// write-back's would otherwise race for the same refs' locks. Holds
    /// the mirror as the branch's fetch opened it: a poll opens it once, not
    /// every time (reading the repository's config files again).
    fetching: Arc<std::sync::Mutex<Option<Repository>>>,
}

/// How long a Git server may take to accept a connection.
const CONNECT_TIMEOUT_MS: i32 = 10_000;
/// How long a fetch or push may wait for the server between bytes.
const TRANSFER_STALL_MS: i32 = 20_000;

/// Sets libgit2's network timeouts, once, before the first remote is opened:
/// a Git server that accepts and never answers fails the fetch in time.
fn set_network_timeouts() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: libgit2's global options are written once, here, before
        // this process opens any remote (every GitSource is made through
        // `new`), so no other thread reads them meanwhile.
        let set = unsafe {
            git2::opts::set_server_connect_timeout_in_milliseconds(CONNECT_TIMEOUT_MS)
                .and_then(|()| git2::opts::set_server_timeout_in_milliseconds(TRANSFER_STALL_MS))
        };
        if let Err(error) = set {
            tracing::warn!(%error, "libgit2 takes no network timeouts; a hanging Git server stalls the fetch");
        }
    });
}

impl GitSource {
    pub fn new(url: String, branch: &str, path: &str, credentials: Credentials, cache: &Path) -> GitSource {
        set_network_timeouts();
        let id = hex::encode(&Sha256::digest(url.as_bytes())[..8]);
        GitSource {
            mirror: cache.join("repos").join(id),
            url,
            branch: branch.to_string(),
            path: path.trim_matches('/').to_string(),
            credentials,
            renderers: Arc::default(),
            record_writer: Arc::default(),
            records: Arc::default(),
            fetching: Arc::default(),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn branch(&self) -> &str {
        &self.branch
    }

    /// Where this agent's status files, gates and trailers are.
    pub fn records(&self) -> &crate::rollout::record::Records {
        &self.records
    }

    /// The sub-path of the repository that holds the apps ("" for the root).
    pub fn path(&self) -> &str {
        &self.path
    }

    pub(crate) fn open_mirror(&self) -> Result<Repository> {
        match Repository::open_bare(&self.mirror) {
            Ok(repo) => Ok(repo),
            Err(_) => {
                std::fs::create_dir_all(&self.mirror).map_err(|source| Error::Read {
                    path: self.mirror.display().to_string(),
                    source,
                })?;
                Repository::init_bare(&self.mirror).map_err(Error::git("creating the local mirror"))
            }
        }
    }

    /// Fetches the branch and loads the manifests of its head commit.
    pub fn fetch(&self) -> Result<Revision> {
        let head = self.fetch_head()?;
        Ok(self.load(&head, None)?.0)
    }

    /// Fetches the branch; its head commit's id.
    pub fn fetch_head(&self) -> Result<String> {
        let mut kept = self.fetching.lock().unwrap_or_else(|e| e.into_inner());
        let repo = match kept.take() {
            Some(repo) => repo,
            None => self.open_mirror()?,
        };
        let head = self.fetch_head_into(&repo)?;
        // Kept only after a fetch that worked: a mirror that failed is opened again.
        *kept = Some(repo);
        Ok(head)
    }

    fn fetch_head_into(&self, repo: &Repository) -> Result<String> {
        let mut remote = repo
            .remote_anonymous(&self.url)
            .map_err(Error::git(format!("opening remote {}", redact_url(&self.url))))?;
        let refspec = format!("+refs/heads/{0}:refs/remotes/origin/{0}", self.branch);
        let mut options = self.fetch_options();
        // Local clones cannot be shallow in libgit2; remote ones fetch the
        // recent history, enough to find the commit that changed each app.
        if !self.url.starts_with("file://") {
            options.depth(APP_HISTORY as i32 + 1);
        }
        remote
            .fetch(&[&refspec], Some(&mut options), None)
            .map_err(|e| Error::Git {
                context: format!("fetching {} from {}", self.branch, redact_url(&self.url)),
                source: e,
            })?;
        let reference = format!("refs/remotes/origin/{}", self.branch);
        let commit = repo
            .find_reference(&reference)
            .and_then(|r| r.peel_to_commit())
            .map_err(Error::git(format!("branch {} not found", self.branch)))?;
        Ok(commit.id().to_string())
    }

    /// Loads the manifests of a fetched commit. Plain apps of `previous`
    /// whose directory has the same tree id and that had no problems are
    /// taken over as they are instead of being read and parsed again.
    pub fn load(
        &self,
        commit: &str,
        previous: Option<(manifest::ManifestSet, AppFiles)>,
    ) -> Result<(Revision, AppFiles)> {
        let repo = self.open_mirror()?;
        let commit = self.find_commit(&repo, commit)?;
        let fingerprints = app_fingerprints(&repo, &commit, &self.path);
        let mut reused = Reused::default();
        let mut known = None;
        if let Some((mut set, files)) = previous {
            // In place: a push that changes one app of thousands moves none
            // of the others.
            let same = |name: &String| {
                let now = fingerprints.as_ref().and_then(|f| f.get(name));
                name != manifest::ROOT_APP && now.is_some() && now == files.apps.get(name).map(|(f, _)| f)
            };
            set.apps.retain(|name, app| app.problems.is_empty() && same(name));
            reused.bytes = files
                .apps
                .into_iter()
                .filter(|(name, _)| set.apps.contains_key(name))
                .map(|(name, (_, bytes))| (name, bytes))
                .collect();
            reused.apps = set.apps;
            known = files.commits;
        }
        let (manifests, mut files) = self.read_tree_reusing(&repo, &commit, reused)?;
        let Some(fingerprints) = fingerprints else {
            let revision = self.revision(&commit, manifests, BTreeMap::new());
            return Ok((revision, files));
        };
        // What the next load compares against.
        for (name, (fingerprint, _)) in files.apps.iter_mut() {
            if let Some(id) = fingerprints.get(name) {
                fingerprint.clone_from(id);
            }
        }
        let app_commits = app_commits(&repo, &commit, &self.path, fingerprints, known.as_ref());
        files.commits = Some(AppCommits {
            head: commit.id().to_string(),
            apps: app_commits.clone(),
        });
        Ok((self.revision(&commit, manifests, app_commits), files))
    }

    fn revision(
        &self,
        commit: &git2::Commit<'_>,
        manifests: manifest::ManifestSet,
        app_commits: BTreeMap<String, String>,
    ) -> Revision {
        Revision {
            commit: commit.id().to_string(),
            manifests,
            app_commits,
            history: Some(std::sync::Arc::new(super::history::GitHistory {
                git: self.clone(),
                head: commit.id().to_string(),
            })),
            validated: 0,
        }
    }

    /// The commit, fetched by id when a shallow mirror lacks it.
    pub(crate) fn find_commit<'r>(&self, repo: &'r Repository, sha: &str) -> Result<git2::Commit<'r>> {
        let oid = git2::Oid::from_str(sha).map_err(Error::git(format!("commit id {sha}")))?;
        if let Ok(commit) = repo.find_commit(oid) {
            return Ok(commit);
        }
        self.fetch_refs(repo, &[sha])?;
        repo.find_commit(oid)
            .map_err(Error::git(format!("commit {sha} is not in the repository")))
    }

    pub(crate) fn read_tree(&self, repo: &Repository, commit: &git2::Commit<'_>) -> Result<manifest::ManifestSet> {
        Ok(self.read_tree_reusing(repo, commit, Reused::default())?.0)
    }

    /// `read_tree`, with the apps `reused` taken as they are; the bytes of
    /// every app are tallied (its fingerprint is left for the caller).
    fn read_tree_reusing(
        &self,
        repo: &Repository,
        commit: &git2::Commit<'_>,
        reused: Reused,
    ) -> Result<(manifest::ManifestSet, AppFiles)> {
        let root = commit.tree().map_err(Error::git("reading the commit tree"))?;
        let tree = if self.path.is_empty() {
            root
        } else {
            let entry = root.get_path(Path::new(&self.path)).map_err(Error::git(format!(
                "path {} not found in commit {}",
                self.path,
                commit.id()
            )))?;
            repo.find_tree(entry.id())
                .map_err(Error::git(format!("{} is not a directory", self.path)))?
        };
        let source_tree = GitTree {
            repo,
            root: tree.clone(),
        };
        // An app taken over is plain: its directory is the one read before.
        let rendering = Rendering::plan_except(&source_tree, |app| reused.apps.contains_key(app));
        let mut files = Vec::new();
        let mut failure = None;
        let mut sizes = manifest::SizeCheck::default();
        // What is taken over still counts toward the revision's size limit.
        sizes.add(reused.bytes.values().sum());
        let mut app_files = AppFiles {
            apps: reused
                .bytes
                .into_iter()
                .map(|(name, bytes)| (name, (String::new(), bytes)))
                .collect(),
            commits: None,
        };
        let odb = repo.odb().map_err(Error::git("opening the object database"))?;
        let revision = format!("commit {}", commit.id());
        let walked = tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
            let name = entry.name().unwrap_or_default();
            if name.starts_with('.')
                || (dir.is_empty() && (rendering.skip.contains(name) || reused.apps.contains_key(name)))
            {
                return git2::TreeWalkResult::Skip;
            }
            if entry.kind() == Some(git2::ObjectType::Blob) && is_yaml(name) {
                let path = format!("{dir}{name}");
                // The header gives the size without inflating the blob.
                let read = odb
                    .read_header(entry.id())
                    .map_err(Error::git("reading a manifest blob's header"))
                    .and_then(|(bytes, _)| {
                        let app = path.split_once('/').map_or(manifest::ROOT_APP, |(app, _)| app);
                        app_files.apps.entry(app.to_string()).or_default().1 += bytes as u64;
                        sizes.admit(&revision, &path, bytes as u64)
                    })
                    .and_then(|admitted| {
                        admitted
                            .then(|| repo.find_blob(entry.id()).map(|b| b.content().to_vec()))
                            .transpose()
                            .map_err(Error::git("reading a manifest blob"))
                    });
                match read {
                    Ok(Some(content)) => files.push((path, content)),
                    Ok(None) => {}
                    Err(e) => {
                        failure = Some(e);
                        return git2::TreeWalkResult::Abort;
                    }
                }
            }
            git2::TreeWalkResult::Ok
        });
        // An aborted walk is an error of its own; the cause is `failure`.
        if let Some(e) = failure {
            return Err(e);
        }
        walked.map_err(Error::git("walking the commit tree"))?;
        let read = manifest::load_files(files.into_iter());
        // The apps read join the ones taken over (never the same: a walk
        // skips what is taken over), not the other way round.
        let mut set = manifest::ManifestSet { apps: reused.apps };
        set.apps.extend(read.apps);
        sizes.report(&mut set);
        rendering.finish(&source_tree, &self.renderers, &mut set);
        Ok((set, app_files))
    }

    fn fetch_options(&self) -> FetchOptions<'_> {
        let mut options = FetchOptions::new();
        options.remote_callbacks(self.callbacks());
        // Nothing reads FETCH_HEAD (the refspecs name the refs read), and
        // writing it is a file write on every poll.
        options.update_fetchhead(false);
        options
    }

    /// The branch's head on the remote as it stands now, read without
    /// fetching or writing anything: a `file://` repository at a plain
    /// absolute path is read in place (kept open in `reader` between looks),
    /// any other remote's refs are listed.
    pub fn remote_head(&self, reader: &mut HeadReader) -> Result<String> {
        let branch = format!("refs/heads/{}", self.branch);
        // Only a plain absolute path: `file://host/…` and `%`-escapes are the
        // transport's to read, never a different repository's.
        let local = self
            .url
            .strip_prefix("file://")
            .filter(|path| path.starts_with('/') && !path.contains('%'));
        if let Some(path) = local {
            if reader.local.is_none() {
                reader.local = Repository::open(path).ok();
            }
            if let Some(repo) = &reader.local {
                match repo.refname_to_id(&branch) {
                    Ok(id) => return Ok(id.to_string()),
                    // Opened again next time; the listing below says what is wrong now.
                    Err(_) => reader.local = None,
                }
            }
        }
        let context = || format!("listing the branches of {}", redact_url(&self.url));
        let mut remote = git2::Remote::create_detached(self.url.as_str()).map_err(Error::git(context()))?;
        remote
            .connect_auth(git2::Direction::Fetch, Some(self.callbacks()), None)
            .map_err(Error::git(context()))?;
        let head = remote
            .list()
            .map_err(Error::git(context()))?
            .iter()
            .find(|head| head.name() == branch)
            .map(|head| head.oid().to_string());
        head.ok_or_else(|| Error::Git {
            context: context(),
            source: git2::Error::from_str(&format!("branch {} not found", self.branch)),
        })
    }

    /// Fetches `refspecs` (branches or commit ids) into the mirror, in full.
    pub(crate) fn fetch_refs(&self, repo: &Repository, refspecs: &[&str]) -> Result<()> {
        let mut remote = repo
            .remote_anonymous(&self.url)
            .map_err(Error::git(format!("opening remote {}", redact_url(&self.url))))?;
        let _one_at_a_time = self.fetching.lock().unwrap_or_else(|e| e.into_inner());
        remote
            .fetch(refspecs, Some(&mut self.fetch_options()), None)
            .map_err(Error::git(format!("fetching from {}", redact_url(&self.url))))
    }

    /// Callbacks that answer the remote's credential requests once.
    pub(crate) fn callbacks(&self) -> RemoteCallbacks<'_> {
        let mut callbacks = RemoteCallbacks::new();
        let mut attempts = 0;
        let configured_host = host_of(&self.url);
        callbacks.credentials(move |url, username_from_url, allowed| {
            // libgit2 asks again after a rejected credential; one try is enough.
            attempts += 1;
            if attempts > 1 {
                return Err(git2::Error::from_str("authentication failed"));
            }
            // Credentials go only to the configured host, never to one a redirect names.
            if host_of(url) != configured_host {
                return Err(git2::Error::from_str(&format!(
                    "{} asks for credentials, but they are only for {}",
                    redact_url(url),
                    configured_host.as_deref().unwrap_or("the configured host")
                )));
            }
            let creds = &self.credentials;
            if allowed.contains(CredentialType::SSH_KEY)
                && let Some(key) = &creds.ssh_key
            {
                return Cred::ssh_key(username_from_url.unwrap_or("git"), None, key, None);
            }
            if allowed.contains(CredentialType::USER_PASS_PLAINTEXT)
                && let Some(password) = &creds.password
            {
                let user = creds.username.as_deref().or(username_from_url).unwrap_or("git");
                return Cred::userpass_plaintext(user, password);
            }
            Err(git2::Error::from_str(
                "the remote asks for credentials and none are configured",
            ))
        });
        callbacks
    }
}

/// What `GitSource::remote_head` keeps between looks: a local remote's
/// repository, open.
#[derive(Default)]
pub struct HeadReader {
    local: Option<Repository>,
}

/// Removes any `user:password@` from a URL before it is shown, whatever the
/// password holds (`/`, `@`) and with or without a path. An `@` in the path
/// is taken for credentials too: shown less, never more.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

/// The host (and port) a URL names, without credentials.
fn host_of(url: &str) -> Option<String> {
    let (_, rest) = url.split_once("://")?;
    let end = rest.find(['?', '#']).unwrap_or(rest.len());
    let after_credentials = rest[..end].rfind('@').map_or(rest, |at| &rest[at + 1..]);
    let host = after_credentials.split('/').next()?;
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// Each app's fingerprint (see `app_fingerprints`) and the bytes of its
/// files, as a load left them: what the next load can take over.
#[derive(Debug, Clone, Default)]
pub struct AppFiles {
    apps: BTreeMap<String, (String, u64)>,
    /// The commit that last changed each app, as the load found it.
    commits: Option<AppCommits>,
}

/// The plain apps a load takes over from the last one, with the bytes of
/// their files.
#[derive(Default)]
struct Reused {
    apps: BTreeMap<String, manifest::App>,
    bytes: BTreeMap<String, u64>,
}

/// The commit that last changed each app of `head`'s tree.
#[derive(Debug, Clone)]
struct AppCommits {
    head: String,
    apps: BTreeMap<String, String>,
}

/// For each app of `head` (`at_head`: its fingerprints there), the newest
/// commit, on `head`'s first-parent line, whose diff changed the app's
/// files. The walk stops at the head an earlier load looked at (`known`):
/// an app that no commit since changed keeps the commit found then, so a
/// push reads the trees of the commits since the last load only. An app
/// whose change lies beyond `APP_HISTORY` commits, or the fetched history,
/// is left out (the head stands for it), and keeps that head from then on:
/// a later push that leaves it alone does not make it look changed.
fn app_commits(
    repo: &Repository,
    head: &git2::Commit<'_>,
    path: &str,
    at_head: BTreeMap<String, String>,
    known: Option<&AppCommits>,
) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let mut unresolved = at_head;
    let mut current = head.clone();
    for _ in 0..APP_HISTORY {
        if let Some(known) = known.filter(|known| current.id().to_string() == known.head) {
            for app in unresolved.into_keys() {
                let commit = known.apps.get(&app).cloned().unwrap_or_else(|| known.head.clone());
                found.insert(app, commit);
            }
            return found;
        }
        let Ok(parent) = current.parent(0) else {
            // The root commit introduced whatever is left; a shallow boundary says nothing.
            if current.parent_count() == 0 {
                for app in unresolved.into_keys() {
                    found.insert(app, current.id().to_string());
                }
            }
            return found;
        };
        let before = app_fingerprints(repo, &parent, path).unwrap_or_default();
        unresolved.retain(|app, fingerprint| {
            let changed = before.get(app) != Some(fingerprint);
            if changed {
                found.insert(app.clone(), current.id().to_string());
            }
            !changed
        });
        if unresolved.is_empty() {
            break;
        }
        current = parent;
    }
    found
}

/// Commits searched for the one that last changed an app.
const APP_HISTORY: usize = 50;

/// App -> an id of its files at `commit`: the tree id of its directory, or for
/// the root app the ids of the top-level files. `None` when the path is absent.
fn app_fingerprints(repo: &Repository, commit: &git2::Commit<'_>, path: &str) -> Option<BTreeMap<String, String>> {
    let root = commit.tree().ok()?;
    let tree = if path.is_empty() {
        root
    } else {
        repo.find_tree(root.get_path(Path::new(path)).ok()?.id()).ok()?
    };
    let mut apps = BTreeMap::new();
    let mut top_level = String::new();
    for entry in tree.iter() {
        let name = entry.name().unwrap_or_default();
        if name.starts_with('.') {
            continue;
        }
        match entry.kind() {
            Some(git2::ObjectType::Tree) => {
                apps.insert(name.to_string(), entry.id().to_string());
            }
            Some(git2::ObjectType::Blob) if is_yaml(name) => {
                top_level.push_str(&format!("{name}={};", entry.id()));
            }
            _ => {}
        }
    }
    apps.insert(manifest::ROOT_APP.to_string(), top_level);
    Some(apps)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commits `files` (path -> content; `None` deletes) on main of the repository in `dir`.
    fn commit(dir: &Path, files: &[(&str, Option<&str>)]) -> String {
        let repo = Repository::open(dir).unwrap_or_else(|_| {
            let mut options = git2::RepositoryInitOptions::new();
            options.initial_head("main");
            Repository::init_opts(dir, &options).expect("init")
        });
        for (path, content) in files {
            let file = dir.join(path);
            match content {
                Some(text) => {
                    std::fs::create_dir_all(file.parent().expect("a parent")).expect("mkdir");
                    std::fs::write(&file, text).expect("write");
                }
                None => std::fs::remove_file(&file).expect("remove"),
            }
        }
        let mut index = repo.index().expect("index");
        index.add_all(["*"], git2::IndexAddOption::DEFAULT, None).expect("add");
        index.update_all(["*"], None).expect("update");
        let tree = repo.find_tree(index.write_tree().expect("tree")).expect("tree");
        index.write().expect("index");
        let signature = git2::Signature::now("test", "test@example.com").expect("signature");
        let parent = repo.head().ok().and_then(|h| h.peel_to_commit().ok());
        let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
        let id = repo
            .commit(
                Some("refs/heads/main"),
                &signature,
                &signature,
                "change",
                &tree,
                &parents,
            )
            .expect("commit");
        id.to_string()
    }

    fn config_map(name: &str, color: &str) -> String {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  color: {color}\n")
    }

    #[test]
    fn the_remote_head_is_read_as_it_stands_without_fetching() {
        let root = tempfile::tempdir().expect("root");
        let cache = tempfile::tempdir().expect("cache");
        let work = root.path().join("remote");
        let first = commit(&work, &[("a/cm.yaml", Some(&config_map("a", "blue")))]);
        let source = |url: String, branch: &str| GitSource::new(url, branch, "", Credentials::default(), cache.path());
        // In place, and (a plain path is not read in place) listed as any remote's.
        let local = source(format!("file://{}", work.display()), "main");
        let listed = source(work.display().to_string(), "main");
        let (mut kept, mut not_kept) = (HeadReader::default(), HeadReader::default());
        assert_eq!(local.remote_head(&mut kept).expect("read in place"), first);
        assert!(
            kept.local.is_some(),
            "the local repository stays open for the next look"
        );
        assert_eq!(listed.remote_head(&mut not_kept).expect("listed"), first);
        assert!(not_kept.local.is_none());

        let second = commit(&work, &[("a/cm.yaml", Some(&config_map("a", "green")))]);
        assert_eq!(
            local.remote_head(&mut kept).expect("read in place"),
            second,
            "read anew each look"
        );
        assert_eq!(listed.remote_head(&mut not_kept).expect("listed"), second);
        assert!(!cache.path().join("repos").exists(), "nothing was fetched");

        let mut hosted = HeadReader::default();
        let _ = source(format!("file://localhost{}", work.display()), "main").remote_head(&mut hosted);
        assert!(hosted.local.is_none(), "a URL with a host is the transport's to read");

        let error = source(format!("file://{}", work.display()), "release")
            .remote_head(&mut HeadReader::default())
            .expect_err("no such branch");
        assert!(error.to_string().contains("release"), "{error}");
        std::fs::rename(&work, root.path().join("gone")).expect("the remote goes away");
        assert!(
            local.remote_head(&mut kept).is_err(),
            "a remote that went away is an error"
        );
        assert!(kept.local.is_none(), "and is opened again next time");
    }

    #[test]
    fn a_load_takes_over_unchanged_apps_and_reads_every_change() {
        let work = tempfile::tempdir().expect("work");
        let cache = tempfile::tempdir().expect("cache");
        let (blue, red) = (config_map("a", "blue"), config_map("b", "red"));
        commit(
            work.path(),
            &[
                ("a/cm.yaml", Some(&blue)),
                ("b/cm.yaml", Some(&red)),
                ("gone/cm.yaml", Some(&config_map("gone", "x"))),
                ("broken/cm.yaml", Some("kind: [unclosed\n")),
            ],
        );
        let url = format!("file://{}", work.path().display());
        let git = GitSource::new(url, "main", "", Credentials::default(), cache.path());
        let first = git.fetch_head().expect("fetch");
        let (mut revision, files) = git.load(&first, None).expect("load");
        let allowed = manifest::Allowed::default();
        revision.manifests.validate_with(&allowed, |_| Vec::new());
        assert!(!revision.manifests.apps["broken"].problems.is_empty());

        let green = config_map("b", "green");
        let second = commit(
            work.path(),
            &[
                ("b/cm.yaml", Some(&green)),
                ("gone/cm.yaml", None),
                ("broken/cm.yaml", Some(&config_map("fixed", "yellow"))),
                ("copy/cm.yaml", Some(&config_map("a", "blue"))),
            ],
        );
        assert_eq!(git.fetch_head().expect("fetch"), second);
        let (mut revision, _) = git.load(&second, Some((revision.manifests, files))).expect("load");
        revision.manifests.validate_with(&allowed, |_| Vec::new());
        let apps = &revision.manifests.apps;
        assert!(
            apps["copy"].problems[0]
                .message
                .contains("duplicate object ConfigMap a, first defined at a/cm.yaml:1"),
            "an app taken over is still checked against the others: {:?}",
            apps["copy"].problems
        );
        let color = |app: &str| apps[app].manifests[0].object["data"]["color"].clone();
        assert_eq!(color("a"), "blue", "the unchanged app, taken over");
        assert_eq!(color("b"), "green", "the changed app, read again");
        assert!(!apps.contains_key("gone"), "an app that left the tree is gone");
        assert!(
            apps["broken"].problems.is_empty(),
            "an app that had problems is read again: {:?}",
            apps["broken"].problems
        );
        assert_eq!(apps["broken"].manifests[0].name(), "fixed");
    }

    #[test]
    fn urls_lose_their_credentials() {
        assert_eq!(
            redact_url("https://bob:s3cret@git.example/org/repo.git"),
            "https://***@git.example/org/repo.git"
        );
        assert_eq!(
            redact_url("https://git.example/org/repo.git"),
            "https://git.example/org/repo.git"
        );
        assert_eq!(
            redact_url("https://bob:pa/ss@w0rd@git.example/org/repo.git"),
            "https://***@git.example/org/repo.git",
            "a password holding / and @"
        );
        assert_eq!(
            redact_url("https://bob:s3cret@git.example"),
            "https://***@git.example",
            "no path"
        );
        assert_eq!(
            redact_url("ssh://git@git.example:22/org/repo.git"),
            "ssh://***@git.example:22/org/repo.git"
        );
        assert_eq!(
            redact_url("https://git.example/org/repo.git?ref=a@b"),
            "https://git.example/org/repo.git?ref=a@b"
        );
    }

    #[test]
    fn credentials_are_only_for_the_configured_host() {
        assert_eq!(
            host_of("https://bob:pa/ss@Git.Example:8443/org/repo"),
            Some("git.example:8443".into())
        );
        assert_eq!(host_of("https://git.example"), Some("git.example".into()));
        assert_ne!(
            host_of("https://evil.example/org/repo"),
            host_of("https://git.example/org/repo")
        );
        assert_eq!(host_of("file:///tmp/repo.git"), None);
    }

    #[test]
    fn debug_never_shows_the_password() {
        let creds = Credentials {
            username: Some("bob".into()),
            password: Some("s3cret".into()),
            ssh_key: None,
        };
        assert!(!format!("{creds:?}").contains("s3cret"));
    }

    #[test]
    fn each_app_keeps_the_commit_that_last_changed_it_and_a_push_reads_only_what_came_since() {
        let work = tempfile::tempdir().expect("work");
        let cache = tempfile::tempdir().expect("cache");
        let first = commit(
            work.path(),
            &[
                ("a/cm.yaml", Some(&config_map("a", "1"))),
                ("old/cm.yaml", Some(&config_map("old", "1"))),
            ],
        );
        // Past the history searched: "old" is left out, the head stands for it.
        let mut head = first.clone();
        for i in 0..=APP_HISTORY {
            head = commit(work.path(), &[("a/cm.yaml", Some(&config_map("a", &format!("{i}"))))]);
        }
        let url = format!("file://{}", work.path().display());
        let git = GitSource::new(url, "main", "", Credentials::default(), cache.path());
        assert_eq!(git.fetch_head().expect("fetch"), head);
        let (revision, files) = git.load(&head, None).expect("load");
        assert_eq!(revision.commit_for("a"), head);
        assert_eq!(revision.commit_for("old"), head, "beyond the history searched");
        let loaded_at = head.clone();

        let b = commit(work.path(), &[("b/cm.yaml", Some(&config_map("b", "1")))]);
        let later = commit(work.path(), &[("c/cm.yaml", Some(&config_map("c", "1")))]);
        assert_eq!(git.fetch_head().expect("fetch"), later);
        // What the last load found is taken as it is: a made-up answer for
        // "a" shows the walk stopped at the head it looked at.
        let mut files = files;
        files
            .commits
            .as_mut()
            .expect("found")
            .apps
            .insert("a".into(), first.clone());
        let (revision, _) = git.load(&later, Some((revision.manifests, files))).expect("load");
        assert_eq!(revision.commit_for("a"), first, "taken over, not walked again");
        assert_eq!(
            revision.commit_for("old"),
            loaded_at,
            "a push that leaves it alone keeps its commit"
        );
        assert_eq!(revision.commit_for("b"), b);
        assert_eq!(revision.commit_for("c"), later);
    }
}
