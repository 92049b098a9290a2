//! The metadata server's gRPC API (`proto/haul/meta/v1/meta.proto`) and its generated code,
//! nothing else: clients, storage nodes and the metadata server all build on these types.

/// `haul.meta.v1`.
pub mod meta {
    include!(concat!(env!("OUT_DIR"), "/haul.meta.v1.rs"));
}
