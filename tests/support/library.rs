//! A namespace, a Git repository and a cluster connection for tests that
//! call the library's `sync` and `diff` directly, as the CLI does.

use gitcanary::cluster::Cluster;
use gitcanary::source::{Credentials, Revision, Source};
use gitcanary::sync::SyncOptions;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;

use super::git_server::{GitRepo, GitServer};

pub struct Fixture {
    _server: GitServer,
    pub repo: GitRepo,
    pub ns: String,
    pub cluster: Cluster,
    pub client: kube::Client,
    pub cache: tempfile::TempDir,
}

impl Fixture {
    pub async fn new(prefix: &str) -> Fixture {
        let client = super::client().await;
        let ns = super::namespace(&client, prefix).await;
        let server = GitServer::start(None).await;
        let repo = server.create_repo("apps");
        let cluster = Cluster::from_client(client.clone()).await.expect("discovery");
        Fixture {
            _server: server,
            repo,
            ns,
            cluster,
            client,
            cache: tempfile::tempdir().expect("cache dir"),
        }
    }

    /// As `new`, on a control plane that serves Rollouts (installed before
    /// the fixture's discovery runs).
    pub async fn with_rollouts(prefix: &str) -> Fixture {
        super::agent::install_rollout_crd(&super::client().await).await;
        Fixture::new(prefix).await
    }

    /// This test's instance, with its state in the test's namespace.
    pub fn options(&self, prune: bool) -> SyncOptions {
        SyncOptions {
            instance: format!("test-{}", self.ns),
            source: self.repo.file_url(),
            state_namespace: self.ns.clone(),
            prune,
            ..SyncOptions::default()
        }
    }

    /// What `main` of the repository holds now.
    pub async fn revision(&self) -> Revision {
        let source = Source::open(
            &self.repo.file_url(),
            "main",
            "",
            Credentials::default(),
            self.cache.path(),
        )
        .expect("source");
        tokio::task::spawn_blocking(move || source.fetch())
            .await
            .expect("no panic")
            .expect("fetch")
    }

    pub fn configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub async fn color(&self, name: &str) -> Option<String> {
        super::color_of(&self.configmaps(), name).await
    }
}
