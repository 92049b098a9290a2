//! The longhaul transfer engine: drives the `wire` state machines over TCP data streams with
//! tokio, and owns everything that touches the operating system on the data path: sockets and
//! their tuning, TLS, files (confined to an exported root where needed), checksumming threads,
//! restart ledgers. The `haul` binary, the storage node and the metadata server are layers over
//! [`endpoint::run`] (with a [`service::Service`] that says what is served) and
//! [`client::copy`]. It knows nothing of storage nodes, catalogs or capabilities beyond
//! passing a grant from a client to the service.
//!
//! What it does not own: protocol decisions (in `wire`) and the command line (in `haul`).

pub mod attempt;
pub mod certid;
pub mod claims;
pub mod client;
pub mod conn;
pub mod control_pool;
pub mod delegation;
pub mod doctor;
pub mod endpoint;
pub mod error;
pub mod faults;
pub mod http;
pub mod identity;
pub mod limits;
pub mod metrics;
pub mod perf;
pub mod pki;
pub mod pool;
pub mod progress;
pub mod service;
pub mod sink_session;
pub mod source_session;
pub mod store;
pub mod sys;
pub mod timer;
pub mod tls;
pub mod trace;
pub mod translog;
pub mod tree;

pub use error::TransferError;
