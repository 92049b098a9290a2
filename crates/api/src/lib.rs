//! The metadata server's gRPC API (`proto/haul/meta/v1/meta.proto`) and its generated code,
//! nothing else: clients, storage nodes and the metadata server all build on these types.

/// The gRPC metadata key (trailer) in which the metadata server names an error's kind
/// ("not_empty", "busy", "not_found", ...) beside its status code, so that clients decide on
/// the kind, never on the message.
pub const ERROR_KIND_KEY: &str = "haul-kind";

/// `haul.meta.v1`.
pub mod meta {
    include!(concat!(env!("OUT_DIR"), "/haul.meta.v1.rs"));
}
