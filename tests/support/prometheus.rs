//! A real Prometheus (Debian's package) on a loopback port, scraping once a
//! second a small exporter whose error ratios the test sets, or the test
//! gateway's own metrics.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;

/// Serves `error_ratio{service="..."}` gauges.
#[derive(Clone)]
pub struct Exporter {
    pub addr: std::net::SocketAddr,
    ratios: Arc<Mutex<BTreeMap<String, f64>>>,
}

impl Exporter {
    pub fn start() -> Exporter {
        let ratios: Arc<Mutex<BTreeMap<String, f64>>> = Arc::default();
        let app = Router::new().route("/metrics", get(metrics)).with_state(ratios.clone());
        let addr = super::serve_on_own_thread(app, "exporter");
        Exporter { addr, ratios }
    }

    pub fn set(&self, service: &str, ratio: f64) {
        self.ratios.lock().expect("lock").insert(service.to_string(), ratio);
    }
}

async fn metrics(State(ratios): State<Arc<Mutex<BTreeMap<String, f64>>>>) -> String {
    let ratios = ratios.lock().expect("lock");
    let mut text = "# HELP error_ratio Share of requests that failed.\n# TYPE error_ratio gauge\n".to_string();
    for (service, ratio) in ratios.iter() {
        text.push_str(&format!("error_ratio{{service=\"{service}\"}} {ratio}\n"));
    }
    text
}

pub struct Prometheus {
    child: Child,
    pub url: String,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl Prometheus {
    /// Starts Prometheus scraping `exporter` every second, and waits until
    /// the first scrape is queryable.
    pub async fn start(exporter: &Exporter) -> Prometheus {
        Prometheus::scraping(&exporter.addr.to_string()).await
    }

    /// Starts Prometheus scraping `target` (`host:port`, `/metrics`) every
    /// second, and waits until the first scrape is queryable.
    pub async fn scraping(target: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("a Prometheus dir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n- job_name: app\n  static_configs:\n  - targets: ['{target}']\n"
            ),
        )
        .expect("config written");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus runs (scripts/setup.sh installs Debian's package)");
        let prometheus = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let up = format!("{}/api/v1/query?query=up", prometheus.url);
        super::eventually("Prometheus has scraped its target", Duration::from_secs(60), || async {
            let output = Command::new("curl").args(["-s", &up]).output().ok()?;
            String::from_utf8_lossy(&output.stdout).contains("\"1\"").then_some(())
        })
        .await;
        prometheus
    }

    /// Stops it, as when Prometheus goes away mid-analysis.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.stop();
    }
}
