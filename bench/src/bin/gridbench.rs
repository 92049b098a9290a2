//! haul-gridbench: benchmarks of the grid side of longhaul on loopback, each measured in this
//! run: metadata operations (creates and stats with 8 clients, batched and one at a time,
//! their latency, SQLite and PostgreSQL), a 1,000,000-file catalog (listing a 10,000-entry
//! directory, stat latency, the metadata server's memory), `haul run` scheduling overhead over
//! 1,000 files on 4 nodes, and the time a 2-copy policy takes to restore copies after one of
//! 4 nodes stops. Writes bench/results/<date>-grid.{md,json}. Run it through `bench/grid`.

use anyhow::{Context, Result, bail};
use clap::Parser;
use harness::pki::{Pki, PkiSpec};
use harness::process::Proc;
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// The haul binary (a release build).
    #[arg(long)]
    haul: PathBuf,
    /// Where results go.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Scratch directory (on disk: the catalog's speed depends on it).
    #[arg(long, default_value = "/var/tmp/haul-gridbench")]
    work: PathBuf,
    /// PostgreSQL URL for the PostgreSQL rows (bench/grid starts a private server).
    #[arg(long)]
    postgres: Option<String>,
    /// Smaller sizes (a check that everything works, not a measurement).
    #[arg(long)]
    quick: bool,
    /// Only these parts: meta, catalog, run, restore, drain, scrape, jobs (comma separated).
    #[arg(long)]
    only: Option<String>,
}

/// A child process killed on drop.
struct Grid {
    dir: PathBuf,
    haul: PathBuf,
    pki: Pki,
    meta: Option<Proc>,
    meta_addr: String,
    nodes: Vec<(String, Proc)>,
}

impl Grid {
    /// The PKI in `dir`: made once for the nodes `nodes` (then reused), the user `bench`
    /// mapped to the local account that `haul run` tasks run as.
    fn pki(dir: &Path, haul: &Path, nodes: &[&str]) -> Result<Pki> {
        if dir.join("ca/ca.pem").exists() {
            return Ok(Pki {
                dir: dir.to_path_buf(),
            });
        }
        harness::pki::ensure_account(TASK_ACCOUNT);
        let spec = PkiSpec {
            meta_hosts: vec!["meta".into(), "127.0.0.1".into()],
            nodes: nodes
                .iter()
                .map(|n| (n.to_string(), vec!["127.0.0.1".into()]))
                .collect(),
            users: vec!["bench".into(), "late".into()],
            mapfile: vec![
                ("bench".into(), TASK_ACCOUNT.into()),
                ("late".into(), "late".into()),
            ],
            groups: vec![],
        };
        Pki::create(dir, &spec, &|| Command::new(haul)).map_err(|e| anyhow::anyhow!(e))
    }

    fn start(
        dir: &Path,
        haul: &Path,
        db: Option<&str>,
        nodes: &[(&str, &str)],
        extra: &[&str],
    ) -> Result<Self> {
        let names: Vec<&str> = nodes.iter().map(|n| n.0).collect();
        let pki = Self::pki(dir, haul, &names)?;
        let mut cmd = Command::new(haul);
        harness::daemons::meta_serve(&mut cmd, &pki, "127.0.0.1:0", &dir.join("meta-data"));
        cmd.args([
            "--http",
            "127.0.0.1:0",
            "--heartbeat",
            "500ms",
            "--node-timeout",
            "3s",
            "--reconcile-every",
            "1s",
        ])
        .args(extra)
        .current_dir(dir);
        if let Some(url) = db {
            cmd.args(["--db", url]);
        }
        let (meta, line) = Proc::start(cmd, &dir.join("meta.log"), Duration::from_secs(60))
            .map_err(|e| anyhow::anyhow!(e))?;
        let meta_addr = line
            .split_whitespace()
            .next()
            .context("meta printed no address (see meta.log)")?
            .to_string();
        let mut g = Grid {
            dir: dir.to_path_buf(),
            haul: haul.to_path_buf(),
            pki,
            meta: Some(meta),
            meta_addr,
            nodes: Vec::new(),
        };
        for (n, site) in nodes {
            g.start_node(n, site)?;
        }
        if !nodes.is_empty() {
            g.wait_nodes(nodes.len())?;
        }
        Ok(g)
    }

    fn start_node(&mut self, n: &str, site: &str) -> Result<()> {
        self.start_node_with(n, site, &[])
    }

    fn start_node_with(&mut self, n: &str, site: &str, extra: &[&str]) -> Result<()> {
        let root = self.dir.join("nodes").join(n);
        std::fs::create_dir_all(&root)?;
        let mut cmd = Command::new(&self.haul);
        harness::daemons::node_serve(
            &mut cmd,
            &self.pki,
            (n, site),
            &format!("haul://{}", self.meta_addr),
            &root,
            "127.0.0.1:0",
        );
        cmd.args(["--capacity", "50G"])
            .args(extra)
            .current_dir(&self.dir);
        let node = Proc::spawn(cmd, &self.dir.join(format!("{n}.log")))?;
        self.nodes.push((n.to_string(), node));
        Ok(())
    }

    fn wait_nodes(&self, want: usize) -> Result<()> {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(30 + want as u64) {
            if let Ok(v) = self.json(&["nodes", "--json"])
                && v["nodes"]
                    .as_array()
                    .map(|a| a.iter().filter(|n| n["up"] == true).count())
                    .unwrap_or(0)
                    >= want
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!(
            "nodes did not come up within {} s (see {}/*.log)",
            30 + want,
            self.dir.display()
        )
    }

    fn cmd(&self, args: &[&str]) -> Command {
        self.cmd_as("bench", args)
    }

    fn cmd_as(&self, user: &str, args: &[&str]) -> Command {
        let mut c = Command::new(&self.haul);
        c.args(args)
            .current_dir(&self.dir)
            .env("HAUL_META", format!("haul://{}", self.meta_addr));
        self.pki.as_user(&mut c, user);
        c
    }

    fn json_as(&self, user: &str, args: &[&str]) -> Result<Value> {
        let out = self.cmd_as(user, args).output()?;
        if !out.status.success() {
            bail!(
                "haul {args:?} as {user}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(serde_json::from_str(&String::from_utf8_lossy(&out.stdout))?)
    }

    fn ok(&self, args: &[&str]) -> Result<String> {
        let out = self.cmd(args).output()?;
        if !out.status.success() {
            bail!(
                "haul {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn json(&self, args: &[&str]) -> Result<Value> {
        Ok(serde_json::from_str(&self.ok(args)?)?)
    }

    fn meta_rss_mib(&self) -> f64 {
        let pid = self.meta.as_ref().map(|p| p.id()).unwrap_or(0);
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            })
            .map(|kib| kib / 1024.0)
            .unwrap_or(0.0)
    }

    async fn client(&self) -> Result<grid::MetaClient> {
        let creds = transfer::tls::Credentials::load(&transfer::tls::CredentialPaths {
            cert: self.pki.cert("bench"),
            key: self.pki.key("bench"),
            ca: self.pki.ca(),
        })?;
        let peer = transfer::client::Peer::parse(&self.meta_addr)?;
        Ok(grid::MetaClient::connect(&peer, transfer::tls::client_config(&creds)?).await?)
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The local account `haul run` tasks run as (tasks never run as system accounts).
const TASK_ACCOUNT: &str = "haulrun";
const CLIENTS: usize = 8;
const BATCH: usize = 1000;

/// Creates `per_client` empty files under /bench/<tag>/cN with batched CreateFiles, 8 clients.
async fn batch_creates(g: &Grid, tag: &str, per_client: usize) -> Result<(f64, Vec<Vec<String>>)> {
    let c0 = g.client().await?;
    c0.mkdir(&format!("/bench/{tag}"), 0o755, true).await?;
    let mut paths = Vec::new();
    for c in 0..CLIENTS {
        let dir = format!("/bench/{tag}/c{c}");
        c0.mkdir(&dir, 0o755, true).await?;
        paths.push(
            (0..per_client)
                .map(|i| format!("{dir}/f{i:07}"))
                .collect::<Vec<_>>(),
        );
    }
    let t = Instant::now();
    let mut tasks = Vec::new();
    for p in paths.clone() {
        let m = g.client().await?;
        tasks.push(tokio::spawn(async move {
            for chunk in p.chunks(BATCH) {
                let r = m
                    .create_files(api::meta::CreateFilesRequest {
                        files: chunk
                            .iter()
                            .map(|p| api::meta::NewFile {
                                path: p.clone(),
                                size: 0,
                                mode: 0o644,
                                mtime_ns: 0,
                                private: false,
                            })
                            .collect(),
                        ..Default::default()
                    })
                    .await?;
                if !r.errors.is_empty() {
                    anyhow::bail!("create failed: {}", r.errors[0].message);
                }
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let n = (per_client * CLIENTS) as f64;
    Ok((n / t.elapsed().as_secs_f64(), paths))
}

async fn batch_stats(g: &Grid, paths: &[Vec<String>]) -> Result<f64> {
    let t = Instant::now();
    let mut tasks = Vec::new();
    for p in paths {
        let p = p.clone();
        let m = g.client().await?;
        tasks.push(tokio::spawn(async move {
            for chunk in p.chunks(BATCH) {
                let r = m.stat_many(chunk.to_vec()).await?;
                if r.results.iter().any(|x| x.entry.is_none()) {
                    anyhow::bail!("stat failed");
                }
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let n: usize = paths.iter().map(|p| p.len()).sum();
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// One operation per request, 8 clients: rate and latency (ms) p50, p99.
async fn single_ops(g: &Grid, tag: &str, per_client: usize, op: &str) -> Result<(f64, f64, f64)> {
    let c0 = g.client().await?;
    c0.mkdir(&format!("/bench/{tag}"), 0o755, true).await?;
    let t = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let m = g.client().await?;
        let (tag, op) = (tag.to_string(), op.to_string());
        if op == "create" {
            m.mkdir(&format!("/bench/{tag}/c{c}"), 0o755, true).await?;
        }
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_client);
            for i in 0..per_client {
                let t = Instant::now();
                match op.as_str() {
                    "create" => {
                        let r = m
                            .create_files(api::meta::CreateFilesRequest {
                                files: vec![api::meta::NewFile {
                                    path: format!("/bench/{tag}/c{c}/f{i:07}"),
                                    size: 0,
                                    mode: 0o644,
                                    mtime_ns: 0,
                                    private: false,
                                }],
                                ..Default::default()
                            })
                            .await?;
                        if !r.errors.is_empty() {
                            anyhow::bail!("{}", r.errors[0].message);
                        }
                    }
                    _ => {
                        m.stat(&format!("/bench/{tag}/c{c}/f{:07}", i % per_client))
                            .await?;
                    }
                }
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            Ok(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let rate = all.len() as f64 / t.elapsed().as_secs_f64();
    let p50 = pct(&mut all, 0.5);
    let p99 = pct(&mut all, 0.99);
    Ok((rate, p50, p99))
}

async fn meta_suite(g: &Grid, quick: bool) -> Result<Value> {
    let c = g.client().await?;
    c.mkdir("/bench", 0o755, true).await?;
    let per = if quick { 2_000 } else { 25_000 };
    let (create_rate, paths) = batch_creates(g, "batch", per).await?;
    let stat_rate = batch_stats(g, &paths).await?;
    let single = if quick { 200 } else { 1_000 };
    let (c1, c50, c99) = single_ops(g, "single", single, "create").await?;
    let (s1, s50, s99) = single_ops(g, "single", single, "stat").await?;
    Ok(json!({
        "files": per * CLIENTS,
        "batched_creates_per_s": create_rate,
        "batched_stats_per_s": stat_rate,
        "single_creates_per_s": c1, "single_create_p50_ms": c50, "single_create_p99_ms": c99,
        "single_stats_per_s": s1, "single_stat_p50_ms": s50, "single_stat_p99_ms": s99,
        "meta_rss_mib": g.meta_rss_mib(),
    }))
}

/// Fills the catalog to `total` files (10,000 per directory), then times a listing of one
/// 10,000-entry directory, stats, and reads the metadata server's memory.
async fn catalog_suite(g: &Grid, total: usize) -> Result<Value> {
    let c = g.client().await?;
    c.mkdir("/big", 0o755, true).await?;
    let dirs = total / 10_000;
    let t = Instant::now();
    let mut next = 0usize;
    while next < dirs {
        let mut tasks = Vec::new();
        for d in next..(next + CLIENTS).min(dirs) {
            let m = g.client().await?;
            tasks.push(tokio::spawn(async move {
                let dir = format!("/big/d{d:04}");
                m.mkdir(&dir, 0o755, true).await?;
                for b in 0..10 {
                    let files = (0..BATCH)
                        .map(|i| api::meta::NewFile {
                            path: format!("{dir}/f{:05}", b * BATCH + i),
                            size: 0,
                            mode: 0o644,
                            mtime_ns: 0,
                            private: false,
                        })
                        .collect();
                    let r = m
                        .create_files(api::meta::CreateFilesRequest {
                            files,
                            ..Default::default()
                        })
                        .await?;
                    if !r.errors.is_empty() {
                        anyhow::bail!("{}", r.errors[0].message);
                    }
                }
                Ok(())
            }));
        }
        next = (next + CLIENTS).min(dirs);
        for t in tasks {
            t.await??;
        }
    }
    let fill_s = t.elapsed().as_secs_f64();
    // Listing, through the client library and through the command line.
    let mut ls = Vec::new();
    for i in 0..5 {
        let t = Instant::now();
        let n = c.list(&format!("/big/d{:04}", i * 7 % dirs)).await?.len();
        ls.push(t.elapsed().as_secs_f64() * 1000.0);
        if n != 10_000 {
            bail!("listing gave {n} entries, not 10,000");
        }
    }
    let t = Instant::now();
    let out = g.ok(&["ls", "-l", "/big/d0001"])?;
    let cli_ls_ms = t.elapsed().as_secs_f64() * 1000.0;
    if out.lines().count() < 10_000 {
        bail!("haul ls -l listed {} lines", out.lines().count());
    }
    let mut st = Vec::new();
    for i in 0..2000usize {
        let p = format!("/big/d{:04}/f{:05}", (i * 31) % dirs, (i * 7919) % 10_000);
        let t = Instant::now();
        c.stat(&p).await?;
        st.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(json!({
        "files": dirs * 10_000,
        "fill_seconds": fill_s,
        "list_10k_p50_ms": pct(&mut ls.clone(), 0.5),
        "list_10k_max_ms": pct(&mut ls, 1.0),
        "cli_ls_l_10k_ms": cli_ls_ms,
        "stat_p50_ms": pct(&mut st.clone(), 0.5),
        "stat_p99_ms": pct(&mut st, 0.99),
        "meta_rss_mib": g.meta_rss_mib(),
    }))
}

/// Adds `records` transfer-history records (5 files each, one in 20 failed, two site pairs)
/// to the grid `catalog_suite` filled, then times `haul transfers` (whole command) with the
/// filters an operator uses, and one record in full.
async fn history_suite(g: &Grid, records: usize) -> Result<Value> {
    let t = Instant::now();
    let per_client = records.div_ceil(CLIENTS);
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let m = g.client().await?;
        tasks.push(tokio::spawn(async move {
            for i in (c * per_client)..((c + 1) * per_client).min(records) {
                let failed = i % 20 == 0;
                let files = (0..5)
                    .map(|f| api::meta::TransferFile {
                        path: format!("/big/d{:04}/f{:05}", i % 100, f),
                        bytes: 1 << 20,
                        checksum: "crc32c:0badcafe".into(),
                        error_kind: if failed && f == 0 {
                            "integrity".into()
                        } else {
                            String::new()
                        },
                        error: if failed && f == 0 {
                            "checksum mismatch".into()
                        } else {
                            String::new()
                        },
                        ..Default::default()
                    })
                    .collect();
                m.record_transfer(api::meta::RecordTransferRequest {
                    transfer: Some(api::meta::Transfer {
                        kind: if i % 2 == 0 { "upload" } else { "download" }.into(),
                        source: format!("/data/run{i}"),
                        destination: format!("haul://meta/big/d{:04}", i % 100),
                        started_ms: 0,
                        ended_ms: 1000,
                        files: 5,
                        files_failed: failed as u64,
                        bytes: 5 << 20,
                        bytes_moved: 5 << 20,
                        streams: 4,
                        error_kind: if failed {
                            "integrity".into()
                        } else {
                            String::new()
                        },
                        error: if failed {
                            "checksum mismatch".into()
                        } else {
                            String::new()
                        },
                        ..Default::default()
                    }),
                    files,
                    id: 0,
                    live_ids: vec![],
                })
                .await?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let fill_s = t.elapsed().as_secs_f64();
    let mut timed = serde_json::Map::new();
    for (label, args) in [
        ("newest_50", vec!["transfers"]),
        (
            "failed_since_1d",
            vec!["transfers", "--failed", "--since", "1d"],
        ),
        (
            "kind_download_json",
            vec!["transfers", "--kind", "download", "--json"],
        ),
        (
            "limit_10000_json",
            vec!["transfers", "--limit", "10000", "--json"],
        ),
    ] {
        let mut ms = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let out = g.ok(&args)?;
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
            if out.trim().is_empty() {
                bail!("haul {args:?} printed nothing");
            }
        }
        timed.insert(label.into(), json!(pct(&mut ms, 0.5)));
    }
    // The dashboard, signed in (a login link over gRPC, then plain HTTP as a browser would):
    // the overview (nodes, live copies, two charts from the history, failures, recent
    // transfers) and the history page.
    let login = g.client().await?.dashboard_login().await?;
    let cookie = http_get(&login.http, &login.path, None)?
        .set_cookie()
        .and_then(|c| c.split(';').next())
        .context("the dashboard set no session cookie")?
        .to_string();
    let mut pages = serde_json::Map::new();
    for (label, path) in [("overview", "/"), ("transfers", "/transfers")] {
        let mut ms = Vec::new();
        let mut size = 0;
        for _ in 0..5 {
            let t = Instant::now();
            let page = http_get(&login.http, path, Some(&cookie))?;
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
            if page.status != 200 || !page.body.contains("signed in as") {
                bail!("dashboard {path}: status {}", page.status);
            }
            size = page.body.len();
        }
        pages.insert(
            label.into(),
            json!({"p50_ms": pct(&mut ms, 0.5), "bytes": size}),
        );
    }
    let mid = (records / 2).max(1).to_string();
    let t = Instant::now();
    let out = g.ok(&["transfers", "--id", &mid])?;
    let show_ms = t.elapsed().as_secs_f64() * 1000.0;
    if !out.contains("transfer ") {
        bail!("haul transfers --id printed {out}");
    }
    Ok(json!({
        "records": records,
        "fill_seconds": fill_s,
        "records_per_s": records as f64 / fill_s.max(1e-9),
        "cli_p50_ms": timed,
        "show_one_ms": show_ms,
        "dashboard": pages,
        "meta_rss_mib": g.meta_rss_mib(),
    }))
}

/// A GET of `path` from `addr`, as a browser sends it.
fn http_get(addr: &str, path: &str, cookie: Option<&str>) -> Result<harness::http::Reply> {
    Ok(harness::http::get(
        addr,
        path,
        cookie,
        Duration::from_secs(60),
    )?)
}

fn run_suite(work: &Path, haul: &Path, files: usize) -> Result<Value> {
    let dir = work.join("run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let nodes = [("n1", "A"), ("n2", "A"), ("n3", "B"), ("n4", "B")];
    let g = Grid::start(&dir, haul, None, &nodes, &[])?;
    let src = dir.join("src");
    std::fs::create_dir_all(&src)?;
    for i in 0..files {
        std::fs::write(src.join(format!("f{i:05}")), format!("{i}\n"))?;
    }
    g.ok(&["mkdir", "/in"])?;
    g.ok(&[
        "cp",
        "-r",
        &src.to_string_lossy(),
        &format!("haul://{}/in/", g.meta_addr),
    ])?;
    // Spread the replicas over the 4 nodes as a dataset would be.
    g.ok(&[
        "replicate",
        "-r",
        "--copies",
        "2",
        "--site",
        "B",
        "--progress",
        "never",
        "/in",
    ])?;
    let mut rows = Vec::new();
    for parallel in [1u32, 4] {
        let t = Instant::now();
        let out = g
            .cmd(&[
                "run",
                "--json",
                "-P",
                &parallel.to_string(),
                "/in",
                "--",
                "true",
            ])
            .output()?;
        let wall = t.elapsed().as_secs_f64();
        if !out.status.success() {
            bail!("haul run: {}", String::from_utf8_lossy(&out.stderr));
        }
        let v: Value = serde_json::from_slice(&out.stdout)?;
        let tasks = v["tasks"].as_array().map(|a| a.len()).unwrap_or(0);
        rows.push(json!({
            "parallel": parallel,
            "tasks": tasks,
            "succeeded": v["succeeded"],
            "slots": v["slots"],
            "seconds": v["seconds"],
            "command_seconds": wall,
            "mean_task_ms": v["mean_task_ms"],
            "overhead_ms_per_task": v["overhead_ms_per_task"],
            "nodes": v["nodes"].as_array().map(|a| a.iter().map(|n| json!({"node": n["node"], "tasks": n["tasks"]})).collect::<Vec<_>>()),
        }));
    }
    Ok(json!(rows))
}

fn restore_suite(work: &Path, haul: &Path, files: usize, size: usize) -> Result<Value> {
    let dir = work.join("restore");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let nodes = [("n1", "A"), ("n2", "A"), ("n3", "B"), ("n4", "B")];
    let mut g = Grid::start(&dir, haul, None, &nodes, &[])?;
    let src = dir.join("src");
    write_files(&src, files, size)?;
    g.ok(&["mkdir", "/ds"])?;
    g.ok(&["policy", "set", "/ds", "--copies", "2"])?;
    g.ok(&[
        "cp",
        "-r",
        &src.to_string_lossy(),
        &format!("haul://{}/ds/", g.meta_addr),
    ])?;
    let uploaded_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    // A reconciler pass after the upload found nothing missing.
    let copies_ok = |g: &Grid| -> Result<bool> {
        let v = g.json(&["status", "--json"])?;
        Ok(v["last_pass_ms"].as_i64().unwrap_or(0) > uploaded_ms
            && v["under_replicated"].as_u64() == Some(0)
            && v["repairs_running"].as_u64() == Some(0))
    };
    let t = Instant::now();
    while !copies_ok(&g)? {
        if t.elapsed() > Duration::from_secs(300) {
            bail!("policy did not reach 2 copies within 300 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // The node holding the most replicas stops.
    let v = g.json(&["nodes", "--json"])?;
    let victim = v["nodes"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .max_by_key(|n| n["replicas"].as_u64().unwrap_or(0))
                .cloned()
        })
        .context("no nodes")?;
    let name = victim["name"].as_str().context("node name")?.to_string();
    let held = victim["replicas"].as_u64().unwrap_or(0);
    let idx = g
        .nodes
        .iter()
        .position(|(n, _)| *n == name)
        .context("victim")?;
    let stopped = Instant::now();
    g.nodes.remove(idx);
    // Down after --node-timeout, then copies are made until every file has 2 again.
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    };
    let mut detected: Option<(f64, i64)> = None;
    loop {
        if stopped.elapsed() > Duration::from_secs(240) {
            bail!("copies not restored within 240 s");
        }
        std::thread::sleep(Duration::from_millis(100));
        if detected.is_none() {
            let v = g.json(&["nodes", "--json"])?;
            let down = v["nodes"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|n| n["name"] == name.as_str() && n["up"] == false)
            });
            if down {
                detected = Some((stopped.elapsed().as_secs_f64(), now_ms()));
            }
            continue;
        }
        let v = g.json(&["status", "--json"])?;
        let pass_after =
            v["last_pass_ms"].as_i64().unwrap_or(0) > detected.map(|d| d.1).unwrap_or(0);
        if pass_after
            && v["under_replicated"].as_u64() == Some(0)
            && v["repairs_running"].as_u64() == Some(0)
        {
            break;
        }
    }
    let detected = detected.map(|d| d.0);
    let restored = stopped.elapsed().as_secs_f64();
    // Every file: 2 complete replicas on live nodes.
    let mut complete = 0;
    for i in 0..files {
        let w = g.ok(&["where", &format!("/ds/src/f{i:04}")])?;
        let n = w
            .lines()
            .filter(|l| {
                l.contains("complete") && l.contains(" up ") && !l.contains(&format!(" {name} "))
            })
            .count();
        if n >= 2 {
            complete += 1;
        }
    }
    Ok(json!({
        "files": files,
        "file_bytes": size,
        "node_stopped": name,
        "replicas_on_it": held,
        "node_timeout_s": 3,
        "seconds_to_detect": detected,
        "seconds_to_restore": restored,
        "files_with_2_live_copies": complete,
    }))
}

/// `files` files of `size` pseudo-random bytes in `src`, named f0000, f0001, ...
fn write_files(src: &Path, files: usize, size: usize) -> Result<()> {
    std::fs::create_dir_all(src)?;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..files {
        let mut f = std::fs::File::create(src.join(format!("f{i:04}")))?;
        let mut buf = vec![0u8; size];
        for b in buf.chunks_mut(8) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            b.copy_from_slice(&seed.to_le_bytes()[..b.len()]);
        }
        f.write_all(&buf)?;
    }
    Ok(())
}

/// Files of `paths` (grid paths) whose policy `copies=2 sites=A,B` does not hold now: fewer
/// than a complete copy at A and one at B on live nodes.
fn short_of_policy(g: &Grid, paths: &[String]) -> Result<usize> {
    let mut args = vec!["where", "--json"];
    args.extend(paths.iter().map(String::as_str));
    let v = g.json(&args)?;
    let files = v["files"].as_array().context("where --json: no files")?;
    Ok(files
        .iter()
        .filter(|f| {
            let sites: Vec<&str> = f["replicas"]
                .as_array()
                .map(|rs| {
                    rs.iter()
                        .filter(|r| r["state"] == "complete" && r["node_up"] == true)
                        .filter_map(|r| r["site"].as_str())
                        .collect()
                })
                .unwrap_or_default();
            !(sites.contains(&"A") && sites.contains(&"B"))
        })
        .count())
}

/// Issue 15's figure: the drain of a node holding `files` replicas under a 2-copy, 2-site
/// policy; its time, and that the policy held at every look (the reconciler's count of files
/// short of their policy, and `haul where` of a rotating sample of 500 files, every look).
fn drain_suite(work: &Path, haul: &Path, files: usize, size: usize) -> Result<Value> {
    let dir = work.join("drain");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    // Site A has only n1 during the upload, so that it holds every file; n2 joins before the
    // drain and takes n1's copies at A.
    Grid::pki(&dir, haul, &["n1", "n2", "n3", "n4"])?;
    let nodes = [("n1", "A"), ("n3", "B"), ("n4", "B")];
    let mut g = Grid::start(&dir, haul, None, &nodes, &["--admin", TASK_ACCOUNT])?;
    let src = dir.join("src");
    write_files(&src, files, size)?;
    g.ok(&["mkdir", "/ds"])?;
    g.ok(&["policy", "set", "/ds", "--copies", "2", "--sites", "A,B"])?;
    let t = Instant::now();
    g.ok(&[
        "cp",
        "-r",
        "--site",
        "A",
        &src.to_string_lossy(),
        &format!("haul://{}/ds/", g.meta_addr),
    ])?;
    let upload_s = t.elapsed().as_secs_f64();
    let paths: Vec<String> = (0..files).map(|i| format!("/ds/src/f{i:04}")).collect();
    let t = Instant::now();
    loop {
        let v = g.json(&["status", "--json"])?;
        if v["under_replicated"].as_u64() == Some(0)
            && v["repairs_running"].as_u64() == Some(0)
            && v["over_replicated"].as_u64() == Some(0)
            && short_of_policy(&g, &paths[..paths.len().min(500)])? == 0
        {
            break;
        }
        if t.elapsed() > Duration::from_secs(600) {
            bail!("policy not met within 600 s after the upload");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    g.start_node("n2", "A")?;
    g.wait_nodes(4)?;
    let v = g.json(&["nodes", "--json"])?;
    let victim = v["nodes"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .filter(|n| n["site"] == "A")
                .max_by_key(|n| n["replicas"].as_u64().unwrap_or(0))
                .cloned()
        })
        .context("no node at A")?;
    let name = victim["name"].as_str().context("node name")?.to_string();
    let held = victim["replicas"].as_u64().unwrap_or(0);
    let started = Instant::now();
    g.ok(&["node", "drain", &name])?;
    let (mut looks, mut short_looks, mut max_under) = (0u64, 0u64, 0u64);
    let mut sample = 0usize;
    loop {
        if started.elapsed() > Duration::from_secs(1800) {
            bail!("{name} not drained within 1800 s");
        }
        let st = g.json(&["status", "--json"])?;
        max_under = max_under.max(st["under_replicated"].as_u64().unwrap_or(0));
        let chunk: Vec<String> = (0..500.min(files))
            .map(|k| paths[(sample + k) % files].clone())
            .collect();
        sample = (sample + 500) % files.max(1);
        if short_of_policy(&g, &chunk)? > 0 {
            short_looks += 1;
        }
        looks += 1;
        let v = g.json(&["nodes", "--json"])?;
        let left = v["nodes"]
            .as_array()
            .and_then(|a| a.iter().find(|n| n["name"] == name.as_str()))
            .and_then(|n| n["replicas"].as_u64())
            .context("victim not listed")?;
        if left == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let drained_s = started.elapsed().as_secs_f64();
    let mut short_after = 0;
    for chunk in paths.chunks(1000) {
        short_after += short_of_policy(&g, chunk)?;
    }
    let out = g.cmd(&["node", "remove", &name]).output()?;
    Ok(json!({
        "files": files,
        "file_bytes": size,
        "upload_seconds": upload_s,
        "node": name,
        "replicas_on_it": held,
        "seconds_to_drain": drained_s,
        "replicas_per_second": held as f64 / drained_s.max(1e-9),
        "looks": looks,
        "looks_with_a_sampled_file_short": short_looks,
        "max_under_replicated_reported": max_under,
        "files_short_after": short_after,
        "remove_while_running_refused": !out.status.success(),
    }))
}

/// Files of a job, `sizes` (count, bytes) written under `src`.
fn write_mixed(src: &Path, sizes: &[(usize, usize)]) -> Result<(usize, u64)> {
    let (mut n, mut bytes) = (0usize, 0u64);
    for (k, (count, size)) in sizes.iter().enumerate() {
        let dir = src.join(format!("s{k}"));
        write_files(&dir, *count, *size)?;
        n += count;
        bytes += (*count * *size) as u64;
    }
    Ok((n, bytes))
}

/// Waits for job `id` (as `user`) to end; its document.
fn wait_job(g: &Grid, user: &str, id: &str, limit: Duration) -> Result<Value> {
    let t = Instant::now();
    loop {
        let j = g.json_as(user, &["job", "show", id, "--json", "--state", "failed"])?;
        let state = j["job"]["state"].as_str().unwrap_or("").to_string();
        if matches!(state.as_str(), "done" | "failed" | "cancelled") {
            if state != "done" {
                bail!("job {id} ended {state}: {}", j["job"]);
            }
            return Ok(j["job"].clone());
        }
        if t.elapsed() > limit {
            bail!("job {id} not done within {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn submit(g: &Grid, user: &str, args: &[&str]) -> Result<String> {
    let mut a = vec!["submit", "--json"];
    a.extend_from_slice(args);
    let j = g.json_as(user, &a)?;
    Ok(j["job"]["id"].as_i64().context("job id")?.to_string())
}

/// Transfer jobs (issue 16), side by side in one run on 4 nodes (2 sites): a job of `files`
/// files of mixed sizes from site A to site B against the same copy made by `haul cp` (the
/// client driving the node-to-node sessions); then fair share: a second user's 10 files
/// submitted 3 s after the first user's big job, their completion time against the same job
/// alone, and how many of the big job's files were completed meanwhile.
fn jobs_suite(work: &Path, haul: &Path, quick: bool) -> Result<Value> {
    let dir = work.join("jobs");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Grid::pki(&dir, haul, &["n1", "n2", "n3", "n4"])?;
    let nodes = [("n1", "A"), ("n2", "A"), ("n3", "B"), ("n4", "B")];
    let g = Grid::start(&dir, haul, None, &nodes, &[])?;
    // 90% small, 9% medium, 1% large (a climate or physics data set's shape, scaled down).
    let scale = if quick { 10 } else { 1 };
    let sizes = [
        (9000 / scale, 16 << 10),
        (900 / scale, 256 << 10),
        (100 / scale, 4 << 20),
    ];
    let src = dir.join("src");
    let (files, bytes) = write_mixed(&src, &sizes)?;
    g.ok(&["mkdir", "/ds"])?;
    let t = Instant::now();
    g.ok(&[
        "cp",
        "-r",
        "--site",
        "A",
        "--progress",
        "never",
        &src.to_string_lossy(),
        &format!("haul://{}/ds/", g.meta_addr),
    ])?;
    let upload_s = t.elapsed().as_secs_f64();
    // The job.
    let t = Instant::now();
    let id = submit(&g, "bench", &["-r", "--site", "B", "/ds/src", "/job"])?;
    let j = wait_job(&g, "bench", &id, Duration::from_secs(3600))?;
    let job_s = t.elapsed().as_secs_f64();
    let links = g.json(&["jobs", "--json"])?["links"].clone();
    // The same copy by the client.
    let t = Instant::now();
    g.ok(&[
        "cp",
        "-r",
        "--site",
        "B",
        "--progress",
        "never",
        &format!("haul://{}/ds/src", g.meta_addr),
        &format!("haul://{}/cp", g.meta_addr),
    ])?;
    let cp_s = t.elapsed().as_secs_f64();
    // Fair share: the late user's 10 files of 256 KiB.
    let late_src = dir.join("late-src");
    write_files(&late_src, 10, 256 << 10)?;
    let late_cp = |to: &str| -> Result<()> {
        let out = g
            .cmd_as(
                "late",
                &[
                    "cp",
                    "-r",
                    "--site",
                    "A",
                    "--progress",
                    "never",
                    &late_src.to_string_lossy(),
                    to,
                ],
            )
            .output()?;
        if !out.status.success() {
            bail!("late upload: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    };
    g.ok(&["mkdir", "-m", "1777", "/late"])?;
    late_cp(&format!("haul://{}/late/", g.meta_addr))?;
    let big = submit(&g, "bench", &["-r", "--site", "B", "/ds/src", "/job2"])?;
    std::thread::sleep(Duration::from_secs(3));
    let since = now_ms();
    let t = Instant::now();
    let late = submit(
        &g,
        "late",
        &["-r", "--site", "B", "/late/late-src", "/late/dst"],
    )?;
    let late_job = wait_job(&g, "late", &late, Duration::from_secs(3600))?;
    let late_s = t.elapsed().as_secs_f64();
    let until = now_ms();
    let big_mid = g.json(&["job", "show", &big, "--json", "--state", "done"])?;
    let big_meanwhile = big_mid["job"]["files_list"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|f| {
                    f["updated_ms"]
                        .as_i64()
                        .is_some_and(|t| t >= since && t <= until)
                })
                .count()
        })
        .unwrap_or(0);
    wait_job(&g, "bench", &big, Duration::from_secs(3600))?;
    // The same late job alone.
    let t = Instant::now();
    let alone = submit(
        &g,
        "late",
        &["-r", "--site", "B", "/late/late-src", "/late/dst2"],
    )?;
    wait_job(&g, "late", &alone, Duration::from_secs(600))?;
    let alone_s = t.elapsed().as_secs_f64();
    Ok(json!({
        "files": files,
        "bytes": bytes,
        "sizes": sizes.iter().map(|(n, s)| json!([n, s])).collect::<Vec<_>>(),
        "upload_seconds": upload_s,
        "job_seconds": job_s,
        "job_files_per_s": files as f64 / job_s.max(1e-9),
        "job_mbit_per_s": bytes as f64 * 8.0 / job_s.max(1e-9) / 1e6,
        "job_files_done": j["files_done"],
        "cp_seconds": cp_s,
        "cp_mbit_per_s": bytes as f64 * 8.0 / cp_s.max(1e-9) / 1e6,
        "links": links,
        "late_seconds_under_load": late_s,
        "late_seconds_alone": alone_s,
        "late_files": late_job["files_done"],
        "big_files_done_meanwhile": big_meanwhile,
        "batch_files": 100,
    }))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Prometheus scrapes of a grid of `nodes` storage nodes (4 sites, each node with
/// `--metrics`), after files were uploaded and replicated between every pair of sites so that
/// the per-site-pair series exist: the metadata server's page and the nodes' pages, time and
/// size, as a Prometheus server scraping them one after the other would see them.
async fn scrape_suite(work: &Path, haul: &Path, nodes: usize) -> Result<Value> {
    let dir = work.join("scrape");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let names: Vec<String> = (1..=nodes).map(|i| format!("n{i:03}")).collect();
    let sites = ["A", "B", "C", "D"];
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    Grid::pki(&dir, haul, &refs)?;
    let mut g = Grid::start(&dir, haul, None, &[], &["--admin", TASK_ACCOUNT])?;
    // Metrics ports: a free one per node, found by binding and letting go.
    let mut ports = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = format!("127.0.0.1:{port}");
        g.start_node_with(n, sites[i % sites.len()], &["--metrics", &addr])?;
        ports.push(addr);
    }
    let t = Instant::now();
    g.wait_nodes(nodes)?;
    let up_s = t.elapsed().as_secs_f64();
    let src = dir.join("src");
    write_files(&src, 200, 64 << 10)?;
    g.ok(&["mkdir", "/ds"])?;
    g.ok(&[
        "cp",
        "-r",
        "--site",
        "A",
        &src.to_string_lossy(),
        &format!("haul://{}/ds/", g.meta_addr),
    ])?;
    for site in ["B", "C", "D"] {
        g.ok(&[
            "replicate",
            "-r",
            "--copies",
            "2",
            "--site",
            site,
            "--progress",
            "never",
            "/ds",
        ])?;
    }
    let login = g.client().await?.dashboard_login().await?;
    let scrape = |addr: &str| -> Result<(f64, usize, usize)> {
        let t = Instant::now();
        let page = http_get(addr, "/metrics", None)?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        if page.status != 200 {
            bail!("GET http://{addr}/metrics: status {}", page.status);
        }
        let samples = page
            .body
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .count();
        Ok((ms, page.body.len(), samples))
    };
    let mut meta_ms = Vec::new();
    let (mut meta_bytes, mut meta_samples) = (0, 0);
    for _ in 0..20 {
        let (ms, b, n) = scrape(&login.http)?;
        meta_ms.push(ms);
        (meta_bytes, meta_samples) = (b, n);
    }
    // One pass over every node, as one Prometheus would do it (it scrapes in parallel; one
    // after the other is the upper bound), three times.
    let mut pass_s = Vec::new();
    let mut node_ms = Vec::new();
    let (mut node_bytes, mut node_samples) = (0usize, 0usize);
    for _ in 0..3 {
        let t = Instant::now();
        let (mut b, mut n) = (0, 0);
        for addr in &ports {
            let (ms, bytes, samples) = scrape(addr)?;
            node_ms.push(ms);
            b += bytes;
            n += samples;
        }
        pass_s.push(t.elapsed().as_secs_f64());
        (node_bytes, node_samples) = (b, n);
    }
    Ok(json!({
        "nodes": nodes,
        "sites": sites.len(),
        "seconds_until_all_up": up_s,
        "meta_p50_ms": pct(&mut meta_ms.clone(), 0.5),
        "meta_max_ms": pct(&mut meta_ms, 1.0),
        "meta_bytes": meta_bytes,
        "meta_samples": meta_samples,
        "node_p50_ms": pct(&mut node_ms.clone(), 0.5),
        "node_p99_ms": pct(&mut node_ms, 0.99),
        "nodes_bytes": node_bytes,
        "nodes_samples": node_samples,
        "all_nodes_pass_p50_s": pct(&mut pass_s, 0.5),
        "meta_rss_mib": g.meta_rss_mib(),
    }))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let haul = std::fs::canonicalize(&args.haul).context("haul binary")?;
    let only: Vec<String> = args
        .only
        .as_deref()
        .unwrap_or("meta,catalog,run,restore,drain,scrape,jobs")
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    let want = |p: &str| only.iter().any(|o| o == p);
    let _ = std::fs::remove_dir_all(&args.work);
    std::fs::create_dir_all(&args.work)?;
    let rt = tokio::runtime::Runtime::new()?;
    let mut results = serde_json::Map::new();
    let started = chrono_like_now();
    if want("meta") {
        for (label, db) in [("sqlite", None), ("postgresql", args.postgres.clone())] {
            if label == "postgresql" && db.is_none() {
                results.insert(
                    "meta_postgresql".into(),
                    json!({"skipped": "no --postgres URL"}),
                );
                continue;
            }
            eprintln!("gridbench: metadata operations, {label}");
            let dir = args.work.join(format!("meta-{label}"));
            let g = Grid::start(&dir, &haul, db.as_deref(), &[], &[])?;
            let v = rt.block_on(meta_suite(&g, args.quick))?;
            eprintln!("gridbench: {v}");
            results.insert(format!("meta_{label}"), v);
        }
    }
    if want("catalog") {
        let total = if args.quick { 50_000 } else { 1_000_000 };
        eprintln!("gridbench: {total}-file catalog (SQLite)");
        let dir = args.work.join("catalog");
        let g = Grid::start(&dir, &haul, None, &[], &[])?;
        let v = rt.block_on(catalog_suite(&g, total))?;
        eprintln!("gridbench: {v}");
        results.insert("catalog".into(), v);
        let records = if args.quick { 10_000 } else { 100_000 };
        eprintln!("gridbench: {records} transfer-history records on that catalog");
        let v = rt.block_on(history_suite(&g, records))?;
        eprintln!("gridbench: {v}");
        results.insert("history".into(), v);
    }
    if want("run") {
        let n = if args.quick { 200 } else { 1000 };
        eprintln!("gridbench: haul run over {n} files on 4 nodes");
        let v = run_suite(&args.work, &haul, n)?;
        eprintln!("gridbench: {v}");
        results.insert("run".into(), v);
    }
    if want("restore") {
        let (n, size) = if args.quick {
            (20, 1 << 20)
        } else {
            (100, 8 << 20)
        };
        eprintln!("gridbench: node loss with a 2-copy policy ({n} files of {size} bytes)");
        let v = restore_suite(&args.work, &haul, n, size)?;
        eprintln!("gridbench: {v}");
        results.insert("restore".into(), v);
    }
    if want("drain") {
        let (n, size) = if args.quick {
            (500, 4096)
        } else {
            (10_000, 4096)
        };
        eprintln!("gridbench: drain of a node holding {n} replicas under a 2-copy policy");
        let v = drain_suite(&args.work, &haul, n, size)?;
        eprintln!("gridbench: {v}");
        results.insert("drain".into(), v);
    }
    if want("jobs") {
        eprintln!("gridbench: transfer jobs (a mixed-size data set, then fair share)");
        let v = jobs_suite(&args.work, &haul, args.quick)?;
        eprintln!("gridbench: {v}");
        results.insert("jobs".into(), v);
    }
    if want("scrape") {
        let n = if args.quick { 12 } else { 100 };
        eprintln!("gridbench: metrics scrapes of a grid of {n} nodes");
        let v = rt.block_on(scrape_suite(&args.work, &haul, n))?;
        eprintln!("gridbench: {v}");
        results.insert("scrape".into(), v);
    }
    let doc = json!({
        "started": started,
        "quick": args.quick,
        "haul": haul,
        "results": results,
    });
    std::fs::create_dir_all(&args.out)?;
    let base = format!(
        "{}-grid{}",
        &started[..10],
        if args.quick { "-quick" } else { "" }
    );
    std::fs::write(
        args.out.join(format!("{base}.json")),
        serde_json::to_string_pretty(&doc)?,
    )?;
    let md = markdown(&doc);
    std::fs::write(args.out.join(format!("{base}.md")), &md)?;
    print!("{md}");
    if !args.quick {
        let _ = std::fs::remove_dir_all(&args.work);
    }
    Ok(())
}

fn chrono_like_now() -> String {
    let out = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    out.unwrap_or_else(|| "unknown".into())
}

fn f(v: &Value) -> String {
    match v.as_f64() {
        Some(x) if x >= 100.0 => format!("{x:.0}"),
        Some(x) => format!("{x:.2}"),
        None => v.to_string(),
    }
}

fn markdown(doc: &Value) -> String {
    let r = &doc["results"];
    let mut s = format!(
        "# longhaul grid benchmark, {}\n\nGenerated by `bench/grid{}`; loopback, 2 cores shared by everything (metadata server, clients, nodes). Numbers as measured.\n\n",
        doc["started"].as_str().unwrap_or(""),
        if doc["quick"] == true { " --quick" } else { "" }
    );
    for db in ["sqlite", "postgresql"] {
        let m = &r[format!("meta_{db}")];
        if m.is_null() {
            continue;
        }
        if m.get("skipped").is_some() {
            s += &format!(
                "Metadata operations on {db}: skipped ({}).\n\n",
                m["skipped"]
            );
            continue;
        }
        s += &format!(
            "## Metadata operations, {db} catalog, {} clients\n\n| operation | rate (ops/s) | p50 latency (ms) | p99 latency (ms) |\n|---|---|---|---|\n| create, batched ({BATCH} per request, {} files) | {} | | |\n| stat, batched ({BATCH} per request) | {} | | |\n| create, one per request | {} | {} | {} |\n| stat, one per request | {} | {} | {} |\n\nmetadata server RSS after the run: {} MiB\n\n",
            CLIENTS,
            m["files"],
            f(&m["batched_creates_per_s"]),
            f(&m["batched_stats_per_s"]),
            f(&m["single_creates_per_s"]),
            f(&m["single_create_p50_ms"]),
            f(&m["single_create_p99_ms"]),
            f(&m["single_stats_per_s"]),
            f(&m["single_stat_p50_ms"]),
            f(&m["single_stat_p99_ms"]),
            f(&m["meta_rss_mib"]),
        );
    }
    let c = &r["catalog"];
    if !c.is_null() {
        s += &format!(
            "## A {}-file catalog (SQLite)\n\n| | |\n|---|---|\n| filled in | {} s |\n| list a 10,000-entry directory (client library), p50 / max | {} / {} ms |\n| `haul ls -l` of a 10,000-entry directory, whole command | {} ms |\n| stat, p50 / p99 | {} / {} ms |\n| metadata server RSS | {} MiB |\n\n",
            c["files"],
            f(&c["fill_seconds"]),
            f(&c["list_10k_p50_ms"]),
            f(&c["list_10k_max_ms"]),
            f(&c["cli_ls_l_10k_ms"]),
            f(&c["stat_p50_ms"]),
            f(&c["stat_p99_ms"]),
            f(&c["meta_rss_mib"]),
        );
    }
    let h = &r["history"];
    if !h.is_null() {
        let p = &h["cli_p50_ms"];
        s += &format!(
            "## Transfer history: {} records on that catalog\n\n| | |\n|---|---|\n| recorded in ({} clients, 5 files each) | {} s ({} records/s) |\n| `haul transfers` (newest 50), whole command, p50 | {} ms |\n| `haul transfers --failed --since 1d`, p50 | {} ms |\n| `haul transfers --kind download --json`, p50 | {} ms |\n| `haul transfers --limit 10000 --json`, p50 | {} ms |\n| `haul transfers --id N` | {} ms |\n| dashboard overview, signed in (GET /), p50 | {} ms ({} bytes) |\n| dashboard history (GET /transfers), p50 | {} ms ({} bytes) |\n| metadata server RSS | {} MiB |\n\n",
            h["records"],
            CLIENTS,
            f(&h["fill_seconds"]),
            f(&h["records_per_s"]),
            f(&p["newest_50"]),
            f(&p["failed_since_1d"]),
            f(&p["kind_download_json"]),
            f(&p["limit_10000_json"]),
            f(&h["show_one_ms"]),
            f(&h["dashboard"]["overview"]["p50_ms"]),
            h["dashboard"]["overview"]["bytes"],
            f(&h["dashboard"]["transfers"]["p50_ms"]),
            h["dashboard"]["transfers"]["bytes"],
            f(&h["meta_rss_mib"]),
        );
    }
    if let Some(rows) = r["run"].as_array() {
        s += "## `haul run -- true` over files on 4 nodes\n\n| tasks per node (-P) | tasks | succeeded | slots | seconds | mean task on the node (ms) | scheduling overhead per task (ms) |\n|---|---|---|---|---|---|---|\n";
        for row in rows {
            s += &format!(
                "| {} | {} | {} | {} | {} | {} | {} |\n",
                row["parallel"],
                row["tasks"],
                row["succeeded"],
                row["slots"],
                f(&row["seconds"]),
                f(&row["mean_task_ms"]),
                f(&row["overhead_ms_per_task"]),
            );
        }
        s += "\nOverhead = (seconds x min(slots, tasks) - sum of task run times) / tasks: slot time not spent running tasks.\n\n";
    }
    let x = &r["restore"];
    if !x.is_null() {
        s += &format!(
            "## Node loss with a 2-copy policy\n\n{} files of {} bytes on 4 nodes (2 sites); node {} (holding {} replicas) stopped; node timeout 3 s, reconciler every 1 s.\n\n| | |\n|---|---|\n| seconds until meta saw missing copies | {} |\n| seconds until 2 copies of every file were restored | {} |\n| files with 2 complete copies on live nodes afterwards | {} of {} |\n\n",
            x["files"],
            x["file_bytes"],
            x["node_stopped"],
            x["replicas_on_it"],
            f(&x["seconds_to_detect"]),
            f(&x["seconds_to_restore"]),
            x["files_with_2_live_copies"],
            x["files"],
        );
    }
    let m = &r["scrape"];
    if !m.is_null() {
        s += &format!(
            "## Metrics scrapes of a grid of {} storage nodes\n\n{} nodes at {} sites, each with `--metrics`; 200 files uploaded to site A and replicated to each other site, so that every site pair has its series. Scraped with plain HTTP GETs from this host.\n\n| | |\n|---|---|\n| metadata server `/metrics`, p50 / max of 20 | {} / {} ms |\n| metadata server page | {} bytes, {} samples |\n| one node's `/metrics`, p50 / p99 | {} / {} ms |\n| all {} nodes' pages | {} bytes, {} samples |\n| one pass over all nodes, one after the other (p50 of 3) | {} s |\n| seconds until all nodes were up | {} |\n| metadata server RSS | {} MiB |\n\n",
            m["nodes"],
            m["nodes"],
            m["sites"],
            f(&m["meta_p50_ms"]),
            f(&m["meta_max_ms"]),
            m["meta_bytes"],
            m["meta_samples"],
            f(&m["node_p50_ms"]),
            f(&m["node_p99_ms"]),
            m["nodes"],
            m["nodes_bytes"],
            m["nodes_samples"],
            f(&m["all_nodes_pass_p50_s"]),
            f(&m["seconds_until_all_up"]),
            f(&m["meta_rss_mib"]),
        );
    }
    let j = &r["jobs"];
    if !j.is_null() {
        s += &format!(
            "## Transfer jobs

{} files ({} bytes; counts and sizes {}) uploaded to site A of 4 nodes (2 sites), then copied to site B: by a job (`haul submit -r --site B`, the metadata server driving node-to-node sessions of 100 files, the optimizer choosing the sessions per link) and, side by side, by `haul cp -r haul://META/... haul://META/... --site B` (the client driving them). Then fair share: a second user's 10 files of 256 KiB submitted 3 s after a second run of the big job.

| | |
|---|---|
| job: seconds / files per second / Mbit/s | {} / {} / {} |
| `haul cp` within the grid: seconds / Mbit/s | {} / {} |
| job time / cp time | {} |
| what the optimizer kept per link | {} |
| late user's 10 files under the big job: seconds | {} |
| the same job alone: seconds | {} |
| big job's files completed while the late job ran | {} |

",
            j["files"],
            j["bytes"],
            j["sizes"],
            f(&j["job_seconds"]),
            f(&j["job_files_per_s"]),
            f(&j["job_mbit_per_s"]),
            f(&j["cp_seconds"]),
            f(&j["cp_mbit_per_s"]),
            f(&json!(j["job_seconds"].as_f64().unwrap_or(0.0) / j["cp_seconds"].as_f64().unwrap_or(1.0).max(1e-9))),
            j["links"],
            f(&j["late_seconds_under_load"]),
            f(&j["late_seconds_alone"]),
            j["big_files_done_meanwhile"],
        );
    }
    let d = &r["drain"];
    if !d.is_null() {
        s += &format!(
            "## Drain of a node under a 2-copy, 2-site policy\n\n{} files of {} bytes on 4 nodes (2 sites), policy `copies=2 sites=A,B`; `haul node drain {}` (holding {} replicas), reconciler every 1 s. The policy was checked at every look while it drained: the reconciler's count of files short of their policy, and `haul where` of 500 files (a different 500 each look).\n\n| | |\n|---|---|\n| seconds to drain | {} |\n| replicas moved per second | {} |\n| looks / looks where a sampled file was short of its policy | {} / {} |\n| most files the reconciler reported short of their policy | {} |\n| files short of their policy afterwards (all checked) | {} |\n| removal refused while the node runs | {} |\n\n",
            d["files"],
            d["file_bytes"],
            d["node"],
            d["replicas_on_it"],
            f(&d["seconds_to_drain"]),
            f(&d["replicas_per_second"]),
            d["looks"],
            d["looks_with_a_sampled_file_short"],
            d["max_under_replicated_reported"],
            d["files_short_after"],
            d["remove_while_running_refused"],
        );
    }
    s
}
