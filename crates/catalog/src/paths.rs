//! Namespace paths: absolute, `/`-separated, no `.` or `..` components, names of 1–255 bytes
//! without NUL.

use crate::CatalogError;

/// `/a//b/./c/` -> `/a/b/c`; `..` is refused (the namespace has no symlinks, so there is no
/// reason for it, and refusing it keeps every path's meaning obvious).
pub fn normalize(path: &str) -> Result<String, CatalogError> {
    let mut out = String::with_capacity(path.len() + 1);
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                return Err(CatalogError::Invalid(format!(
                    "{path}: '..' is not allowed in grid paths"
                )));
            }
            p if p.len() > 255 => {
                return Err(CatalogError::Invalid(format!(
                    "{path}: a name is longer than 255 bytes"
                )));
            }
            p if p.contains('\0') => {
                return Err(CatalogError::Invalid(format!("{path:?}: NUL in path")));
            }
            p => {
                out.push('/');
                out.push_str(p);
            }
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// `/a/b/c` -> (`/a/b`, `c`); the root has no name.
pub fn parent_and_name(path: &str) -> Result<(String, String), CatalogError> {
    let norm = normalize(path)?;
    match norm.rfind('/') {
        Some(0) if norm.len() == 1 => Err(CatalogError::Invalid("the root has no parent".into())),
        Some(0) => Ok(("/".into(), norm[1..].to_string())),
        Some(i) => Ok((norm[..i].to_string(), norm[i + 1..].to_string())),
        None => Err(CatalogError::Invalid(format!(
            "{path}: not an absolute path"
        ))),
    }
}

/// `dir` + `/` + `name`.
pub fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizing() {
        assert_eq!(normalize("/a//b/./c/").unwrap(), "/a/b/c");
        assert_eq!(normalize("").unwrap(), "/");
        assert_eq!(normalize("a/b").unwrap(), "/a/b");
        assert!(normalize("/a/../b").is_err());
        assert_eq!(parent_and_name("/x").unwrap(), ("/".into(), "x".into()));
        assert_eq!(parent_and_name("/x/y/").unwrap(), ("/x".into(), "y".into()));
        assert!(parent_and_name("/").is_err());
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/d", "a"), "/d/a");
    }
}
