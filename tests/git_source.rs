//! Fetching manifests from real Git: a bare repository served over HTTP by
//! `git http-backend` with Basic authentication, and over file://.

mod support;

use gitcanary::source::{Credentials, Source};
use support::git_server::GitServer;

const CONFIGMAP: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  color: blue\n";

#[tokio::test]
async fn commit_pushed_over_http_is_fetched_with_git2_using_a_token() {
    let server = GitServer::start(Some("x-access-token:s3cr3t-token")).await;
    let repo = server.create_repo("apps");
    repo.write("web/settings.yaml", CONFIGMAP);
    let remote = repo.http_url_with("x-access-token:s3cr3t-token");
    support::run(repo.path(), "git", &["remote", "add", "http", &remote]);
    let pushed = repo.commit_and_push_to("http", "add web settings");

    let cache = tempfile::tempdir().expect("cache dir");
    let credentials = Credentials {
        username: Some("x-access-token".into()),
        password: Some("s3cr3t-token".into()),
        ssh_key: None,
    };
    let source = Source::open(&repo.http_url(), "main", "", credentials, cache.path()).expect("source opens");
    let revision = tokio::task::spawn_blocking(move || source.fetch())
        .await
        .expect("no panic")
        .expect("fetch over HTTP succeeds");
    assert_eq!(revision.commit, pushed);
    let web = &revision.manifests.apps["web"];
    assert_eq!(web.manifests.len(), 1);
    assert_eq!(web.manifests[0].object["data"]["color"], "blue");
    assert_eq!(web.manifests[0].location(), "web/settings.yaml:1");
}

#[tokio::test]
async fn wrong_credentials_fail_without_revealing_the_secret() {
    let server = GitServer::start(Some("x-access-token:right-token")).await;
    let repo = server.create_repo("apps");
    repo.write("web/settings.yaml", CONFIGMAP);
    repo.commit_and_push("initial");

    let cache = tempfile::tempdir().expect("cache dir");
    let credentials = Credentials {
        username: Some("x-access-token".into()),
        password: Some("wrong-token-value".into()),
        ssh_key: None,
    };
    let source = Source::open(&repo.http_url(), "main", "", credentials, cache.path()).expect("source opens");
    let error = tokio::task::spawn_blocking(move || source.fetch())
        .await
        .expect("no panic")
        .expect_err("the server refuses the token");
    let message = error.to_string();
    assert!(message.contains("fetching main"), "{message}");
    assert!(!message.contains("wrong-token-value"), "the token leaked: {message}");
}

#[tokio::test]
async fn later_pushes_are_seen_and_sub_paths_are_honoured() {
    let server = GitServer::start(None).await;
    let repo = server.create_repo("apps");
    repo.write("clusters/prod/web/settings.yaml", CONFIGMAP);
    repo.write("README.yaml", "not: a manifest of the sub-path\n");
    repo.commit_and_push("initial");

    let cache = tempfile::tempdir().expect("cache dir");
    let source = std::sync::Arc::new(
        Source::open(
            &repo.file_url(),
            "main",
            "clusters/prod",
            Credentials::default(),
            cache.path(),
        )
        .expect("opens"),
    );
    let fetch = |source: std::sync::Arc<Source>| async move {
        tokio::task::spawn_blocking(move || source.fetch())
            .await
            .expect("no panic")
            .expect("fetch")
    };
    let first = fetch(source.clone()).await;
    assert_eq!(first.manifests.apps.keys().collect::<Vec<_>>(), vec!["web"]);

    repo.write("clusters/prod/web/settings.yaml", &CONFIGMAP.replace("blue", "green"));
    let second_commit = repo.commit_and_push("green");
    let second = fetch(source).await;
    assert_eq!(second.commit, second_commit);
    assert_eq!(
        second.manifests.apps["web"].manifests[0].object["data"]["color"],
        "green"
    );
}
