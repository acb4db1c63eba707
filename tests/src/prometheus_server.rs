//! A real Prometheus server for the end-to-end tests (Debian package `prometheus`): started on
//! a free loopback port with its own temp dir and a scrape config for one target, queried
//! through its HTTP API, killed and cleaned up on drop.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The Prometheus binary the tests run.
pub const PROMETHEUS: &str = "prometheus";

/// Whether `prometheus` can be run (the end-to-end tests skip, saying so, when it cannot).
#[must_use]
pub fn prometheus_on_path() -> bool {
    Command::new(PROMETHEUS).arg("--version").output().is_ok()
}

/// Fails the calling test when no Prometheus server is on `PATH`. The tests that need one are
/// `#[ignore]`d, so they run only under `cargo xtask test`, which installs it: there a missing
/// server is a failure, never a silent pass.
///
/// # Panics
/// When `prometheus` is not on `PATH`.
pub fn require_prometheus() {
    assert!(
        prometheus_on_path(),
        "prometheus is not on PATH: install the Debian package `prometheus` (`cargo xtask test` \
         does when it is missing)"
    );
}

/// One HTTP/1.0 GET on `addr`: (status line, head, body).
///
/// # Errors
/// The I/O error's text.
pub fn http_get(addr: SocketAddr, target: &str) -> Result<(String, String, String), String> {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {target} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| e.to_string())?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).map_err(|e| e.to_string())?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.lines().next().unwrap_or("").to_owned();
    Ok((status, head.to_owned(), body.to_owned()))
}

/// `s` percent-encoded for a URL query value (unreserved characters kept).
#[must_use]
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn free_loopback_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// A running Prometheus server.
#[derive(Debug)]
pub struct PrometheusServer {
    child: Child,
    dir: PathBuf,
    addr: SocketAddr,
}

impl PrometheusServer {
    /// Starts Prometheus scraping `/metrics` of `target` every `scrape_interval_s` seconds as
    /// job `job`.
    ///
    /// # Errors
    /// Why it could not be started (the temp dir, the port, or the binary).
    pub fn start(target: SocketAddr, job: &str, scrape_interval_s: u32) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!(
            "kvtier-prometheus-{}-{}",
            std::process::id(),
            target.port()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: {scrape_interval_s}s\n  evaluation_interval: \
                 {scrape_interval_s}s\nscrape_configs:\n  - job_name: {job}\n    \
                 static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .map_err(|e| e.to_string())?;
        let addr: SocketAddr = format!("127.0.0.1:{}", free_loopback_port()?)
            .parse()
            .map_err(|e| format!("{e}"))?;
        let log = std::fs::File::create(dir.join("prometheus.log")).map_err(|e| e.to_string())?;
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("{PROMETHEUS}: {e}"))?;
        Ok(PrometheusServer { child, dir, addr })
    }

    /// Where its HTTP API listens.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its log so far (for failure messages).
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// Whether its HTTP API accepts connections yet.
    #[must_use]
    pub fn is_up(&self) -> bool {
        TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)).is_ok()
    }

    /// The result vector of the instant query `expr` (`/api/v1/query`).
    ///
    /// # Errors
    /// The status line or the body when the query did not succeed.
    pub fn query(&self, expr: &str) -> Result<Vec<serde_json::Value>, String> {
        let target = format!("/api/v1/query?query={}", percent_encode(expr));
        let (status, _, body) = http_get(self.addr, &target)?;
        if !status.contains(" 200 ") {
            return Err(format!("{status}: {body}"));
        }
        let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        match v["data"]["result"].as_array() {
            Some(r) if v["status"] == "success" => Ok(r.clone()),
            _ => Err(format!("unexpected answer: {body}")),
        }
    }

    /// The value of the first series of the instant query `expr`, if it has one.
    #[must_use]
    pub fn value(&self, expr: &str) -> Option<f64> {
        let r = self.query(expr).ok()?;
        r.first()?["value"][1].as_str()?.parse().ok()
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
