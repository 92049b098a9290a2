//! The metadata server's dashboard in a real browser (headless Chromium), against a grid of
//! real processes on loopback (see `grid.rs`). In a test binary of its own: Chromium takes
//! both cores for seconds, which the grid tests' heartbeat timeouts should not share.

mod common;
use common::grid::*;
use common::*;
use std::path::Path;
use std::time::Duration;

/// A GET of `path` on `addr` with an optional cookie.
fn http_get(addr: &str, path: &str, cookie: Option<&str>) -> harness::http::Reply {
    harness::http::get(addr, path, cookie, Duration::from_secs(20)).unwrap()
}

/// Headless Chromium: signs in with `login` (a link from `haul dashboard`) and loads `page`
/// (a path of the dashboard); returns the page's DOM once loaded and what its console said.
/// With `HAUL_SCREENSHOTS` naming a directory, also saves `SHOT.png` of the page there.
fn browse(login: &str, page: &str, shot: &str) -> (String, String) {
    let profile = tempfile::tempdir().unwrap();
    let chromium = || {
        let mut c = std::process::Command::new("chromium");
        c.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=3000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()));
        c
    };
    let next: String = page
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let mut dump = chromium();
    dump.arg("--dump-dom").arg(format!("{login}&next={next}"));
    let out = run_bounded(dump, Duration::from_secs(90));
    let console: String = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .collect::<Vec<_>>()
        .join("\n");
    if let Some(dir) = std::env::var_os("HAUL_SCREENSHOTS").filter(|_| !shot.is_empty()) {
        // The same profile keeps the session cookie.
        let base = login.split("/login").next().unwrap();
        let mut s = chromium();
        s.arg("--window-size=1400,1600")
            .arg(format!(
                "--screenshot={}",
                Path::new(&dir).join(format!("{shot}.png")).display()
            ))
            .arg(format!("{base}{page}"));
        run_bounded(s, Duration::from_secs(90));
    }
    (String::from_utf8_lossy(&out.stdout).into_owned(), console)
}

/// Issue 15 item 3: the dashboard in a real browser (headless Chromium). A user signs in with
/// a link from `haul dashboard` (their certificate, over gRPC); the overview shows a
/// replication in flight in the live table, the throughput chart has a data point per
/// transfer's minute, failures name their reason, the per-transfer page lists each file's
/// node, and the console has no errors. Sign-in links work once; pages other than the public
/// overview need a session; another user sees none of alice's transfers.
#[test]
fn dashboard_in_a_real_browser_shows_live_copies_charts_and_transfers() {
    if std::process::Command::new("chromium")
        .arg("--version")
        .output()
        .is_err()
    {
        testkit::skip!(
            "no chromium (Debian package chromium; scripts/test.sh installs it as root)"
        );
    }
    let mut g = Grid::start_with(&["--admin", "bob"]);
    let big = g.path().join("big.bin");
    write_file(&big, 5, 8 << 20);
    g.ok("alice", &["mkdir", "/alice"]);
    // Traced: its page plots the throughput over time.
    let trace = g.path().join("upload.trace");
    assert_ok(&g.cp(
        "alice",
        &[
            big.to_str().unwrap(),
            &g.url("/alice/big.bin"),
            "--site",
            "A",
            "--trace",
            trace.to_str().unwrap(),
        ],
    ));
    assert_exit(
        &g.cp(
            "alice",
            &[&g.url("/alice/nope"), g.path().join("x").to_str().unwrap()],
        ),
        3,
        "",
    );
    // A transfer job, done node to node by the metadata server.
    let job = g.json(
        "alice",
        &[
            "submit",
            "--json",
            "--wait",
            "/alice/big.bin",
            "/alice/big-copy.bin",
        ],
    );
    assert_eq!(job["job"]["state"], "done", "{job}");
    // Site A's nodes stall after 1 MiB of data sent: a replication to B stays in flight.
    for i in 0..g.nodes.len() {
        if g.nodes[i].site != "A" {
            continue;
        }
        let name = g.nodes[i].name.clone();
        g.restart_node_env(&name, &[("HAUL_FAULT_STALL_AFTER", "1M")]);
    }
    g.wait_nodes_up(0);
    let mut replicate = g.cmd(
        "alice",
        &[
            "replicate",
            "--copies",
            "2",
            "--site",
            "B",
            "--progress",
            "never",
            "/alice/big.bin",
        ],
    );
    replicate
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut replicating = replicate.spawn().unwrap();
    // And a client's download held at 1 Mbit/s (over a minute): it reports its progress to
    // the server.
    let mut download = g.cmd(
        "alice",
        &[
            "cp",
            "--progress",
            "never",
            "--rate",
            "1M",
            &g.url("/alice/big.bin"),
            g.path().join("held.bin").to_str().unwrap(),
        ],
    );
    download
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut downloading = download.spawn().unwrap();

    let link = |user: &str| -> String {
        let out = g.ok(user, &["dashboard"]);
        let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            url.starts_with(&format!("http://{}/login?token=", g.meta_http)),
            "{url}"
        );
        url
    };
    // A session through plain HTTP first: wait until the run shows as live.
    let first = link("alice");
    let path = first.split_once(&g.meta_http).unwrap().1.to_string();
    let signed = http_get(&g.meta_http, &path, None);
    assert_eq!(signed.status, 303, "{}", signed.head);
    let cookie = signed
        .set_cookie()
        .unwrap_or_else(|| panic!("no cookie: {}", signed.head));
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_string();
    // The same link again is refused; pages need a session; a forged cookie is no session.
    let again = http_get(&g.meta_http, &path, None);
    assert_eq!(again.status, 401);
    assert!(again.body.contains("used already"), "{}", again.body);
    assert_eq!(http_get(&g.meta_http, "/transfers", None).status, 401);
    assert_eq!(
        http_get(&g.meta_http, "/transfers/1", Some("haul_session=00.00")).status,
        401
    );
    let public = http_get(&g.meta_http, "/", Some("haul_session=garbage")).body;
    assert!(
        public.contains("not signed in") && !public.contains("/alice/big.bin"),
        "{public}"
    );
    let mut overview = String::new();
    assert!(
        wait_for(Duration::from_secs(30), || {
            overview = http_get(&g.meta_http, "/", Some(&session)).body;
            overview.contains("data-kind=\"replicate\"")
                && overview.contains("data-kind=\"download\"")
        }),
        "no live run and download: {overview}"
    );
    // The same list for the command line: alice's two, an administrator sees them, another
    // user sees none.
    // Its streams and bytes show once its session has planned and sent (reports every 3 s).
    let mut live = serde_json::Value::Null;
    assert!(
        wait_for(Duration::from_secs(30), || {
            live = g.json("alice", &["transfers", "--live", "--json"]);
            live["live"].as_array().unwrap().iter().any(|c| {
                c["kind"] == "download"
                    && c["streams"].as_u64() >= Some(1)
                    && c["bytes_done"].as_u64() > Some(0)
            })
        }),
        "{live}"
    );
    let kinds: Vec<&str> = live["live"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"replicate") && kinds.contains(&"download"),
        "{live}"
    );
    let dl = live["live"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == "download")
        .unwrap();
    assert_eq!(dl["user"], "alice");
    assert_eq!(dl["bytes"], 8 << 20, "{dl}");
    assert!(dl["bits_per_second"].as_f64().unwrap() > 0.0, "{dl}");
    assert!(
        dl["source"].as_str().unwrap().ends_with("/alice/big.bin"),
        "{dl}"
    );
    let table =
        String::from_utf8_lossy(&g.ok("alice", &["transfers", "--live"]).stdout).into_owned();
    assert!(
        table.lines().any(|l| l.contains(" download ")
            && l.contains("/alice/big.bin -> ")
            && l.contains("%)")),
        "{table}"
    );
    assert_eq!(
        g.json("bob", &["transfers", "--live", "--json"])["live"]
            .as_array()
            .unwrap()
            .len(),
        kinds.len()
    );
    assert_eq!(
        g.json("runner", &["transfers", "--live", "--json"])["live"],
        serde_json::json!([])
    );

    // The browser: overview with the run in flight, the chart's points, the failure.
    let (dom, console) = browse(&link("alice"), "/", "overview");
    assert!(console.is_empty(), "console: {console}");
    assert!(dom.contains("signed in as <b>alice</b>"), "{dom}");
    let live = dom
        .split("id=\"live\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no live table: {dom}"));
    assert!(
        live.contains("data-kind=\"replicate\"") && live.contains(">alice<"),
        "{live}"
    );
    let row = live
        .split("data-kind=\"download\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no live download: {live}"))
        .split("</tr>")
        .next()
        .unwrap();
    assert!(
        row.contains("/alice/big.bin") && row.contains("of 8.0 MiB"),
        "{row}"
    );
    let hour = dom
        .split("id=\"chart-hour\"")
        .nth(1)
        .unwrap()
        .split("id=\"chart-day\"")
        .next()
        .unwrap();
    assert!(
        hour.contains("class=\"pt\"") && hour.contains("data-pair=\"client → A\""),
        "{hour}"
    );
    let jobs = dom
        .split("id=\"jobs\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no jobs table: {dom}"));
    assert!(
        jobs.contains("data-state=\"done\"") && jobs.contains("1 of 1"),
        "{jobs}"
    );
    let failures = dom
        .split("id=\"failures\"")
        .nth(1)
        .unwrap_or_else(|| panic!("{dom}"));
    assert!(failures.contains("failed: not_found"), "{failures}");

    // One transfer's page (the upload): its file, on a node of site A.
    let list = g.json("alice", &["transfers", "--json", "--kind", "upload"]);
    let id = list["transfers"][0]["id"].as_i64().unwrap();
    let (dom, console) = browse(&link("alice"), &format!("/transfers/{id}"), "transfer");
    assert!(console.is_empty(), "console: {console}");
    let files = dom
        .split("id=\"files\"")
        .nth(1)
        .unwrap_or_else(|| panic!("{dom}"));
    assert!(
        files.contains("/alice/big.bin") && (files.contains(">a1<") || files.contains(">a2<")),
        "{files}"
    );
    let plot = dom
        .split("id=\"trace\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no trace plot: {dom}"));
    let points: usize = plot
        .split("data-points=\"")
        .nth(1)
        .and_then(|p| p.split('"').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{plot}"));
    // (An upload over loopback may take under 20 ms: its trace, a sample every 10 ms, can
    // be a single point. Every point of the stored trace is plotted.)
    assert!(points >= 1, "{plot}");
    let shown = g.json("alice", &["transfers", "--id", &id.to_string(), "--json"]);
    assert_eq!(
        shown["transfer"]["trace"].as_array().unwrap().len(),
        points,
        "{shown}"
    );
    // The history with a filter.
    let (dom, console) = browse(&link("alice"), "/transfers?failed=on", "transfers");
    assert!(console.is_empty(), "console: {console}");
    assert!(dom.contains("failed: not_found"), "{dom}");
    assert_eq!(dom.matches("class=\"transfer\"").count(), 1, "{dom}");
    // Another user sees none of it; a next= elsewhere goes home.
    let (dom, _) = browse(&link("runner"), "//evil.example", "");
    assert!(
        dom.contains(&format!("signed in as <b>{TASK_ACCOUNT}</b>")) && !dom.contains("/alice/"),
        "{dom}"
    );
    assert!(dom.contains("id=\"live-none\""), "{dom}");
    assert!(dom.contains("id=\"jobs-none\""), "{dom}");
    let _ = replicating.kill();
    let _ = replicating.wait();
    // A client killed mid-copy stops reporting: after 30 s of silence its copy leaves the
    // live list and enters the history as abandoned.
    let _ = downloading.kill();
    let _ = downloading.wait();
    let mut abandoned = serde_json::Value::Null;
    assert!(
        wait_for(Duration::from_secs(60), || {
            let list = g.json(
                "alice",
                &["transfers", "--json", "--kind", "download", "--failed"],
            );
            abandoned = list["transfers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["error"]["kind"] == "cancelled")
                .cloned()
                .unwrap_or_default();
            !abandoned.is_null()
        }),
        "no abandoned download recorded"
    );
    assert!(
        abandoned["error"]["message"]
            .as_str()
            .unwrap()
            .contains("abandoned"),
        "{abandoned}"
    );
    assert!(
        !g.json("alice", &["transfers", "--live", "--json"])["live"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["kind"] == "download"),
        "the killed client's copy is still listed"
    );
}
