//! The GitHub API fake of the test suite as a program, for the demo: it
//! serves GitHub's REST shapes on loopback, merges pull requests into a
//! local bare repository, and maps API tokens to users.
//!
//! cargo run --example github_fake -- BARE_REPO [USER=TOKEN:PERMISSION ...]
//! Prints `GITHUB_URL=http://127.0.0.1:PORT` and serves until killed. With
//! GITHUB_FAKE_WEBHOOK_URL and GITHUB_FAKE_WEBHOOK_SECRET it delivers
//! GitHub's events there, signed, as a repository webhook does.

#[allow(dead_code)]
#[path = "../tests/support/github.rs"]
mod github;

#[path = "../tests/support/serve.rs"]
mod serve;
use serve::serve_on_own_thread;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let Some(bare) = args.next() else {
        eprintln!("usage: github_fake BARE_REPO [USER=TOKEN:PERMISSION | EMAIL=LOGIN ...]");
        std::process::exit(2);
    };
    let fake = github::GitHubFake::start_for(std::path::Path::new(&bare)).await;
    if let (Ok(url), Ok(secret)) = (
        std::env::var("GITHUB_FAKE_WEBHOOK_URL"),
        std::env::var("GITHUB_FAKE_WEBHOOK_SECRET"),
    ) {
        fake.deliver_to(&url, &secret);
    }
    for grant in args {
        // EMAIL=LOGIN: commits of that email are that account's.
        if let Some((email, login)) = grant.split_once('=').filter(|(email, _)| email.contains('@')) {
            fake.link_email(email, login);
            continue;
        }
        let parsed = grant.split_once('=').and_then(|(user, rest)| {
            rest.split_once(':')
                .map(|(token, permission)| (user, token, permission))
        });
        let Some((user, token, permission)) = parsed else {
            eprintln!("{grant:?} is not USER=TOKEN:PERMISSION");
            std::process::exit(2);
        };
        fake.token(token, user);
        fake.grant(user, permission);
    }
    println!("GITHUB_URL={}", fake.url);
    std::future::pending::<()>().await;
}
