//! The transfer log (`--log-transfer`) of `haul cp` and `haul serve` over loopback: a record
//! per file and per session on both sides, in each format; refused authentications with the
//! subject and the reason; a log that cannot be written refused before anything moves, and one
//! that fills up never failing the copy. `--log-format json` for the daemon's own log.

mod common;

use common::*;
use std::path::Path;
use std::process::Stdio;

/// NetLogger lines as `key -> value` maps (values unquoted, `\"` unescaped).
fn netlogger(path: &Path) -> Vec<std::collections::HashMap<String, String>> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|line| {
            let mut m = std::collections::HashMap::new();
            let mut rest = line;
            while let Some(eq) = rest.find('=') {
                let key = rest[..eq].to_string();
                rest = &rest[eq + 1..];
                let value = if let Some(q) = rest.strip_prefix('"') {
                    let mut end = 0;
                    let b = q.as_bytes();
                    while end < b.len() && !(b[end] == b'"' && (end == 0 || b[end - 1] != b'\\')) {
                        end += 1;
                    }
                    rest = q.get(end + 1..).unwrap_or("");
                    q[..end].replace("\\\"", "\"")
                } else {
                    let end = rest.find(' ').unwrap_or(rest.len());
                    let v = rest[..end].to_string();
                    rest = &rest[end..];
                    v
                };
                m.insert(key, value);
                rest = rest.trim_start_matches(' ');
            }
            m
        })
        .collect()
}

fn events<'a>(
    recs: &'a [std::collections::HashMap<String, String>],
    event: &str,
) -> Vec<&'a std::collections::HashMap<String, String>> {
    recs.iter().filter(|r| r["event"] == event).collect()
}

fn arg(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

#[test]
fn client_and_endpoint_record_every_file_and_session_in_each_format() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let serve_log = dir.path().join("serve.log");
    let mut args = pki.serve_args();
    args.extend(["--log-transfer".into(), arg(&serve_log)]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ep = serve(&dir.path().join("export"), &args, &[]);
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    write_file(&src.join("a.nc"), 1, 3 << 20);
    write_file(&src.join("sub/b c.nc"), 2, 100_000);
    write_file(&src.join("sub/empty"), 3, 0);

    // Upload, logged by the client as JSON lines.
    let up_log = dir.path().join("up.jsonl");
    let out = pki.cp(
        "alice",
        &[
            "-r",
            "--checksum",
            "md5",
            "--log-transfer",
            &arg(&up_log),
            "--log-transfer-format",
            "json",
            &arg(&src),
            &ep.tls_url("/"),
        ],
    );
    assert_ok(&out);
    let up: Vec<serde_json::Value> = std::fs::read_to_string(&up_log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let files: Vec<&serde_json::Value> = up
        .iter()
        .filter(|r| r["event"] == "haul.file.end")
        .collect();
    assert!(files.len() >= 3, "{up:?}");
    assert!(
        files
            .iter()
            .any(|r| r["path"].as_str().unwrap().ends_with("sub/b c.nc")),
        "{up:?}"
    );
    let a = files
        .iter()
        .find(|r| r["path"].as_str().unwrap().ends_with("a.nc"))
        .expect("a.nc recorded");
    assert_eq!(a["role"], "send");
    assert_eq!(a["size"], 3 << 20);
    assert_eq!(a["nbytes"], 3 << 20);
    assert_eq!(a["status"], 0);
    assert_eq!(a["dn"], "/O=longhaul/OU=users/CN=alice");
    assert_eq!(a["zero_copy"], true);
    assert!(a["md5"].is_null(), "checksums are namespaced");
    assert_eq!(a["checksum.md5"].as_str().unwrap().len(), 32);
    assert!(a["dur"].as_f64().unwrap() >= 0.0);
    let sessions: Vec<&serde_json::Value> = up
        .iter()
        .filter(|r| r["event"] == "haul.session.end")
        .collect();
    assert_eq!(sessions.len(), 1, "{up:?}");
    let s = sessions[0];
    assert_eq!(s["status"], 0);
    assert_eq!(s["bytes"], (3 << 20) + 100_000);
    assert_eq!(s["attempts"], 1);
    assert_eq!(s["src"], arg(&src));
    // The client's record says what limited the copy (the words of --explain).
    assert!(
        s["bottleneck"].is_string() && s["bottleneck.reason"].is_string(),
        "{s}"
    );
    assert!(s["streams"].as_u64().unwrap() >= 1);
    let guid = s["guid"].as_str().unwrap();
    assert!(files.iter().all(|f| f["guid"] == guid), "one id per copy");

    // The endpoint's records of the same upload (NetLogger): the mapped account, the subject.
    // The endpoint writes a file's record as it reports the file, and its session's record
    // (after all of them) when the client closed its control connection: possibly after the
    // client exited.
    let mut recs = Vec::new();
    assert!(wait_for(std::time::Duration::from_secs(10), || {
        recs = netlogger(&serve_log);
        !events(&recs, "haul.session.end").is_empty()
    }));
    let received: Vec<_> = events(&recs, "haul.file.end")
        .into_iter()
        .filter(|r| r["role"] == "receive")
        .collect();
    assert!(received.len() >= 3, "{recs:?}");
    let ra = received
        .iter()
        .find(|r| r["path"].ends_with("a.nc"))
        .expect("a.nc on the endpoint");
    assert_eq!(ra["user"], "root");
    assert_eq!(ra["dn"], "/O=longhaul/OU=users/CN=alice");
    assert_eq!(ra["nbytes"], (3u64 << 20).to_string());
    assert_eq!(ra["checksum.md5"], a["checksum.md5"].as_str().unwrap());
    assert_eq!(ra["status"], "0");
    assert_eq!(ra["level"], "Info");
    assert!(ra["peer"].starts_with("127.0.0.1:"), "{ra:?}");
    let rs = events(&recs, "haul.session.end");
    assert_eq!(rs.len(), 1, "{recs:?}");
    assert_eq!(rs[0]["role"], "receive");
    assert!(rs[0]["files"].parse::<u64>().unwrap() >= 3, "{rs:?}");
    assert_eq!(rs[0]["files.failed"], "0");
    assert_eq!(rs[0]["status"], "0");

    // Download, logged by the client as GridFTP records; the endpoint logs it as sent.
    let down_log = dir.path().join("down.gridftp");
    let back = dir.path().join("back");
    let out = pki.cp(
        "alice",
        &[
            "--log-transfer",
            &arg(&down_log),
            "--log-transfer-format",
            "gridftp",
            &ep.tls_url("/src/a.nc"),
            &arg(&back),
        ],
    );
    assert_ok(&out);
    assert_same_file(&src.join("a.nc"), &back);
    let text = std::fs::read_to_string(&down_log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "one file, no session line in GridFTP form: {text}"
    );
    let l = lines[0];
    assert!(l.starts_with("DATE="), "{l}");
    for needle in [
        " PROG=haul NL.EVNT=FTP_INFO START=",
        " TYPE=STOR CODE=226 TASKID=",
        " NBYTES=3145728 VOLUME=/ STREAMS=",
        " DEST=[0.0.0.0] ",
    ] {
        assert!(l.contains(needle), "{needle:?} missing in {l}");
    }
    let mut recs = Vec::new();
    assert!(wait_for(std::time::Duration::from_secs(10), || {
        recs = netlogger(&serve_log);
        events(&recs, "haul.session.end").len() == 2
    }));
    let sent: Vec<_> = events(&recs, "haul.file.end")
        .into_iter()
        .filter(|r| r["role"] == "send")
        .collect();
    assert_eq!(sent.len(), 1, "{recs:?}");
    assert_eq!(sent[0]["nbytes"], (3u64 << 20).to_string());
    assert_eq!(sent[0]["zero_copy"], "true");
    let s2 = events(&recs, "haul.session.end")[1];
    assert_eq!(s2["role"], "send");
    assert_eq!(s2["status"], "0", "{s2:?}");
}

#[test]
fn refused_authentications_are_logged_with_subject_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let serve_log = dir.path().join("serve.log");
    let mut args = pki.serve_args();
    args.extend(["--log-transfer".into(), arg(&serve_log)]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ep = serve(&dir.path().join("export"), &args, &[]);
    let src = dir.path().join("f");
    write_file(&src, 4, 1000);
    // Signed by another CA: refused in the TLS handshake.
    let out = pki.cp("forged", &[&arg(&src), &ep.tls_url("/f")]);
    assert_exit(&out, 5, "");
    // A certificate of the CA whose subject the mapfile does not list.
    let out = pki.cp("mallory", &[&arg(&src), &ep.tls_url("/f")]);
    assert_exit(&out, 5, "");
    let mut refused = Vec::new();
    assert!(
        wait_for(std::time::Duration::from_secs(10), || {
            refused = netlogger(&serve_log)
                .into_iter()
                .filter(|r| r["event"] == "haul.auth.refused")
                .collect();
            refused.len() >= 2
        }),
        "{refused:?}"
    );
    let forged = refused
        .iter()
        .find(|r| r.get("dn").is_some_and(|d| d.ends_with("CN=alice")))
        .expect("the forged certificate's subject, parsed from it");
    assert!(forged["msg"].contains("CA"), "{forged:?}");
    assert!(forged["peer"].starts_with("127.0.0.1:"));
    assert_eq!(forged["status"], "-1");
    let mallory = refused
        .iter()
        .find(|r| r.get("dn").is_some_and(|d| d.ends_with("CN=mallory")))
        .expect("mallory's refusal");
    assert!(!mallory["msg"].is_empty());
    assert!(!Path::new(&ep.root.join("f")).exists());
}

#[test]
fn an_unusable_transfer_log_is_refused_before_anything_moves() {
    let dir = tempfile::tempdir().unwrap();
    let ep = serve_insecure(&dir.path().join("export"));
    let src = dir.path().join("f");
    write_file(&src, 5, 10_000);
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep\n").unwrap();
    let planted = dir.path().join("planted.log");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    for bad in [
        dir.path().join("no/such/dir/t.log"),
        planted.clone(),
        dir.path().to_path_buf(),
    ] {
        let out = cp(&["--log-transfer", &arg(&bad), &arg(&src), &ep.url("/f")]);
        assert_exit(&out, 6, "transfer log");
        assert!(!ep.root.join("f").exists(), "nothing moved with {bad:?}");
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep\n");
    let out = haul()
        .args(["serve", "--insecure", "--listen", "127.0.0.1:0", "--root"])
        .arg(dir.path())
        .args(["--log-transfer", &arg(&planted)])
        .output()
        .unwrap();
    assert_exit(&out, 6, "symbolic link");
    let out = cp(&["--log-transfer-format", "xml", &arg(&src), &ep.url("/f")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("xml"), "{}", stderr(&out));
}

#[test]
fn a_full_log_device_warns_once_and_the_copy_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let ep = serve_insecure(&dir.path().join("export"));
    let src = dir.path().join("tree");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..5 {
        write_file(&src.join(format!("f{i}")), 10 + i, 50_000);
    }
    let out = cp(&[
        "-r",
        "--log-transfer",
        "/dev/full",
        &arg(&src),
        &ep.url("/"),
    ]);
    assert_ok(&out);
    assert_same_tree(&src, &ep.root.join("tree"));
    let warnings = stderr(&out)
        .matches("cannot write the transfer log")
        .count();
    assert_eq!(warnings, 1, "{}", stderr(&out));
}

#[test]
fn daemon_logs_are_json_lines_with_log_format_json() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("stderr.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut cmd = haul();
    cmd.env("HAUL_LOG", "info").args(["--log-format", "json"]);
    let ep = serve_logging(
        cmd,
        "127.0.0.1:0",
        &dir.path().join("export"),
        &["--insecure"],
        &[],
        Stdio::from(log),
    );
    let src = dir.path().join("f");
    write_file(&src, 6, 1000);
    assert_ok(&cp(&[&arg(&src), &ep.url("/f")]));
    drop(ep);
    let text = std::fs::read_to_string(&log_path).unwrap();
    assert!(text.lines().count() >= 2, "{text}");
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            v["timestamp"].is_string() && v["level"].is_string(),
            "{line}"
        );
    }
    assert!(!text.contains('\u{1b}'), "no colour codes in a file");
}

/// `haul cp --trace` of an upload, an endpoint's `--trace-dir` for a download, and `haul trace
/// summary|plot` reading them; refusals before anything moves.
#[test]
fn traces_of_both_sending_sides_are_summarized_and_plotted() {
    let dir = tempfile::tempdir().unwrap();
    let trace_dir = dir.path().join("traces");
    std::fs::create_dir_all(&trace_dir).unwrap();
    let ep = serve(
        &dir.path().join("export"),
        &["--insecure", "--trace-dir", &arg(&trace_dir)],
        &[],
    );
    let src = dir.path().join("big");
    write_file(&src, 9, 32 << 20);
    let trace = dir.path().join("up.trace");
    // Paced, so that the copy lasts long enough for many 10 ms samples.
    let out = cp(&[
        "-p",
        "4",
        "--rate",
        "300M",
        "--trace",
        &arg(&trace),
        &arg(&src),
        &ep.url("/big"),
    ]);
    assert_ok(&out);
    let out = haul()
        .args(["trace", "summary", "--json"])
        .arg(&trace)
        .output()
        .unwrap();
    assert_ok(&out);
    let s = json(&out);
    assert_eq!(s["streams"], 4, "{s}");
    assert_eq!(s["sessions"], 1, "{s}");
    assert!(s["samples"].as_u64().unwrap() >= 40, "{s}");
    assert!(s["bytes_acked"].as_u64().unwrap() >= 32 << 20, "{s}");
    let p50 = s["total_mbps"]["p50"].as_f64().unwrap();
    assert!(p50 > 0.0, "{s}");
    assert!(s["read_bytes_per_s"].as_f64().unwrap() > 0.0, "{s}");
    // The tracer measured its own cost (a share of one core, well under all of it).
    let share = s["sampling_share"].as_f64().unwrap();
    assert!(share > 0.0 && share < 1.0, "{s}");
    let text = haul()
        .args(["trace", "summary"])
        .arg(&trace)
        .output()
        .unwrap();
    assert_ok(&text);
    assert!(String::from_utf8_lossy(&text.stdout).contains("per stream Mbit/s"));
    for pic in ["up.svg", "up.png"] {
        let pic = dir.path().join(pic);
        let out = haul()
            .args(["trace", "plot"])
            .arg(&trace)
            .arg("-o")
            .arg(&pic)
            .output()
            .unwrap();
        assert_ok(&out);
        let bytes = std::fs::read(&pic).unwrap();
        if pic.extension().unwrap() == "svg" {
            let svg = String::from_utf8(bytes).unwrap();
            assert!(svg.contains("<svg") && svg.matches("<polyline").count() > 4 * 4);
            assert!(svg.contains("Mbit/s") && svg.contains("RTT (ms)"));
        } else {
            assert!(bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000);
        }
    }

    // The endpoint traces a download it sends, one file per session.
    let back = dir.path().join("back");
    assert_ok(&cp(&["-p", "2", &ep.url("/big"), &arg(&back)]));
    assert_same_file(&src, &back);
    let mut files = Vec::new();
    assert!(wait_for(std::time::Duration::from_secs(10), || {
        files = std::fs::read_dir(&trace_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.len() == 1
            && std::fs::read_to_string(&files[0])
                .unwrap()
                .contains("\"stream\"")
    }));
    assert!(files[0].to_string_lossy().ends_with(".trace.jsonl"));
    let out = haul()
        .args(["trace", "summary", "--json"])
        .arg(&files[0])
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(json(&out)["streams"], 2);

    // Refused before anything moves: a download traced by the client, a trace through a
    // planted link; unreadable and wrong traces.
    let out = cp(&[
        "--trace",
        &arg(&dir.path().join("t2")),
        &ep.url("/big"),
        &arg(&dir.path().join("b2")),
    ]);
    assert_exit(&out, 2, "--trace-dir");
    assert!(!dir.path().join("b2").exists());
    let link = dir.path().join("planted");
    std::os::unix::fs::symlink(&src, &link).unwrap();
    let out = cp(&["--trace", &arg(&link), &arg(&src), &ep.url("/big2")]);
    assert_exit(&out, 6, "symbolic link");
    assert!(!ep.root.join("big2").exists());
    let out = haul()
        .args(["trace", "summary"])
        .arg(&src)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = haul()
        .args(["trace", "plot", "-o", "x.gif"])
        .arg(&trace)
        .output()
        .unwrap();
    assert_exit(&out, 2, ".svg or .png");
    let out = haul()
        .args(["serve", "--insecure", "--listen", "127.0.0.1:0", "--root"])
        .arg(dir.path())
        .args(["--trace-dir"])
        .arg(&src)
        .output()
        .unwrap();
    assert_exit(&out, 6, "not a directory");
}
