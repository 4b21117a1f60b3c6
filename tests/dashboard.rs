//! The release page in a real browser: headless Chromium, driven through
//! chromedriver's WebDriver API, opens the page of a release paused at its
//! second step, finds its steps, traffic, batch pods and promotion pull
//! request, and sees a promote from the CLI arrive without a reload.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gitcanary::rollout::api::{Phase, Rollout};
use kube::api::Api;
use serde_json::{Value, json};
use support::agent::{AgentProcess, Scenario};
use support::eventually;

const WAIT: Duration = Duration::from_secs(90);
const SECRET_VALUE: &str = "do-not-show-hunter2";

/// A process killed when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One request to chromedriver, which keeps a connection open whatever
/// the request asks: its answer is read to its Content-Length.
fn exchange(address: &str, method: &str, path: &str, body: &[u8]) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).ok()?;
    stream.write_all(body).ok()?;
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).ok()?;
    let status = status_line.split_whitespace().nth(1)?.parse().ok()?;
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().ok()?;
        }
    }
    let mut answer = vec![0; length];
    reader.read_exact(&mut answer).ok()?;
    Some((status, String::from_utf8_lossy(&answer).into_owned()))
}

/// chromedriver on a free port, and one headless Chromium session.
struct Browser {
    _driver: Killed,
    address: String,
    session: String,
}

impl Browser {
    fn start() -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver runs (scripts/setup.sh installs chromium-driver)");
        let address = format!("127.0.0.1:{port}");
        let started = Instant::now();
        while exchange(&address, "GET", "/status", b"").is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "chromedriver did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1000,1800",
        ];
        let capabilities = json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": {"args": args}}}});
        let mut browser = Browser {
            _driver: Killed(driver),
            address,
            session: String::new(),
        };
        let made = browser.call("POST", "/session", &capabilities);
        browser.session = made["sessionId"].as_str().expect("a session").to_string();
        browser
    }

    fn call(&self, method: &str, path: &str, body: &Value) -> Value {
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        let (status, answer) = exchange(&self.address, method, path, body.as_bytes()).expect("chromedriver answers");
        let json = answer
            .find('{')
            .and_then(|start| serde_json::from_str::<Value>(&answer[start..answer.rfind('}')? + 1]).ok())
            .unwrap_or(Value::Null);
        assert_eq!(status, 200, "{method} {path}: {answer}");
        json["value"].clone()
    }

    fn session_call(&self, method: &str, path: &str, body: &Value) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    fn open(&self, url: &str) {
        self.session_call("POST", "/url", &json!({"url": url}));
    }

    fn run(&self, script: &str) -> Value {
        self.session_call("POST", "/execute/sync", &json!({"script": script, "args": []}))
    }

    fn text(&self, selector: &str) -> String {
        let script = format!("const e=document.querySelector({selector:?});return e?e.innerText:'';");
        self.run(&script).as_str().unwrap_or_default().to_string()
    }

    /// A PNG of the window, saved where a person can find it.
    fn screenshot(&self, name: &str) -> std::path::PathBuf {
        use base64::Engine;
        let shot = self.session_call("GET", "/screenshot", &Value::Null);
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot.as_str().unwrap_or_default())
            .expect("a PNG");
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
        std::fs::write(&path, png).expect("screenshot saved");
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let path = format!("/session/{}", self.session);
        let _ = exchange(&self.address, "DELETE", &path, b"");
    }
}

/// `gitcanary dashboard` on a free port, for the scenario's namespace.
fn dashboard(scenario: &Scenario) -> (Killed, String) {
    let mut child = support::agent::gitcanary()
        .args([
            "dashboard",
            "--listen",
            "127.0.0.1:0",
            "-n",
            &scenario.ns,
            "--github-repo",
            "acme/apps",
            "--allow-actions",
        ])
        .args(["--kubeconfig", &support::kubeconfig().display().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the dashboard runs");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the dashboard says where it listens");
    let url = line
        .trim()
        .strip_prefix("dashboard: ")
        .expect("dashboard: URL")
        .to_string();
    (Killed(child), url)
}

const STRATEGY: &str = "  strategy:
    canary:
      steps:
      - {replicas: 1, pause: {duration: 1}}
      - {replicas: 2, pause: {}}
      - {replicas: 2}
";

#[tokio::test]
async fn the_release_page_shows_a_paused_release_follows_a_promote_live_and_aborts_by_its_button() {
    let scenario = Scenario::new("dashboard").await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    let secret =
        serde_json::from_value(json!({"metadata": {"name": "echo-db"}, "stringData": {"password": SECRET_VALUE}}))
            .expect("a Secret");
    secrets
        .create(&Default::default(), &secret)
        .await
        .expect("a Secret in the app's namespace");
    support::agent::write_echo_app(&scenario.repo, &scenario.ns, "1.0", STRATEGY);
    scenario.repo.commit_and_push("echo 1.0");
    let agent_dashboard = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .to_string();
    let _agent = AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &["--dashboard-listen", &agent_dashboard],
        &[],
    );
    let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    let state = || async {
        let status = rollouts.get_opt("echo").await.ok()??.status?;
        let step = status.canary_status.as_ref().map_or(0, |c| c.current_step_index);
        Some((status.phase, step))
    };
    eventually("healthy on 1.0", WAIT, || async {
        (state().await?.0 == Phase::Healthy).then_some(())
    })
    .await;
    support::agent::write_echo_app(&scenario.repo, &scenario.ns, "2.0", STRATEGY);
    let two = scenario.repo.commit_and_push("echo 2.0");
    eventually("paused at step 2", WAIT, || async {
        (state().await? == (Phase::Paused, 2)).then_some(())
    })
    .await;

    let (_dashboard, url) = dashboard(&scenario);
    let page_url = format!("{url}rollouts/{}/echo", scenario.ns);
    let browser = Browser::start();
    browser.open(&page_url);
    let steps = browser.text("#steps");
    assert!(
        steps.contains("passed") && steps.contains("now: StepPaused"),
        "the timeline: {steps}"
    );
    assert!(
        browser.text("#summary").contains("step 2 of 3"),
        "{}",
        browser.text("#summary")
    );
    let pods = browser.text("#pods");
    assert!(
        pods.contains("batch 1") && pods.contains("batch 2"),
        "each batch's pods: {pods}"
    );
    assert!(pods.contains("ready") && !pods.contains("not ready"), "{pods}");
    let gate = browser.run("const a=document.querySelector('#gate');return a?a.href:'';");
    let gate = gate.as_str().unwrap_or_default();
    assert!(
        gate.starts_with("https://github.com/acme/apps/pulls")
            && gate.contains(&format!("gitcanary/promote/{}/echo/", scenario.ns)),
        "the promotion pull request's link: {gate}"
    );
    assert!(
        browser.text("#versions").contains(&two[..7]),
        "{}",
        browser.text("#versions")
    );
    assert!(
        browser
            .run("return document.querySelector('svg#traffic-chart')!==null")
            .as_bool()
            .unwrap_or(false)
    );
    let shot = browser.screenshot("dashboard-release-paused.png");
    println!("the release page at its pause: {}", shot.display());

    // Marked now: a reload would lose it.
    browser.run("window.notReloaded = true; return true;");
    let (code, _, stderr) = scenario.run_cli(&["promote", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    eventually("the release past step 2", WAIT, || async {
        (state().await?.1 >= 3).then_some(())
    })
    .await;
    let seen = Instant::now();
    loop {
        let summary = browser.text("#summary");
        if summary.contains("step 3 of 3") || summary.starts_with("Healthy") {
            break;
        }
        assert!(
            seen.elapsed() < Duration::from_secs(2),
            "the page still reads {summary:?} 2 s after the Rollout moved on"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        browser.run("return window.notReloaded === true;"),
        json!(true),
        "changed without a reload"
    );

    // The page's buttons: a post without its token, or for a step the
    // release has left, sends nothing; the Abort button does.
    eventually("2.0 promoted", WAIT, || async {
        (state().await?.0 == Phase::Healthy).then_some(())
    })
    .await;
    support::agent::write_echo_app(&scenario.repo, &scenario.ns, "3.0", STRATEGY);
    let three = scenario.repo.commit_and_push("echo 3.0");
    eventually("3.0 paused at step 2", WAIT, || async {
        (state().await? == (Phase::Paused, 2)).then_some(())
    })
    .await;
    let token = eventually("the page's buttons for 3.0", WAIT, || async {
        let script = "const f=document.querySelector('#abort');return f?f.form.csrf.value+' '+f.form.commit.value:'';";
        let found = browser.run(script).as_str().unwrap_or_default().to_string();
        found
            .ends_with(&three)
            .then(|| found.split(' ').next().unwrap_or_default().to_string())
    })
    .await;
    let address = url.trim_start_matches("http://").trim_end_matches('/');
    let path = |action: &str| format!("/rollouts/{}/echo/{action}", scenario.ns);
    assert_eq!(
        post(address, &path("abort"), &format!("csrf=guess&commit={three}&step=2")),
        403
    );
    assert_eq!(
        post(
            address,
            &path("promote"),
            &format!("csrf={token}&commit={three}&step=1")
        ),
        409,
        "a stale page's promote"
    );
    let annotations = rollouts
        .get("echo")
        .await
        .expect("the Rollout")
        .metadata
        .annotations
        .unwrap_or_default();
    assert!(
        !annotations.contains_key("gitcanary.io/abort")
            && annotations
                .get("gitcanary.io/promote")
                .is_none_or(|p| !p.contains(&three[..7])),
        "nothing sent: {annotations:?}"
    );
    browser.run("document.querySelector('#abort').click(); return true;");
    let aborted = eventually("3.0 aborted from the page", WAIT, || async {
        let status = rollouts.get_opt("echo").await.ok()??.status?;
        let message = status.canary_status?.message;
        message.contains("aborted by the dashboard").then_some(message)
    })
    .await;
    assert!(aborted.contains("traffic is back on stable"), "{aborted}");

    // A name rebound to 127.0.0.1 gets nothing; a page may not be framed.
    let rebound = {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(address).expect("connects");
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
            .expect("sent");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer
    };
    assert!(rebound.starts_with("HTTP/1.1 421"), "another host's request: {rebound}");

    // The list page: a failed Rollout first, whatever its name (echo is
    // back on stable once its revert is synced).
    eventually("3.0 reverted in Git and synced", WAIT, || async {
        (state().await?.0 == Phase::Healthy).then_some(())
    })
    .await;
    let broken: Rollout = serde_json::from_value(json!({
        "apiVersion": "gitcanary.io/v1alpha1", "kind": "Rollout", "metadata": {"name": "zzz-broken"},
        "spec": {"workloadRef": {"kind": "Deployment", "name": "gone"}, "strategy": {"canary": {"steps": []}}}
    }))
    .expect("a Rollout");
    rollouts
        .create(&Default::default(), &broken)
        .await
        .expect("a Rollout made by hand");
    let failed = json!({"status": {"phase": "Failed", "canaryStatus": {
        "canaryReadyReplicas": 0, "currentStepIndex": 1, "currentStepState": "StepUpgrade", "message": "broken on purpose"
    }}});
    rollouts
        .patch_status(
            "zzz-broken",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&failed),
        )
        .await
        .expect("its status");
    browser.open(&url);
    let first = browser.text("tbody tr");
    assert!(
        first.starts_with(&format!("{}/zzz-broken", scenario.ns)) && first.contains("Failed"),
        "first row: {first}"
    );

    // Nothing a page shows comes from a Secret: the CLI's dashboard's
    // pages, and the agent's (--dashboard-listen).
    let cli_dashboard = url.trim_start_matches("http://").trim_end_matches('/');
    for (address, path) in [cli_dashboard, &agent_dashboard].into_iter().flat_map(|address| {
        [
            (address, "/".to_string()),
            (address, format!("/rollouts/{}/echo", scenario.ns)),
        ]
    }) {
        let (status, html) = support::http(address, "GET", &path, &[], b"").expect("the dashboard answers");
        assert_eq!(status, 200, "{path}");
        assert!(html.contains("echo"), "{path}: {html}");
        assert!(
            !html.contains(SECRET_VALUE) && !html.contains("ZG8tbm90LXNob3ctaHVudGVyMg"),
            "{path} shows a Secret"
        );
    }
}

/// A form's post, as another page or a script would send it.
fn post(address: &str, path: &str, form: &str) -> u16 {
    let headers = [("Content-Type", "application/x-www-form-urlencoded")];
    support::http(address, "POST", path, &headers, form.as_bytes())
        .expect("the dashboard answers")
        .0
}
