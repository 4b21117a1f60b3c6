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

/// A release is for the commit that changed its app, not for whatever the
/// branch head was when the agent looked (over HTTP, where fetches are shallow).
#[tokio::test]
async fn each_app_knows_the_commit_that_last_changed_it() {
    let server = GitServer::start(None).await;
    let repo = server.create_repo("apps");
    repo.write("web/settings.yaml", CONFIGMAP);
    repo.write("api/settings.yaml", CONFIGMAP);
    repo.write(
        "namespace.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n",
    );
    let first = repo.commit_and_push("web, api and the namespace");
    repo.write("web/settings.yaml", &CONFIGMAP.replace("blue", "green"));
    let web_change = repo.commit_and_push("web goes green");
    repo.write("api/extra.yaml", &CONFIGMAP.replace("settings", "extra"));
    let api_change = repo.commit_and_push("api gets more settings");
    repo.write(".gitcanary/status/shop/web.yaml", "outcome: promoted\n");
    let head = repo.commit_and_push("a status file");

    let cache = tempfile::tempdir().expect("cache dir");
    let source = Source::open(&repo.http_url(), "main", "", Credentials::default(), cache.path()).expect("source");
    let revision = tokio::task::spawn_blocking(move || source.fetch())
        .await
        .expect("no panic")
        .expect("fetch");
    assert_eq!(revision.commit, head);
    assert_eq!(revision.commit_for("web"), web_change);
    assert_eq!(revision.commit_for("api"), api_change);
    assert_eq!(revision.commit_for("root"), first);
}

#[tokio::test]
async fn blobs_are_measured_before_they_are_read_and_a_revision_has_a_total_cap() {
    let server = GitServer::start(None).await;
    let repo = server.create_repo("apps");
    // 5 MiB that Git stores in a few kilobytes: only its header is read.
    let huge = format!("# {}\n", "a".repeat(5 * 1024 * 1024));
    repo.write("web/settings.yaml", CONFIGMAP);
    repo.write("blob/huge.yaml", &huge);
    repo.commit_and_push("one file over the limit");
    let cache = tempfile::tempdir().expect("cache dir");
    let fetch = || {
        let source = Source::open(&repo.file_url(), "main", "", Credentials::default(), cache.path()).expect("source");
        tokio::task::spawn_blocking(move || source.fetch())
    };
    let revision = fetch().await.expect("no panic").expect("fetched");
    assert_eq!(
        revision.manifests.apps["web"].manifests.len(),
        1,
        "other apps still load"
    );
    let problems: Vec<String> = revision.manifests.apps["blob"]
        .problems
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        problems,
        vec![format!(
            "blob/huge.yaml:1: file is {} bytes, larger than the 4194304-byte limit; it was not read",
            huge.len()
        )]
    );

    // The same blob under 13 names is 65 MiB of manifests: over the 64 MiB cap.
    for copy in 0..13 {
        repo.write(&format!("blob/copy-{copy:02}.yaml"), &huge);
    }
    let pushed = repo.commit_and_push("65 MiB of manifests");
    let error = fetch().await.expect("no panic").expect_err("refused whole");
    let message = error.to_string();
    assert!(
        message.starts_with(&format!(
            "commit {pushed}: its manifests are more than 67108864 bytes together (blob/copy-"
        )),
        "{message}"
    );
    assert!(message.contains(", of app blob, passes the cap"), "{message}");
}
