//! `/metrics` under hostile clients, on a real `MetricsServer` on 127.0.0.1 with plain std TCP
//! clients: idle sockets holding every slot, slow-loris clients trickling a head, HEAD, and a
//! server process out of file descriptors.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use kvtier::http::{MetricsServer, ServerConfig};

const BODY: &str = "# TYPE x gauge\nx 1\n";

fn server(config: ServerConfig) -> MetricsServer {
    MetricsServer::bind("127.0.0.1:0", config, || Ok(BODY.to_owned())).unwrap()
}

/// Sends `request` as it is and reads the whole response (the server closes every connection).
fn exchange(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    raw
}

/// One GET on loopback: (status line, body).
fn get(addr: SocketAddr) -> (String, String) {
    let raw = exchange(addr, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    (
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    )
}

/// Waits (bounded) until `cond` holds.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// True when the server has closed `s` (end of stream or reset), false while it is open.
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 64];
    let closed = match s.read(&mut b) {
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(_) => true,
    };
    s.set_nonblocking(false).unwrap();
    closed
}

#[test]
fn idle_sockets_holding_every_slot_do_not_blank_a_scrape() {
    let config = ServerConfig::default();
    let slots = config.max_connections;
    let idle_count = slots + 16;
    let server = server(config);
    let addr = server.local_addr();
    let mut idle: Vec<TcpStream> = (0..idle_count)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    wait_for("every idle socket accepted", || {
        server.stats().accepted == idle_count as u64
    });
    assert_eq!(server.connections(), slots);

    let asked = Instant::now();
    let (status, body) = get(addr);
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(body, BODY);
    // Liveness, not speed: answered before the idle sockets' own head deadline.
    assert!(asked.elapsed() < config.head_deadline);

    // Room was made by closing the connections idle longest: the first ones opened.
    let stats = server.stats();
    let shed = idle_count - slots + 1;
    assert_eq!(stats.shed, shed as u64);
    assert_eq!(stats.refused, 0);
    for (i, s) in idle.iter_mut().enumerate() {
        assert_eq!(closed_by_server(s), i < shed, "idle socket {i}");
    }
    server.stop();
}

#[test]
fn slow_loris_clients_are_cut_at_the_head_deadline() {
    let mut config = ServerConfig::default();
    config.head_deadline = Duration::from_millis(300);
    let server = server(config);
    let addr = server.local_addr();
    const CLIENTS: usize = 4;
    const STEP: Duration = Duration::from_millis(50);
    // Sixty bytes at one per 50 ms: 3 s, ten times the deadline.
    const MAX_BYTES: usize = 60;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            thread::spawn(move || -> (usize, Vec<u8>) {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ").unwrap();
                let mut got = Vec::new();
                for sent in 0..MAX_BYTES {
                    thread::sleep(STEP);
                    if s.write_all(b"a").is_err() {
                        return (sent, got);
                    }
                    s.set_nonblocking(true).unwrap();
                    let mut b = [0u8; 256];
                    match s.read(&mut b) {
                        Ok(0) => return (sent, got),
                        Ok(n) => {
                            got.extend_from_slice(&b[..n]);
                            return (sent, got);
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        Err(_) => return (sent, got),
                    }
                    s.set_nonblocking(false).unwrap();
                }
                (MAX_BYTES, got)
            })
        })
        .collect();
    for c in clients {
        let (sent, got) = c.join().unwrap();
        assert!(
            sent < MAX_BYTES,
            "a client trickling a byte every {STEP:?} was never cut"
        );
        // What it read of the answer, if anything before the close, is a 408.
        let got = String::from_utf8_lossy(&got);
        assert!(got.is_empty() || got.starts_with("HTTP/1.1 408 "), "{got}");
    }
    assert_eq!(server.stats().head_timeouts, CLIENTS as u64);
    assert_eq!(get(addr).0, "HTTP/1.1 200 OK");
    server.stop();
}

#[test]
fn head_answers_like_get_without_the_body() {
    let server = server(ServerConfig::default());
    let addr = server.local_addr();
    let got = exchange(addr, "GET /metrics HTTP/1.1\r\n\r\n");
    let (get_head, get_body) = got.split_once("\r\n\r\n").unwrap();
    assert_eq!(get_body, BODY);
    assert!(
        get_head.contains(&format!("\r\nContent-Length: {}\r\n", BODY.len())),
        "{get_head}"
    );
    let head = exchange(addr, "HEAD /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(head, format!("{get_head}\r\n\r\n"));

    let missing = exchange(addr, "HEAD /nope HTTP/1.1\r\n\r\n");
    assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");
    assert!(missing.ends_with("\r\n\r\n"), "HEAD got a body: {missing}");
    let post = exchange(addr, "POST /metrics HTTP/1.1\r\n\r\n");
    assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
    assert!(post.contains("\r\nAllow: GET, HEAD\r\n"), "{post}");
    server.stop();
}

#[test]
fn deadlines_too_far_for_an_instant_mean_no_deadline() {
    let mut config = ServerConfig::default();
    config.head_deadline = Duration::MAX;
    config.io_timeout = Duration::MAX;
    let server = server(config);
    assert_eq!(
        get(server.local_addr()),
        ("HTTP/1.1 200 OK".to_owned(), BODY.to_owned())
    );
    server.stop();
}

const CHILD_ENV: &str = "KVTIER_HTTP_FD_CHILD";
const FD_TEST: &str = "out_of_file_descriptors_the_accept_loop_sleeps_then_recovers";

/// `test`'s name as the harness lists it: the path of this module in the test binary, then the
/// name (a child process re-runs exactly that test).
fn harness_name(test: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{test}"),
        None => test.to_owned(),
    }
}

/// The child's side: serve with few descriptors, print the address, answer `stats` on stdin
/// with the server's counters, end when stdin closes.
fn fd_child() {
    let mut config = ServerConfig::default();
    // Nothing frees a descriptor while the parent holds its clients.
    config.head_deadline = Duration::from_secs(60);
    let server = server(config);
    println!("KVTIER_ADDR={}", server.local_addr());
    for line in std::io::stdin().lines() {
        if line.unwrap().trim() == "stats" {
            let s = server.stats();
            println!("KVTIER_STATS {} {}", s.accepted, s.accept_backoffs);
        }
    }
    server.stop();
}

/// Kills and reaps the child however the test ends.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// utime + stime of process `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces): state is the first, utime the
    // 12th, stime the 13th.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

#[cfg(target_os = "linux")]
#[test]
fn out_of_file_descriptors_the_accept_loop_sleeps_then_recovers() {
    if std::env::var_os(CHILD_ENV).is_some() {
        fd_child();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 40 && exec \"$0\" \"$@\"")
        .arg(&exe)
        .args([
            "--exact",
            harness_name(FD_TEST).as_str(),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Reaper(child);
    let pid = child.0.id();
    let mut stdin = child.0.stdin.take().unwrap();
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let mut next_value = |prefix: &str| -> String {
        loop {
            let line = lines.next().expect("the child ended").unwrap();
            // The harness may have begun the line ("test … ... ").
            if let Some(at) = line.find(prefix) {
                return line[at + prefix.len()..].to_owned();
            }
        }
    };
    let addr: SocketAddr = next_value("KVTIER_ADDR=").parse().unwrap();
    let mut stats = || -> (u64, u64) {
        writeln!(stdin, "stats").unwrap();
        let v = next_value("KVTIER_STATS ");
        let (a, b) = v.split_once(' ').unwrap();
        (a.parse().unwrap(), b.parse().unwrap())
    };

    // Far more clients than 40 descriptors hold; those not accepted wait in the backlog.
    let clients: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap())
        .collect();
    wait_for("accept failing for want of descriptors", || stats().1 > 0);
    let (accepted, _) = stats();
    assert!(
        accepted < 40,
        "only {accepted} of 100 fit in 40 descriptors"
    );

    // Saturated for 2 s: the accept thread sleeps between attempts instead of spinning.
    let ticks = clock_ticks_per_second();
    let (t0, wall) = (cpu_ticks(pid), Instant::now());
    thread::sleep(Duration::from_secs(2));
    let (used, elapsed) = (cpu_ticks(pid) - t0, wall.elapsed());
    let budget = elapsed.as_secs_f64() * ticks as f64 / 10.0;
    assert!(
        (used as f64) < budget,
        "the saturated server used {used} CPU ticks in {elapsed:?} (a spinning accept loop)"
    );

    // Once the clients go, the descriptors come back and a scrape is answered.
    drop(clients);
    let (status, body) = get(addr);
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(body, BODY);
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the child did not stop");
        thread::sleep(Duration::from_millis(20));
    }
}
