//! The scope of a delegated credential: which paths at which standalone endpoints its holder
//! may read or write (see `transfer::delegation` for the certificate that carries it). Pure
//! text handling, no I/O, so that the parser of what a client's certificate says can be
//! fuzzed (`fuzz/fuzz_targets/delegation_scopes.rs`).
//!
//! The text is one grant per line after a version line: `read HOST PATH` or `write HOST
//! PATH` (the path and everything below it, at the endpoint whose certificate names HOST).

/// A host name or IP address as a grant names it: DNS labels (letters, digits, `-`), dots
/// between them, or an IP address; at most 253 bytes.
pub fn is_host_name(h: &str) -> bool {
    if h.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// The most grants one delegation holds, and the most bytes its extension holds.
pub const MAX_GRANTS: usize = 256;
pub const MAX_SCOPE_BYTES: usize = 64 << 10;

/// First line of the extension's text.
const MAGIC: &str = "longhaul-delegation 1";

/// What a grant lets the holder do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

impl Access {
    /// `read` or `write`, as grants spell it.
    pub fn name(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
        }
    }
}

/// One grant: `access` to `path` and below at the endpoint named `host`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub access: Access,
    pub host: String,
    /// Normalized: `/` then components joined by `/`, no `.`, `..` or empty component.
    pub path: String,
}

/// A delegation's grants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    pub grants: Vec<Grant>,
}

/// Normalizes a path at an endpoint: `None` when it climbs (`..`) or holds a NUL byte.
pub fn normalize(path: &str) -> Option<String> {
    let mut parts = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => return None,
            c if c.contains('\0') => return None,
            c => parts.push(c),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

/// Whether normalized `path` is `base` or below it.
fn within(base: &str, path: &str) -> bool {
    base == "/"
        || path == base
        || (path.starts_with(base) && path.as_bytes().get(base.len()) == Some(&b'/'))
}

impl Grant {
    /// The grant as a scope line: `ACCESS HOST PATH`.
    pub fn line(&self) -> String {
        format!("{} {} {}", self.access.name(), self.host, self.path)
    }

    /// Parses a scope line (strictly).
    pub fn parse_line(line: &str) -> Result<Self, String> {
        let mut f = line.splitn(3, ' ');
        let access = match f.next() {
            Some("read") => Access::Read,
            Some("write") => Access::Write,
            _ => return Err(format!("delegation grant {line:?}: read or write?")),
        };
        let host = f.next().filter(|h| is_host_name(h));
        let path = f.next().and_then(normalize);
        match (host, path) {
            (Some(host), Some(path)) => Ok(Grant {
                access,
                host: host.to_ascii_lowercase(),
                path,
            }),
            _ => Err(format!(
                "delegation grant {line:?}: expected ACCESS HOST PATH"
            )),
        }
    }

    /// Whether this grant covers normalized `path` (the path itself or below it).
    pub fn holds(&self, path: &str) -> bool {
        within(&self.path, path)
    }
}

impl Scope {
    /// Parses the extension's text (strictly: any line that is not a grant refuses it all).
    pub fn parse(text: &[u8]) -> Result<Self, String> {
        if text.len() > MAX_SCOPE_BYTES {
            return Err(format!("delegation scope over {MAX_SCOPE_BYTES} bytes"));
        }
        let text = std::str::from_utf8(text).map_err(|_| "delegation scope is not UTF-8")?;
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err("not a longhaul delegation scope (version 1)".into());
        }
        let mut grants = Vec::new();
        for line in lines {
            if grants.len() >= MAX_GRANTS {
                return Err(format!("delegation scope over {MAX_GRANTS} grants"));
            }
            grants.push(Grant::parse_line(line)?);
        }
        if grants.is_empty() {
            return Err("a delegation without grants".into());
        }
        Ok(Self { grants })
    }

    /// The extension's text.
    pub fn render(&self) -> String {
        let mut s = String::from(MAGIC);
        for g in &self.grants {
            s.push('\n');
            s.push_str(&g.line());
        }
        s
    }

    /// Whether the scope lets its holder `access` `path` at an endpoint known by `hosts`. A
    /// write grant also allows reading (a copy's resume reads what is there).
    pub fn permits(&self, hosts: &[String], access: Access, path: &str) -> bool {
        let Some(path) = normalize(path) else {
            return false;
        };
        self.grants.iter().any(|g| {
            (g.access == access || g.access == Access::Write)
                && hosts.iter().any(|h| h.eq_ignore_ascii_case(&g.host))
                && within(&g.path, &path)
        })
    }
}

impl Grant {
    /// The grant of `access` to `url` (`haul://host[:port]/path`; the port is not part of it).
    pub fn to_url(access: Access, url: &str) -> Result<Self, String> {
        let rest = url
            .strip_prefix("haul://")
            .ok_or_else(|| format!("{url}: name an endpoint path as haul://host[:port]/path"))?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let host = match authority.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or_default(),
            None => authority.split(':').next().unwrap_or_default(),
        };
        if !is_host_name(host) {
            return Err(format!("{url}: {host:?} is not a host name"));
        }
        let path = normalize(path).ok_or_else(|| format!("{url}: a path may not climb (..)"))?;
        Ok(Self {
            access,
            host: host.to_ascii_lowercase(),
            path,
        })
    }

    /// Parses `read URL` or `write URL` (`haul cert delegate --grant`).
    pub fn parse(spec: &str) -> Result<Self, String> {
        match spec.split_once(' ') {
            Some(("read", url)) => Self::to_url(Access::Read, url.trim()),
            Some(("write", url)) => Self::to_url(Access::Write, url.trim()),
            _ => Err(format!(
                "{spec:?}: give \"read haul://host/path\" or \"write haul://host/path\""
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(lines: &str) -> Scope {
        Scope::parse(format!("{MAGIC}\n{lines}").as_bytes()).unwrap()
    }

    #[test]
    fn a_scope_permits_its_paths_at_its_hosts_only() {
        let s = scope("write dtn.example.org /out\nread dtn.example.org /in/a.dat");
        let h = vec!["dtn.example.org".to_string()];
        assert!(s.permits(&h, Access::Write, "/out"));
        assert!(s.permits(&h, Access::Write, "out/sub/x"));
        assert!(s.permits(&h, Access::Read, "/out/x"), "write implies read");
        assert!(s.permits(&h, Access::Read, "/in/a.dat"));
        assert!(!s.permits(&h, Access::Write, "/in/a.dat"));
        assert!(!s.permits(&h, Access::Read, "/in/a.dat2"));
        assert!(!s.permits(&h, Access::Read, "/in"));
        assert!(!s.permits(&h, Access::Write, "/outside"));
        assert!(!s.permits(&h, Access::Write, "/out/../etc"));
        assert!(!s.permits(&h, Access::Write, "/"));
        assert!(!s.permits(&["other.example.org".into()], Access::Write, "/out"));
        assert!(scope("read h /").permits(&["H".into()], Access::Read, "/any/thing"));
    }

    #[test]
    fn grants_name_endpoint_paths() {
        let g = Grant::parse("write haul://DTN.example.org:2811/out//x/").unwrap();
        assert_eq!(
            g,
            Grant {
                access: Access::Write,
                host: "dtn.example.org".into(),
                path: "/out/x".into()
            }
        );
        assert_eq!(Grant::parse("read haul://[::1]:9/a").unwrap().host, "::1");
        for bad in [
            "exec haul://h/a",
            "read /local/path",
            "read haul://h/../etc",
            "read haul://bad!host/a",
            "read",
        ] {
            assert!(Grant::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn scopes_parse_strictly() {
        for bad in [
            "",
            "longhaul-delegation 2\nread h /",
            "longhaul-delegation 1",
            "longhaul-delegation 1\nexec h /",
            "longhaul-delegation 1\nread h",
            "longhaul-delegation 1\nread h /../x",
            "longhaul-delegation 1\nread bad_host! /x",
        ] {
            assert!(Scope::parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
        let many = format!("{MAGIC}\n{}", vec!["read h /x"; MAX_GRANTS + 1].join("\n"));
        assert!(Scope::parse(many.as_bytes()).is_err());
        assert!(Scope::parse(&[0xff, 0xfe]).is_err());
        let s = scope("read h /a//b/./c");
        assert_eq!(s.grants[0].path, "/a/b/c");
        assert_eq!(Scope::parse(s.render().as_bytes()).unwrap(), s);
    }
}
