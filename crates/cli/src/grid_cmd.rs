//! The namespace commands: `ls`, `stat`, `mkdir`, `rm`, `mv`, `chmod`, `chown`, `xattr`,
//! `where`, `df`, `nodes`, `whoami`. Each takes grid paths (`haul://META/path`, or `/path`
//! with `HAUL_META` set), talks to the metadata server, and prints a table or JSON.

use crate::args::{
    ChmodArgs, ChownArgs, CredArgs, GridArgs, LsArgs, MkdirArgs, MvArgs, PathsArgs, RmArgs,
    XattrCommand,
};
use crate::creds;
use grid::MetaClient;
use grid::types as pb;
use serde_json::json;
use transfer::TransferError;
use transfer::client::{Location, Peer};
use wire::error::ErrorKind;

/// `haul:///path` (no host) -> `$HAUL_META/path`; anything else unchanged. The form with no
/// host is how `haul cp`, where `/path` is a local path, names a path on the default grid.
pub fn expand_default_meta(s: &str) -> Result<String, TransferError> {
    match s.strip_prefix("haul://") {
        Some(path) if path.starts_with('/') => on_default_meta(path, s),
        _ => Ok(s.to_string()),
    }
}

fn on_default_meta(path: &str, given: &str) -> Result<String, TransferError> {
    match std::env::var("HAUL_META") {
        Ok(m) if !m.is_empty() => Ok(format!("{}{path}", m.trim_end_matches('/'))),
        _ => Err(TransferError::usage(format!(
            "{given}: give a grid path as haul://META/path (or set HAUL_META=haul://META)"
        ))),
    }
}

/// `haul://host[:port]/path` (or `/path` and `haul:///path` with `HAUL_META`) -> metadata
/// server and path.
pub fn target(s: &str) -> Result<(Peer, String), TransferError> {
    let full = if s.starts_with('/') {
        on_default_meta(s, s)?
    } else {
        expand_default_meta(s)?
    };
    match Location::parse(&full)? {
        Location::Remote { host, port, path } => Ok((Peer::new(host, port), path)),
        Location::Local(_) => Err(TransferError::usage(format!(
            "{s}: not a grid path; expected haul://META/path"
        ))),
    }
}

/// Connects to the metadata server with the user's certificate.
pub async fn connect(peer: &Peer, c: &CredArgs) -> Result<MetaClient, TransferError> {
    let creds = creds::load_tls(c)?;
    MetaClient::connect(peer, transfer::tls::client_config(&creds)?).await
}

/// Connects once for a list of paths (all on one metadata server).
async fn connect_for(
    paths: &[String],
    c: &CredArgs,
) -> Result<(MetaClient, Vec<String>), TransferError> {
    let (peer, out) = paths_on_one_meta(paths)?;
    Ok((connect(&peer, c).await?, out))
}

fn mode_string(e: &pb::Entry) -> String {
    let mut s = String::with_capacity(10);
    s.push(if e.is_dir { 'd' } else { '-' });
    let m = e.mode;
    for shift in [6, 3, 0] {
        let bits = (m >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        let x = bits & 1 != 0;
        let special = match shift {
            6 => m & 0o4000 != 0,
            3 => m & 0o2000 != 0,
            _ => m & 0o1000 != 0,
        };
        s.push(match (shift, special, x) {
            (0, true, true) => 't',
            (0, true, false) => 'T',
            (_, true, true) => 's',
            (_, true, false) => 'S',
            (_, false, true) => 'x',
            (_, false, false) => '-',
        });
    }
    s
}

fn when(ns: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ns as i128)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}",
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute()
    )
}

fn entry_json(e: &pb::Entry) -> serde_json::Value {
    json!({
        "path": e.path, "id": e.id, "type": if e.is_dir { "dir" } else { "file" },
        "owner": e.owner, "group": e.group, "mode": format!("{:04o}", e.mode),
        "size": e.size, "mtime_ns": e.mtime_ns, "mtime": rfc3339_ms(e.mtime_ns / 1_000_000),
        "checksum": e.checksum,
        "protect": if e.private { "private" } else { "clear" },
    })
}

/// A name (or message) as printed for a person: control characters (which could move the
/// cursor, clear the screen or forge lines on a terminal) and backslashes are escaped the way
/// Rust writes them in strings (`\n`, `\u{1b}`, `\\`). JSON output escapes them anyway.
pub fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    let needs = |c: char| c.is_control() || c == '\\';
    if !s.chars().any(needs) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if needs(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A message as printed on one line: control characters escaped as in [`shown`] (backslashes
/// kept: messages quote mapfile lines, whose subjects escape with backslashes).
pub fn one_line(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    std::borrow::Cow::Owned(
        s.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_debug().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

pub async fn ls(a: LsArgs) -> Result<u8, TransferError> {
    let (m, paths) = connect_for(&a.p.paths, &a.p.creds).await?;
    let mut all = Vec::new();
    let many = paths.len() > 1;
    for (i, p) in paths.iter().enumerate() {
        let entries = m.list(p).await?;
        if a.p.json {
            all.extend(entries.iter().map(entry_json));
            continue;
        }
        if many {
            if i > 0 {
                out!();
            }
            out!("{}:", shown(p));
        }
        for e in &entries {
            if a.long {
                let size = if a.human {
                    wire::units::format_bytes(e.size)
                } else {
                    e.size.to_string()
                };
                out!(
                    "{} {:<8} {:<8} {:>12} {} {}",
                    mode_string(e),
                    shown(&e.owner),
                    shown(&e.group),
                    size,
                    when(e.mtime_ns),
                    shown(grid::client::base_name(&e.path))
                );
            } else {
                out!("{}", shown(grid::client::base_name(&e.path)));
            }
        }
    }
    if a.p.json {
        crate::jsondoc::print_list("entries", all);
    }
    Ok(0)
}

pub async fn stat(a: PathsArgs) -> Result<u8, TransferError> {
    let (m, paths) = connect_for(&a.paths, &a.creds).await?;
    let mut out = Vec::new();
    for p in &paths {
        let e = m.stat(p).await?;
        if a.json {
            out.push(entry_json(&e));
        } else {
            out!("  path: {}", shown(&e.path));
            out!(
                "  type: {}   id: {}",
                if e.is_dir { "directory" } else { "file" },
                e.id
            );
            out!("  size: {} ({})", e.size, wire::units::format_bytes(e.size));
            out!(
                "  mode: {:04o} ({})   owner: {}   group: {}",
                e.mode,
                mode_string(&e),
                shown(&e.owner),
                shown(&e.group)
            );
            out!("  mtime: {}", when(e.mtime_ns));
            if !e.checksum.is_empty() {
                out!("  checksum: {}", e.checksum);
            }
            if e.private {
                out!("  protect: private (arrived over private streams; copies travel privately)");
            }
        }
    }
    if a.json {
        crate::jsondoc::print_list("entries", out);
    }
    Ok(0)
}

pub async fn mkdir(a: MkdirArgs) -> Result<u8, TransferError> {
    let (m, paths) = connect_for(&a.p.paths, &a.p.creds).await?;
    for p in &paths {
        m.mkdir(p, a.mode, a.parents).await?;
    }
    Ok(0)
}

pub async fn rm(a: RmArgs) -> Result<u8, TransferError> {
    let (m, paths) = connect_for(&a.p.paths, &a.p.creds).await?;
    let mut total = 0;
    for p in &paths {
        // An empty directory goes without -r, like rmdir; one with entries needs it.
        total += m.remove(p, a.recursive).await.map_err(|err| {
            if err.kind() == ErrorKind::NotEmpty {
                let hint = format!("{err} (use -r to remove it with everything below it)");
                err.with_message(hint)
            } else {
                err
            }
        })?;
    }
    if a.p.json {
        crate::jsondoc::print(json!({ "removed": total }));
    }
    Ok(0)
}

pub async fn mv(a: MvArgs) -> Result<u8, TransferError> {
    let (m, paths) = connect_for(&[a.from.clone(), a.to.clone()], &a.creds).await?;
    m.move_to(&paths[0], &paths[1]).await?;
    Ok(0)
}

pub async fn chmod(a: ChmodArgs) -> Result<u8, TransferError> {
    let (m, paths) = connect_for(&a.p.paths, &a.p.creds).await?;
    for p in &paths {
        m.chmod(p, a.mode).await?;
    }
    Ok(0)
}

pub async fn chown(a: ChownArgs) -> Result<u8, TransferError> {
    let (owner, group) = match a.owner.split_once(':') {
        Some((o, g)) => (o.to_string(), g.to_string()),
        None => (a.owner.clone(), String::new()),
    };
    if owner.is_empty() && group.is_empty() {
        return Err(TransferError::usage("give OWNER, OWNER:GROUP or :GROUP"));
    }
    let (m, paths) = connect_for(&a.p.paths, &a.p.creds).await?;
    for p in &paths {
        m.chown(p, &owner, &group).await?;
    }
    Ok(0)
}

pub async fn xattr(c: XattrCommand) -> Result<u8, TransferError> {
    match c {
        XattrCommand::Get(a) => {
            let (m, p) = connect_for(std::slice::from_ref(&a.path), &a.creds).await?;
            match m.xattr_get(&p[0], &a.name).await? {
                Some(v) => {
                    out!("{}", String::from_utf8_lossy(&v));
                    Ok(0)
                }
                None => Err(TransferError::not_found(format!(
                    "{}: no attribute {:?}",
                    p[0], a.name
                ))),
            }
        }
        XattrCommand::Set(a) => {
            let (m, p) = connect_for(std::slice::from_ref(&a.path), &a.creds).await?;
            m.xattr_set(&p[0], &a.name, a.value.as_bytes()).await?;
            Ok(0)
        }
        XattrCommand::Rm(a) => {
            let (m, p) = connect_for(std::slice::from_ref(&a.path), &a.creds).await?;
            m.xattr_remove(&p[0], &a.name).await?;
            Ok(0)
        }
        XattrCommand::List(a) => {
            let (m, paths) = connect_for(&a.paths, &a.creds).await?;
            let mut out = serde_json::Map::new();
            for p in &paths {
                let attrs = m.xattr_list(p).await?;
                if a.json {
                    let obj: serde_json::Map<String, serde_json::Value> = attrs
                        .iter()
                        .map(|x| (x.name.clone(), json!(String::from_utf8_lossy(&x.value))))
                        .collect();
                    out.insert(p.clone(), obj.into());
                } else {
                    for x in attrs {
                        out!("{}={}", x.name, String::from_utf8_lossy(&x.value));
                    }
                }
            }
            if a.json {
                crate::jsondoc::print(json!({ "xattrs": out }));
            }
            Ok(0)
        }
    }
}

pub async fn where_(a: PathsArgs) -> Result<u8, TransferError> {
    let (m, paths) = connect_for(&a.paths, &a.creds).await?;
    let mut out = Vec::new();
    for p in &paths {
        let w = m.where_is(p).await?;
        let e = w.entry.unwrap_or_default();
        if a.json {
            out.push(json!({
                "path": e.path, "size": e.size,
                "type": if e.is_dir { "dir" } else { "file" },
                "checksum": if e.is_dir { None } else { Some(&e.checksum) },
                "replicas": w.replicas.iter().map(|r| json!({
                    "node": r.node, "site": r.site, "address": r.address, "state": r.state,
                    "checksum": r.checksum, "node_up": r.node_up,
                })).collect::<Vec<_>>(),
            }));
            continue;
        }
        if e.is_dir {
            // Directories live in the catalog only: no size, checksum or replicas to show.
            out!("{} (a directory: only files have replicas)", shown(&e.path));
            continue;
        }
        out!("{} ({} bytes, {})", shown(&e.path), e.size, e.checksum);
        if w.replicas.is_empty() {
            out!(
                "  no replicas{}",
                if e.size == 0 && !e.is_dir {
                    " (empty file)"
                } else {
                    ""
                }
            );
        }
        for r in &w.replicas {
            out!(
                "  {:<16} {:<10} {:<9} {:<5} {}",
                r.node,
                r.site,
                r.state,
                if r.node_up { "up" } else { "DOWN" },
                r.checksum
            );
        }
    }
    if a.json {
        crate::jsondoc::print_list("files", out);
    }
    Ok(0)
}

/// The metadata server a command without paths names (`haul://META`, or `HAUL_META`).
pub(crate) fn meta_of(a: &GridArgs) -> Result<Peer, TransferError> {
    meta_named(a.meta.as_deref())
}

/// The metadata server `meta` names (a command's `META` argument or `HAUL_META`).
pub(crate) fn meta_named(meta: Option<&str>) -> Result<Peer, TransferError> {
    let s = meta.ok_or_else(|| {
        TransferError::usage("name the metadata server: haul://META (or set HAUL_META)")
    })?;
    Ok(target(s)?.0)
}

/// A time given as an RFC 3339 time, or as a duration (`30m`, `7d`) back from now
/// (`ahead` false) or ahead of it (`ahead` true), in ms since the epoch; `flag` and `example`
/// name it in the error.
pub(crate) fn time_arg(
    s: &str,
    ahead: bool,
    flag: &str,
    example: &str,
) -> Result<i64, TransferError> {
    if let Ok(t) = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339) {
        return Ok((t.unix_timestamp_nanos() / 1_000_000) as i64);
    }
    let d = wire::units::parse_duration(s).map_err(|_| {
        TransferError::usage(format!(
            "{flag} {s}: give a duration {} now ({example}) or an RFC 3339 time (2026-12-01T06:00:00Z)",
            if ahead { "from" } else { "back from" }
        ))
    })?;
    let ms = d.as_millis() as i64;
    Ok(if ahead { now_ms() + ms } else { now_ms() - ms })
}

/// A node's state in one word: up or DOWN, and draining (replicas left) or drained.
pub(crate) fn node_state(n: &pb::NodeInfo) -> &'static str {
    match (n.up, n.drain_ms != 0, n.replicas == 0) {
        (true, false, _) => "up",
        (false, false, _) => "DOWN",
        (true, true, false) => "draining",
        (false, true, false) => "DOWN,draining",
        (_, true, true) => "drained",
    }
}

pub(crate) fn node_json(n: &pb::NodeInfo) -> serde_json::Value {
    json!({
        "name": n.name, "site": n.site, "address": n.address, "up": n.up,
        "state": node_state(n).to_lowercase(),
        "capacity": n.capacity, "free": n.free, "load": n.load,
        "heartbeat_ms": n.heartbeat_ms,
        "heartbeat": rfc3339_ms(n.heartbeat_ms),
        "heartbeat_age_s": (now_ms() - n.heartbeat_ms).max(0) as f64 / 1000.0,
        "replicas": n.replicas,
        "stored_bytes": n.stored_bytes,
        "other_used_bytes": other_used(n),
        "draining": n.drain_ms != 0,
        "drain_started_ms": (n.drain_ms != 0).then_some(n.drain_ms),
        "drain_started": (n.drain_ms != 0).then(|| rfc3339_ms(n.drain_ms)),
        "drain_replicas": (n.drain_ms != 0).then_some(n.drain_replicas),
    })
}

/// A time in milliseconds since the epoch, as RFC 3339 (UTC, whole seconds).
pub(crate) fn rfc3339_ms(ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
        .replace_nanosecond(0)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// This host's clock, in milliseconds since the epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Space used on a node's file system by anything but longhaul's replicas.
fn other_used(n: &pb::NodeInfo) -> u64 {
    n.capacity
        .saturating_sub(n.free)
        .saturating_sub(n.stored_bytes)
}

pub async fn df(a: GridArgs) -> Result<u8, TransferError> {
    let m = connect(&meta_of(&a)?, &a.creds).await?;
    let d = m.df().await?;
    // Per site: what longhaul stores there (the sites' figures come from the same nodes).
    let stored_at = |site: &str| -> u64 {
        d.nodes
            .iter()
            .filter(|n| n.site == site)
            .map(|n| n.stored_bytes)
            .sum()
    };
    if a.json {
        crate::jsondoc::print(json!({
            "nodes": d.nodes.iter().map(node_json).collect::<Vec<_>>(),
            "sites": d.sites.iter().map(|s| {
                let stored = stored_at(&s.site);
                let used = s.capacity.saturating_sub(s.free);
                json!({
                    "site": s.site, "capacity": s.capacity, "free": s.free,
                    "used": used, "stored_bytes": stored,
                    "other_used_bytes": used.saturating_sub(stored),
                    "nodes": s.nodes, "up": s.up,
                })
            }).collect::<Vec<_>>(),
        }));
        return Ok(0);
    }
    let pct = |cap: u64, free: u64| {
        if cap == 0 {
            0.0
        } else {
            cap.saturating_sub(free) as f64 * 100.0 / cap as f64
        }
    };
    let b = wire::units::format_bytes;
    // "used" is the file system's; "haul" is what longhaul stores in it, "other" the rest.
    out!(
        "{:<16} {:<10} {:>10} {:>10} {:>10} {:>10} {:>5} {:>9}  state",
        "node",
        "site",
        "size",
        "haul",
        "other",
        "free",
        "use%",
        "replicas"
    );
    for n in &d.nodes {
        out!(
            "{:<16} {:<10} {:>10} {:>10} {:>10} {:>10} {:>4.0}% {:>9}  {}",
            n.name,
            n.site,
            b(n.capacity),
            b(n.stored_bytes),
            b(other_used(n)),
            b(n.free),
            pct(n.capacity, n.free),
            n.replicas,
            node_state(n)
        );
    }
    out!();
    out!(
        "{:<16} {:>10} {:>10} {:>10} {:>10} {:>5}  nodes up",
        "site",
        "size",
        "haul",
        "other",
        "free",
        "use%"
    );
    for s in &d.sites {
        let stored = stored_at(&s.site);
        out!(
            "{:<16} {:>10} {:>10} {:>10} {:>10} {:>4.0}%  {}/{}",
            s.site,
            b(s.capacity),
            b(stored),
            b(s.capacity.saturating_sub(s.free).saturating_sub(stored)),
            b(s.free),
            pct(s.capacity, s.free),
            s.up,
            s.nodes
        );
    }
    Ok(0)
}

pub async fn nodes(a: GridArgs) -> Result<u8, TransferError> {
    let m = connect(&meta_of(&a)?, &a.creds).await?;
    let nodes = m.nodes().await?;
    if a.json {
        crate::jsondoc::print_list("nodes", nodes.iter().map(node_json).collect());
        return Ok(0);
    }
    let now = now_ms();
    out!(
        "{:<16} {:<10} {:<22} {:<13} {:>10} {:>6} {:>9} {:>10}",
        "node",
        "site",
        "address",
        "state",
        "free",
        "load",
        "replicas",
        "heartbeat"
    );
    for n in &nodes {
        out!(
            "{:<16} {:<10} {:<22} {:<13} {:>10} {:>6.2} {:>9} {:>8.1}s",
            n.name,
            n.site,
            n.address,
            node_state(n),
            wire::units::format_bytes(n.free),
            n.load,
            n.replicas,
            (now - n.heartbeat_ms) as f64 / 1000.0
        );
    }
    Ok(0)
}

/// `haul dashboard`: a sign-in link for the metadata server's dashboard, as the caller.
pub async fn dashboard(a: GridArgs) -> Result<u8, TransferError> {
    let peer = meta_of(&a)?;
    let m = connect(&peer, &a.creds).await?;
    let r = m.dashboard_login().await?;
    let bound: std::net::SocketAddr = r.http.parse().map_err(|_| {
        TransferError::protocol(format!(
            "the metadata server gave a bad address: {:?}",
            r.http
        ))
    })?;
    // A dashboard on every address is reached at the host this command reached.
    let host = if bound.ip().is_unspecified() {
        match peer.host.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(v6)) => format!("[{v6}]"),
            _ => peer.host.clone(),
        }
    } else {
        match bound.ip() {
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
            v4 => v4.to_string(),
        }
    };
    let url = format!("http://{host}:{}{}", bound.port(), r.path);
    if a.json {
        crate::jsondoc::print(json!({ "url": url, "expires": rfc3339_ms(r.expires_ms) }));
    } else {
        out!("{url}");
        eprintln!("open it within two minutes; it works once and signs you in for 12 hours");
    }
    Ok(0)
}

pub async fn whoami(a: GridArgs) -> Result<u8, TransferError> {
    let m = connect(&meta_of(&a)?, &a.creds).await?;
    let id = m.who_am_i().await?;
    if a.json {
        crate::jsondoc::print(
            json!({ "user": id.user, "groups": id.groups, "subject": id.subject }),
        );
    } else {
        out!(
            "{} (groups: {}) as {}",
            id.user,
            id.groups.join(","),
            id.subject
        );
    }
    Ok(0)
}

/// The metadata server all of `paths` are on, and their paths on it: one command talks to one
/// metadata server.
pub(crate) fn paths_on_one_meta(paths: &[String]) -> Result<(Peer, Vec<String>), TransferError> {
    let mut peer = None;
    let mut out = Vec::new();
    for p in paths {
        let (m, path) = target(p)?;
        if peer.as_ref().is_some_and(|q| *q != m) {
            return Err(TransferError::usage(
                "all paths of one command must be on the same metadata server",
            ));
        }
        peer = Some(m);
        out.push(path);
    }
    Ok((
        peer.ok_or_else(|| TransferError::usage("no path given"))?,
        out,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_control_characters_are_printed_escaped() {
        assert_eq!(shown("run1.nc"), "run1.nc");
        assert!(matches!(shown("run1.nc"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(shown("a\nb"), "a\\nb");
        assert_eq!(shown("\u{1b}[2Jx"), "\\u{1b}[2Jx");
        assert_eq!(shown("back\\slash\t"), "back\\\\slash\\t");
        assert_eq!(shown("été"), "été");
        assert_eq!(one_line("a\\2F\nb"), "a\\2F\\nb");
    }

    #[test]
    fn modes_read_like_ls() {
        let e = pb::Entry {
            is_dir: true,
            mode: 0o1777,
            ..Default::default()
        };
        assert_eq!(mode_string(&e), "drwxrwxrwt");
        let f = pb::Entry {
            mode: 0o640,
            ..Default::default()
        };
        assert_eq!(mode_string(&f), "-rw-r-----");
    }

    #[test]
    fn grid_targets() {
        let (p, path) = target("haul://meta.example.org:7000/data/run1").unwrap();
        assert_eq!(
            (p.host.as_str(), p.port, path.as_str()),
            ("meta.example.org", 7000, "/data/run1")
        );
        assert!(target("relative/path").is_err());
    }
}
