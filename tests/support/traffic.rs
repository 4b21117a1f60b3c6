//! Real requests through the test gateway (Traefik, started by
//! tests/testenv/gateway-up.sh): a bounded burst that counts answers by
//! image and status, and a steady load that records every answer with its
//! time, for what a user sees during a release.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where the gateway of the test control plane listens (loopback only).
pub fn gateway_address() -> String {
    state_file("gateway-url")
}

/// Where the gateway serves its Prometheus metrics (Traefik's, with a
/// `service` label per Kubernetes Service and port).
pub fn gateway_metrics_address() -> String {
    state_file("gateway-metrics-url")
}

fn state_file(name: &str) -> String {
    let state = super::kubeconfig()
        .parent()
        .expect("the kubeconfig is in the state directory");
    let url = std::fs::read_to_string(state.join(name)).unwrap_or_else(|_| {
        panic!(
            "the test control plane in {} runs no gateway: start it with GITCANARY_TESTENV_GATEWAY=1 (scripts/test.sh does)",
            state.display()
        )
    });
    url.trim().trim_start_matches("http://").to_string()
}

/// One answer, or a request that got none.
#[derive(Debug, Clone)]
pub struct Answer {
    pub at: Instant,
    /// `None`: the request failed (connection refused or dropped, no answer).
    pub status: Option<u16>,
    /// The image of the pod that answered.
    pub image: String,
    /// The request's `x-*` headers as the pod received them, as JSON.
    pub headers: String,
}

#[derive(Debug, Default, Clone)]
pub struct Counts {
    pub by_image: BTreeMap<String, usize>,
    /// Answers by image and the `x-*` headers the pod received (JSON).
    pub by_image_and_headers: BTreeMap<(String, String), usize>,
    pub by_status: BTreeMap<u16, usize>,
    pub failed: usize,
}

impl Counts {
    pub fn of(answers: &[Answer]) -> Counts {
        let mut counts = Counts::default();
        for answer in answers {
            match answer.status {
                Some(status) => {
                    *counts.by_status.entry(status).or_default() += 1;
                    *counts.by_image.entry(answer.image.clone()).or_default() += 1;
                    let key = (answer.image.clone(), answer.headers.clone());
                    *counts.by_image_and_headers.entry(key).or_default() += 1;
                }
                None => counts.failed += 1,
            }
        }
        counts
    }

    pub fn answered(&self) -> usize {
        self.by_status.values().sum()
    }

    /// Answers from pods of `image` that received exactly the `x-*`
    /// headers `headers`.
    pub fn received(&self, image: &str, headers: &[(&str, &str)]) -> usize {
        let headers: serde_json::Map<String, serde_json::Value> = headers
            .iter()
            .map(|(n, v)| (n.to_string(), serde_json::json!(v)))
            .collect();
        let key = (image.to_string(), serde_json::Value::Object(headers).to_string());
        *self.by_image_and_headers.get(&key).unwrap_or(&0)
    }

    /// The share of answers that came from pods of `image`.
    pub fn share(&self, image: &str) -> f64 {
        let answered = self.answered();
        if answered == 0 {
            return 0.0;
        }
        *self.by_image.get(image).unwrap_or(&0) as f64 / answered as f64
    }

    /// Answers with a status other than 2xx, and requests with no answer.
    pub fn failures(&self) -> usize {
        self.failed
            + self
                .by_status
                .iter()
                .filter(|(status, _)| !(200..300).contains(*status))
                .map(|(_, n)| n)
                .sum::<usize>()
    }
}

/// A keep-alive connection to the gateway, sending requests for `host`
/// with `headers`.
struct Client {
    address: String,
    host: String,
    headers: String,
    connection: Option<BufReader<TcpStream>>,
}

impl Client {
    fn new(address: &str, host: &str) -> Client {
        Client::with_headers(address, host, &[])
    }

    fn with_headers(address: &str, host: &str, headers: &[(&str, &str)]) -> Client {
        Client {
            address: address.to_string(),
            host: host.to_string(),
            headers: headers
                .iter()
                .map(|(name, value)| format!("{name}: {value}\r\n"))
                .collect(),
            connection: None,
        }
    }

    fn get(&mut self) -> Answer {
        let at = Instant::now();
        match self.try_get() {
            Ok((status, image, headers)) => Answer {
                at,
                status: Some(status),
                image,
                headers,
            },
            Err(_) => {
                self.connection = None;
                Answer {
                    at,
                    status: None,
                    image: String::new(),
                    headers: String::new(),
                }
            }
        }
    }

    fn try_get(&mut self) -> std::io::Result<(u16, String, String)> {
        if self.connection.is_none() {
            let stream = TcpStream::connect(&self.address)?;
            stream.set_read_timeout(Some(Duration::from_secs(10)))?;
            stream.set_nodelay(true)?;
            self.connection = Some(BufReader::new(stream));
        }
        let reader = self.connection.as_mut().expect("connected");
        let request = format!("GET / HTTP/1.1\r\nHost: {}\r\n{}\r\n", self.host, self.headers);
        reader.get_mut().write_all(request.as_bytes())?;
        let broken = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP answer");
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed"));
        }
        let status: u16 = line.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(broken)?;
        let (mut length, mut close) = (0usize, false);
        loop {
            line.clear();
            reader.read_line(&mut line)?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap_or((header, ""));
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().map_err(|_| broken())?,
                "connection" => close = value.trim().eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        if close {
            self.connection = None;
        }
        let body = serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_default();
        let image = body["image"].as_str().unwrap_or_default().to_string();
        Ok((status, image, body["headers"].to_string()))
    }
}

/// Sends `count` requests for `host` through the gateway, a few at a time,
/// and counts the answers; stops early after `limit`.
pub fn burst(host: &str, count: usize, limit: Duration) -> Counts {
    burst_with(host, &[], count, limit)
}

/// As [`burst`], every request with `headers`.
pub fn burst_with(host: &str, headers: &[(&str, &str)], count: usize, limit: Duration) -> Counts {
    const PARALLEL: usize = 4;
    let headers: Vec<(String, String)> = headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
    let address = gateway_address();
    let deadline = Instant::now() + limit;
    let threads: Vec<JoinHandle<Vec<Answer>>> = (0..PARALLEL)
        .map(|i| {
            let (address, host, headers) = (address.clone(), host.to_string(), headers.clone());
            let share = count / PARALLEL + usize::from(i < count % PARALLEL);
            std::thread::spawn(move || {
                let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
                let mut client = Client::with_headers(&address, &host, &headers);
                let mut answers = Vec::with_capacity(share);
                while answers.len() < share && Instant::now() < deadline {
                    answers.push(client.get());
                }
                answers
            })
        })
        .collect();
    let answers: Vec<Answer> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("a load thread"))
        .collect();
    Counts::of(&answers)
}

/// Requests for `host` sent one after another on two connections, every
/// answer recorded, until stopped.
pub struct Load {
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    pub fn start(host: &str) -> Load {
        let address = gateway_address();
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..2)
            .map(|_| {
                let (address, host) = (address.clone(), host.to_string());
                let (stop, answers) = (stop.clone(), answers.clone());
                std::thread::spawn(move || {
                    let mut client = Client::new(&address, &host);
                    while !stop.load(Ordering::Relaxed) {
                        let answer = client.get();
                        let failed = answer.status.is_none();
                        answers.lock().expect("answers").push(answer);
                        if failed {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                })
            })
            .collect();
        Load { stop, answers, threads }
    }

    /// Every answer so far.
    pub fn answers(&self) -> Vec<Answer> {
        self.answers.lock().expect("answers").clone()
    }

    pub fn stop(mut self) -> Vec<Answer> {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        self.answers()
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
