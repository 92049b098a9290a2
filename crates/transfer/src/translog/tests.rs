use super::*;
use std::time::Duration;
use wire::checksum::Algorithm;
use wire::error::ErrorKind;

/// NetLogger's own parser, as its `parsers/base.py` reads a line: keys `[0-9a-zA-Z_.-]+`,
/// values unquoted (no whitespace or `"`) or quoted with `\"` the only escape.
fn parse_bp(line: &str) -> Vec<(String, String)> {
    assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
    let mut out = Vec::new();
    let mut rest = line.trim_end_matches('\n');
    while !rest.is_empty() {
        let eq = rest.find('=').expect("key=value");
        let key = &rest[..eq];
        assert!(
            key.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)),
            "bad key {key:?} in {line}"
        );
        rest = &rest[eq + 1..];
        let value;
        if let Some(q) = rest.strip_prefix('"') {
            let mut v = String::new();
            let mut chars = q.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' if q[i + 1..].starts_with('"') => {
                        v.push('"');
                        chars.next();
                    }
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    c => v.push(c),
                }
            }
            let end = end.expect("closing quote");
            value = v;
            rest = &q[end + 1..];
        } else {
            let end = rest.find(' ').unwrap_or(rest.len());
            value = rest[..end].to_string();
            assert!(!value.contains('"'), "unquoted value with a quote: {line}");
            rest = &rest[end..];
        }
        out.push((key.to_string(), value));
        rest = rest.strip_prefix(' ').unwrap_or(rest);
    }
    out
}

fn get<'a>(fields: &'a [(String, String)], key: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn facts() -> SessionFacts {
    let mut f = SessionFacts::new(
        guid(&[0xab; 16]),
        Role::Receive,
        &wire::control::SessionOptions::default(),
    );
    f.user = "alice".into();
    f.subject = Some("/O=Grid/OU=users/CN=Alice \"A\" Smith".into());
    f.peer = "198.18.0.2:40123".into();
    f.streams = 8;
    f.congestion = "cubic".into();
    f.start = SystemTime::UNIX_EPOCH + Duration::from_micros(1_764_007_331_123_456);
    f
}

fn log_in(dir: &Path, format: LogFormat) -> (TransferLog, PathBuf) {
    let path = dir.join("transfer.log");
    (TransferLog::open(&path, format).unwrap(), path)
}

const HOSTILE: &str = "/data/run 7/a\"b=c\\x\nts=2026 event=forged";

fn file_record<'a>(f: &'a SessionFacts, digests: &'a [Digest]) -> FileRecord<'a> {
    FileRecord {
        session: f,
        path: HOSTILE,
        size: 4096,
        nbytes: 4096,
        skipped: false,
        start: f.start,
        end: f.start + Duration::from_millis(2500),
        result: Ok(digests),
    }
}

fn digests() -> Vec<Digest> {
    vec![Digest {
        algorithm: Algorithm::Crc32c,
        value: vec![0x0a, 0x1b, 0x2c, 0x3d],
    }]
}

#[test]
fn netlogger_lines_parse_back_and_no_value_forges_a_field_or_a_record() {
    let dir = tempfile::tempdir().unwrap();
    let (log, path) = log_in(dir.path(), LogFormat::NetLogger);
    let f = facts();
    let d = digests();
    log.file(&file_record(&f, &d));
    log.flush();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    let fields = parse_bp(&text);
    assert_eq!(fields[0].0, "ts");
    assert_eq!(fields[0].1, "2025-11-24T18:02:13.623456Z");
    assert_eq!(get(&fields, "event"), Some("haul.file.end"));
    assert_eq!(get(&fields, "level"), Some("Info"));
    assert_eq!(
        get(&fields, "guid"),
        Some("abababab-abab-abab-abab-abababababab")
    );
    assert_eq!(
        get(&fields, "path"),
        Some("/data/run 7/a\"b=c\\x5cx\\x0ats=2026 event=forged")
    );
    assert_eq!(fields.iter().filter(|(k, _)| k == "event").count(), 1);
    assert_eq!(fields.iter().filter(|(k, _)| k == "ts").count(), 1);
    assert_eq!(
        get(&fields, "dn"),
        Some("/O=Grid/OU=users/CN=Alice \"A\" Smith")
    );
    assert_eq!(get(&fields, "role"), Some("receive"));
    assert_eq!(get(&fields, "user"), Some("alice"));
    assert_eq!(get(&fields, "nbytes"), Some("4096"));
    assert_eq!(get(&fields, "streams"), Some("8"));
    assert_eq!(get(&fields, "cc"), Some("cubic"));
    assert_eq!(get(&fields, "start"), Some("2025-11-24T18:02:11.123456Z"));
    assert_eq!(get(&fields, "dur"), Some("2.500000"));
    assert_eq!(get(&fields, "rate"), Some("1638.400000"));
    assert_eq!(get(&fields, "checksum.crc32c"), Some("0a1b2c3d"));
    assert_eq!(get(&fields, "status"), Some("0"));
}

#[test]
fn json_lines_carry_the_same_keys_as_netlogger() {
    let dir = tempfile::tempdir().unwrap();
    let f = facts();
    let d = digests();
    let (nl, nl_path) = log_in(dir.path(), LogFormat::NetLogger);
    nl.file(&file_record(&f, &d));
    nl.flush();
    let jdir = tempfile::tempdir().unwrap();
    let (js, js_path) = log_in(jdir.path(), LogFormat::Json);
    js.file(&file_record(&f, &d));
    // File records wait for the session's (or a second): nothing is written yet.
    assert_eq!(std::fs::read_to_string(&js_path).unwrap(), "");
    js.flush();
    let text = std::fs::read_to_string(&js_path).unwrap();
    assert_eq!(text.lines().count(), 1);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["path"], HOSTILE, "JSON keeps the name exactly");
    assert_eq!(v["size"], 4096);
    assert_eq!(v["status"], 0);
    let bp = parse_bp(&std::fs::read_to_string(&nl_path).unwrap());
    let mut nl_keys: Vec<&str> = bp.iter().map(|(k, _)| k.as_str()).collect();
    let mut js_keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    nl_keys.sort();
    js_keys.sort();
    assert_eq!(nl_keys, js_keys);
}

#[test]
fn gridftp_lines_have_globus_fields_in_order_and_encoded_names() {
    let dir = tempfile::tempdir().unwrap();
    let (log, path) = log_in(dir.path(), LogFormat::GridFtp);
    let f = facts();
    let d = digests();
    log.file(&file_record(&f, &d));
    let err = ErrorInfo::new(ErrorKind::NoSpace, "no space left on device");
    log.file(&FileRecord {
        result: Err(&err),
        ..file_record(&f, &d)
    });
    // Sessions and refusals have no GridFTP form.
    log.session(&SessionRecord {
        session: &f,
        end: f.start,
        result: Ok(SessionStats::default()),
    });
    log.refused("198.18.0.9:1", None, "no client certificate");
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    let keys: Vec<&str> = lines[0]
        .split(' ')
        .map(|kv| kv.split_once('=').unwrap().0)
        .collect();
    assert_eq!(
        keys,
        [
            "DATE", "HOST", "PROG", "NL.EVNT", "START", "USER", "FILE", "BUFFER", "BLOCK",
            "NBYTES", "VOLUME", "STREAMS", "STRIPES", "DEST", "TYPE", "CODE", "TASKID"
        ]
    );
    let field = |line: &str, k: &str| {
        line.split(' ')
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .unwrap()
            .to_string()
    };
    assert_eq!(field(lines[0], "DATE"), "20251124180213.623456");
    assert_eq!(field(lines[0], "START"), "20251124180211.123456");
    assert_eq!(
        field(lines[0], "FILE"),
        "/data/run%207/a\"b%3Dc\\x%0Ats%3D2026%20event%3Dforged"
    );
    assert_eq!(field(lines[0], "NL.EVNT"), "FTP_INFO");
    assert_eq!(field(lines[0], "DEST"), "[198.18.0.2]");
    assert_eq!(field(lines[0], "TYPE"), "STOR");
    assert_eq!(field(lines[0], "CODE"), "226");
    assert_eq!(field(lines[0], "NBYTES"), "4096");
    assert_eq!(field(lines[0], "BLOCK"), "1048576");
    assert_eq!(field(lines[0], "BUFFER"), "0");
    assert_eq!(
        field(lines[0], "TASKID"),
        "abababab-abab-abab-abab-abababababab"
    );
    assert_eq!(field(lines[1], "CODE"), "452");
}

#[test]
fn failures_and_sessions_say_what_went_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let (log, path) = log_in(dir.path(), LogFormat::NetLogger);
    let log = Arc::new(log);
    let mut r = Recorder::new(log.clone(), facts());
    r.on_event(&Event::FileStarted { path: "a".into() });
    r.on_event(&Event::Plan {
        streams: 4,
        explanation: String::new(),
    });
    r.on_event(&Event::FileDone {
        path: "a".into(),
        size: 10,
        digests: digests(),
        skipped: false,
    });
    r.on_event(&Event::FileDone {
        path: "b".into(),
        size: 7,
        digests: digests(),
        skipped: true,
    });
    r.on_event(&Event::FileFailed {
        path: "c".into(),
        error: ErrorInfo::new(ErrorKind::PermissionDenied, "c: permission denied"),
    });
    r.finish(Ok(SessionStats {
        files: 3,
        files_failed: 1,
        bytes_total: 17,
        bytes_moved: 10,
        bytes_resumed: 7,
        attempts: 2,
        first_failure: Some(ErrorInfo::new(
            ErrorKind::PermissionDenied,
            "c: permission denied",
        )),
        ..Default::default()
    }));
    r.finish(Err(ErrorInfo::new(
        ErrorKind::Stalled,
        "no data moved for 60 s",
    )));
    log.refused(
        "198.18.0.9:4711",
        Some("/O=Other/CN=mallory"),
        "not signed by a CA we trust",
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let recs: Vec<Vec<(String, String)>> =
        text.lines().map(|l| parse_bp(&format!("{l}\n"))).collect();
    assert_eq!(recs.len(), 6, "{text}");
    assert_eq!(get(&recs[0], "path"), Some("a"));
    assert_eq!(get(&recs[0], "streams"), Some("4"), "the plan's streams");
    assert_eq!(get(&recs[1], "skipped"), Some("true"));
    assert_eq!(get(&recs[1], "nbytes"), Some("0"));
    assert_eq!(get(&recs[2], "level"), Some("Error"));
    assert_eq!(get(&recs[2], "status"), Some("-1"));
    assert_eq!(
        get(&recs[2], "error.kind"),
        Some(ErrorKind::PermissionDenied.name())
    );
    assert_eq!(get(&recs[2], "exit"), Some("5"));
    assert_eq!(get(&recs[2], "msg"), Some("c: permission denied"));
    assert_eq!(get(&recs[3], "event"), Some("haul.session.end"));
    assert_eq!(get(&recs[3], "level"), Some("Error"), "a file failed");
    assert_eq!(get(&recs[3], "files.failed"), Some("1"));
    assert_eq!(get(&recs[3], "resumed"), Some("7"));
    assert_eq!(get(&recs[3], "attempts"), Some("2"));
    assert_eq!(get(&recs[3], "exit"), Some("5"));
    assert_eq!(get(&recs[4], "exit"), Some("8"));
    assert_eq!(get(&recs[4], "msg"), Some("no data moved for 60 s"));
    assert_eq!(get(&recs[5], "event"), Some("haul.auth.refused"));
    assert_eq!(get(&recs[5], "dn"), Some("/O=Other/CN=mallory"));
    assert_eq!(get(&recs[5], "peer"), Some("198.18.0.9:4711"));
    assert_eq!(get(&recs[5], "msg"), Some("not signed by a CA we trust"));
}

#[test]
fn a_log_is_refused_before_use_when_it_cannot_be_written_safely() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("elsewhere");
    std::fs::write(&target, "precious\n").unwrap();
    let link = dir.path().join("planted");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let e = TransferLog::open(&link, LogFormat::NetLogger).unwrap_err();
    assert_eq!(e.exit_code(), 6);
    assert!(e.message().contains("symbolic link"), "{}", e.message());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious\n");
    let e = TransferLog::open(dir.path(), LogFormat::NetLogger).unwrap_err();
    assert_eq!(e.exit_code(), 6);
    let e = TransferLog::open(&dir.path().join("no/such/dir/log"), LogFormat::Json).unwrap_err();
    assert!(e.message().contains("no/such/dir/log"), "{}", e.message());
    // A new log is created 0640 and appended to.
    let path = dir.path().join("t.log");
    std::fs::write(&path, "earlier\n").unwrap();
    let log = TransferLog::open(&path, LogFormat::NetLogger).unwrap();
    log.refused("p", None, "r");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("earlier\nts="), "{text}");
    let fresh = dir.path().join("fresh.log");
    TransferLog::open(&fresh, LogFormat::NetLogger).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & !0o640, 0, "mode {mode:o}");
}

#[test]
fn a_full_log_device_drops_records_without_failing() {
    let log = TransferLog::open(Path::new("/dev/full"), LogFormat::NetLogger).unwrap();
    let f = facts();
    let d = digests();
    assert!(!log.is_failing());
    log.file(&file_record(&f, &d));
    log.flush();
    assert!(log.is_failing(), "the failure is noticed (and warned once)");
    log.file(&file_record(&f, &d));
    log.refused("p", None, "r");
    assert!(log.is_failing());
}

#[test]
fn session_ids_read_as_uuids_and_formats_by_name() {
    let mut id = [0u8; 16];
    id[0] = 0x0f;
    id[15] = 0x22;
    assert_eq!(guid(&id), "0f000000-0000-0000-0000-000000000022");
    assert_ne!(new_guid(), new_guid());
    assert_eq!("gridftp".parse::<LogFormat>(), Ok(LogFormat::GridFtp));
    assert!(
        "xml"
            .parse::<LogFormat>()
            .unwrap_err()
            .contains("netlogger")
    );
}
