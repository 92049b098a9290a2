//! The JSON documents commands print on stdout with `--json`: each one object carrying
//! `"version"` (the number of its schema, raised when a field changes meaning or goes away;
//! new fields do not raise it), with lists under a named key, times in RFC 3339, checksums as
//! `{algorithm: hex}` and failures as `{kind, exit_code, message}`. README's "JSON output"
//! lists each command's document.

use serde::Serialize;
use serde_json::Value;

/// The schema version of every document this build prints.
pub const VERSION: u32 = 1;

/// `doc` with its `version`: an object gets the field; anything else is wrapped as
/// `{"version", "value"}` (no command prints one; kept total rather than panicking).
pub fn versioned(doc: Value) -> Value {
    match doc {
        Value::Object(mut o) => {
            o.insert("version".into(), VERSION.into());
            Value::Object(o)
        }
        other => serde_json::json!({ "version": VERSION, "value": other }),
    }
}

/// Prints `doc` with its version on one line of stdout.
pub fn print(doc: Value) {
    out!("{}", versioned(doc));
}

/// Prints a serializable report with its version.
pub fn print_report<T: Serialize>(report: &T) {
    print(serde_json::to_value(report).unwrap_or(Value::Null));
}

/// A list printed as `{"version", key: [...]}`.
pub fn print_list(key: &str, items: Vec<Value>) {
    let mut o = serde_json::Map::new();
    o.insert(key.into(), Value::Array(items));
    print(Value::Object(o));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_document_is_an_object_with_its_version() {
        let v = versioned(serde_json::json!({"a": 1}));
        assert_eq!(v, serde_json::json!({"a": 1, "version": VERSION}));
        let v = versioned(serde_json::json!([1, 2]));
        assert_eq!(v["version"], VERSION);
        assert_eq!(v["value"], serde_json::json!([1, 2]));
    }
}
