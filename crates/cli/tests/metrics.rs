//! Prometheus metrics of every daemon, scraped over real sockets: `haul serve --metrics`,
//! `haul node serve --metrics` and the metadata server's `/metrics`. Each page is checked with
//! `promtool check metrics` (Prometheus's own parser and linter; scripts/test.sh installs it)
//! and by the values that must be in it after known transfers. The listener is attacked too:
//! other methods, other paths, garbage.

mod common;

use common::grid::{Grid, enrolment_line};
use common::wait_for;
use common::{http_get, http_request, promtool_check, sample};
use std::time::Duration;

/// `promtool check metrics` on `text`, or the test is skipped where promtool is missing.
#[track_caller]
fn assert_promtool_accepts(text: &str) -> bool {
    match promtool_check(text) {
        Ok(true) => true,
        Ok(false) => {
            testkit::skip("promtool (Debian package prometheus) is not installed");
            false
        }
        Err(e) => panic!("{e}"),
    }
}

/// An upload and a download through `haul serve --metrics`: the endpoint counts one file and
/// its bytes received, one sent, two sessions that ended well, none running; every family has
/// HELP and TYPE and promtool accepts the page. Anything but `GET /metrics` is refused.
#[test]
fn serve_counts_files_bytes_and_sessions_by_direction() {
    let dir = tempfile::tempdir().unwrap();
    let ep = common::serve(
        &dir.path().join("root"),
        &["--insecure", "--metrics", "127.0.0.1:0"],
        &[],
    );
    let metrics = ep
        .metrics
        .clone()
        .expect("--print-addr prints the metrics URL");
    let src = dir.path().join("data.bin");
    let data: Vec<u8> = (0..1_500_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    let out = common::haul()
        .args(["cp", "--insecure", "--progress", "never"])
        .arg(&src)
        .arg(ep.url("data.bin"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let back = dir.path().join("back.bin");
    let out = common::haul()
        .args(["cp", "--insecure", "--progress", "never"])
        .arg(ep.url("data.bin"))
        .arg(&back)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::read(&back).unwrap(), data);

    // The endpoint counts a session when it ends, which may come just after the client's exit.
    let mut text = String::new();
    let settled = wait_for(Duration::from_secs(10), || {
        text = http_get(&metrics, "/metrics");
        let r = sample(
            &text,
            "haul_sessions_total{direction=\"send\",result=\"ok\"}",
        ) == Some(1.0)
            && sample(
                &text,
                "haul_sessions_total{direction=\"receive\",result=\"ok\"}",
            ) == Some(1.0);
        if !r {
            std::thread::sleep(Duration::from_millis(100));
        }
        r
    });
    assert!(settled, "sessions not counted:\n{text}");
    let size = data.len() as f64;
    for (series, value) in [
        ("haul_transfer_bytes_total{direction=\"receive\"}", size),
        ("haul_transfer_bytes_total{direction=\"send\"}", size),
        (
            "haul_transfer_files_total{direction=\"receive\",result=\"done\"}",
            1.0,
        ),
        (
            "haul_transfer_files_total{direction=\"send\",result=\"done\"}",
            1.0,
        ),
        (
            "haul_transfer_file_size_bytes_sum{direction=\"receive\"}",
            size,
        ),
        (
            "haul_transfer_file_duration_seconds_count{direction=\"send\"}",
            1.0,
        ),
        ("haul_sessions_active{direction=\"receive\"}", 0.0),
        ("haul_sessions_active{direction=\"send\"}", 0.0),
        ("haul_connections_refused_total", 0.0),
    ] {
        assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
    }
    assert!(text.contains("haul_build_info{version=\""), "{text}");
    // Data streams count while their session runs: three for an upload held at 4 Mbit/s
    // (about 3 s), none after it.
    for d in ["send", "receive"] {
        assert_eq!(
            sample(&text, &format!("haul_streams_active{{direction=\"{d}\"}}")),
            Some(0.0),
            "{text}"
        );
    }
    let mut held = common::haul()
        .args([
            "cp",
            "--insecure",
            "--progress",
            "never",
            "-p",
            "3",
            "--rate",
            "4M",
        ])
        .arg(&src)
        .arg(ep.url("held.bin"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let receiving = |want: f64| {
        wait_for(Duration::from_secs(15), || {
            let t = http_get(&metrics, "/metrics");
            let r = sample(&t, "haul_streams_active{direction=\"receive\"}") == Some(want);
            if !r {
                std::thread::sleep(Duration::from_millis(50));
            }
            r
        })
    };
    assert!(receiving(3.0), "three streams never counted");
    assert!(held.wait().unwrap().success());
    assert!(receiving(0.0), "streams still counted after the upload");
    for name in ["haul_transfer_bytes_total", "haul_tcp_retransmits_total"] {
        assert!(text.contains(&format!("# HELP {name} ")), "{name}: {text}");
        assert!(
            text.contains(&format!("# TYPE {name} counter")),
            "{name}: {text}"
        );
    }
    if !assert_promtool_accepts(&text) {
        return;
    }

    // Only GET (and HEAD) of /metrics; garbage gets a 400 and the connection closes.
    let (status, _) = http_request(
        &metrics,
        "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(status, 405);
    let (status, body) = http_request(&metrics, "GET /etc/passwd HTTP/1.0\r\n\r\n");
    assert_eq!(status, 404, "{body}");
    let (status, _) = http_request(&metrics, "\x16\x03\x01garbage\r\n\r\n");
    assert_eq!(status, 400);
    // The data port is still serving.
    let out = common::haul()
        .args(["cp", "--insecure", "--progress", "never"])
        .arg(ep.url("data.bin"))
        .arg(dir.path().join("again.bin"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// A grid with a fifth node at a site whose name holds a quote and a backslash: the metadata
/// server's page and the node's own escape them (a page that did not would be rejected whole
/// by Prometheus), carry the node and site as labels, time catalog operations, and count a
/// replication by site pair.
#[test]
fn grid_metrics_escape_labels_and_count_replication_by_site_pair() {
    let mut g = Grid::start();
    let issued = g.issue(&["--host", "q1", "--host", "127.0.0.1", "--out", "q1"]);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(g.pki("enrolled-nodes"))
            .unwrap();
        writeln!(f, "{}", enrolment_line(&issued)).unwrap();
    }
    let site = "x\"y\\z";
    let escaped = "x\\\"y\\\\z";
    let mut q1 = g.new_node("q1", site);
    g.start_node_with(&mut q1, "q1", &["--metrics", "127.0.0.1:0"]);
    let node_metrics = q1.metrics.clone().expect("the node prints its metrics URL");
    g.nodes.push(q1);
    g.wait_nodes_up(0);

    // A file written at the odd site, then a copy at site B.
    let src = g.path().join("m.bin");
    std::fs::write(&src, vec![7u8; 300_000]).unwrap();
    g.ok("alice", &["mkdir", "/alice"]);
    let out = g.cp(
        "alice",
        &[
            "--site",
            site,
            src.to_str().unwrap(),
            &g.url("/alice/m.bin"),
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let out = g.ok(
        "alice",
        &[
            "replicate",
            "--copies",
            "2",
            "--site",
            "B",
            "--progress",
            "never",
            "/alice/m.bin",
        ],
    );
    // The summary counts in words that agree with the numbers.
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("1 file: 1 copy made ("), "{said}");

    let text = g.http_get("/metrics");
    let node_up = format!("haul_node_up{{node=\"q1\",site=\"{escaped}\"}}");
    assert_eq!(sample(&text, &node_up), Some(1.0), "{node_up} in\n{text}");
    assert_eq!(
        sample(
            &text,
            &format!(
                "haul_replication_files_total{{from_site=\"{escaped}\",to_site=\"B\",result=\"done\"}}"
            )
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            &format!("haul_replication_bytes_total{{from_site=\"{escaped}\",to_site=\"B\"}}")
        ),
        Some(300_000.0),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("haul_meta_rpc_duration_seconds_count{op=")),
        "{text}"
    );
    assert!(text.contains("# TYPE haul_meta_rpc_duration_seconds histogram"));
    assert!(text.contains("# TYPE haul_reconcile_under_replicated_files gauge"));
    if !assert_promtool_accepts(&text) {
        return;
    }

    // The node's own page: its families under its name and site.
    let text = http_get(&node_metrics, "/metrics");
    let received = format!(
        "haul_transfer_files_total{{node=\"q1\",site=\"{escaped}\",direction=\"receive\",result=\"done\"}}"
    );
    assert_eq!(sample(&text, &received), Some(1.0), "{received} in\n{text}");
    assert!(
        text.contains(&format!(
            "haul_build_info{{node=\"q1\",site=\"{escaped}\",version=\""
        )),
        "{text}"
    );
    if !assert_promtool_accepts(&text) {
        return;
    }
    prometheus_scrapes(&g, &[&g.meta_http, &node_metrics]);
}

/// A real Prometheus (Debian's) scrapes `targets` every second: each becomes healthy, and
/// a query for the nodes' state answers for every node of the grid.
fn prometheus_scrapes(g: &Grid, targets: &[&str]) {
    let Ok(version) = std::process::Command::new("prometheus")
        .arg("--version")
        .output()
    else {
        testkit::skip!("prometheus (Debian package prometheus) is not installed");
    };
    assert!(version.status.success(), "{version:?}");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let web = format!("127.0.0.1:{port}");
    let config = g.path().join("prometheus.yml");
    let list: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: haul\n    static_configs:\n      - targets: [{}]\n",
            list.join(", ")
        ),
    )
    .unwrap();
    let mut cmd = std::process::Command::new("prometheus");
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            g.path().join("prometheus-data").display()
        ))
        .arg(format!("--web.listen-address={web}"));
    let log = g.path().join("prometheus.log");
    let _prometheus = harness::process::Proc::spawn(cmd, &log).expect("start prometheus");
    let mut health = String::new();
    let all_up = wait_for(Duration::from_secs(60), || {
        std::thread::sleep(Duration::from_millis(500));
        let (status, body) = http_request(
            &web,
            &format!("GET /api/v1/targets HTTP/1.0\r\nHost: {web}\r\n\r\n"),
        );
        if status != 200 {
            return false;
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) else {
            return false;
        };
        let active = v["data"]["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        health = format!("{active:?}");
        active.len() == targets.len() && active.iter().all(|t| t["health"] == "up")
    });
    assert!(
        all_up,
        "Prometheus did not scrape every target: {health}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let (status, body) = http_request(
        &web,
        &format!("GET /api/v1/query?query=haul_node_up HTTP/1.0\r\nHost: {web}\r\n\r\n"),
    );
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let series = v["data"]["result"].as_array().cloned().unwrap_or_default();
    let mut nodes: Vec<String> = series
        .iter()
        .map(|s| s["metric"]["node"].as_str().unwrap_or_default().to_string())
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["a1", "a2", "b1", "b2", "q1"], "{body}");
    let q1 = series.iter().find(|s| s["metric"]["node"] == "q1").unwrap();
    assert_eq!(
        q1["metric"]["site"], "x\"y\\z",
        "the site read back as it was: {body}"
    );
}
