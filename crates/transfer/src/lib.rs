//! The longhaul transfer engine: drives the `wire` state machines over TCP data streams with
//! tokio, and owns everything that touches the operating system on the data path: sockets and
//! their tuning, TLS, files (confined to an exported root where needed), checksumming threads,
//! restart ledgers. The `haul` binary, and later the storage node and metadata server, are thin
//! layers over [`endpoint::run`] and [`client::copy`].
//!
//! What it does not own: protocol decisions (in `wire`) and the command line (in `haul`).

pub mod certid;
pub mod claims;
pub mod client;
pub mod conn;
pub mod control_pool;
pub mod endpoint;
pub mod error;
pub mod faults;
pub mod identity;
pub mod limits;
pub mod pki;
pub mod pool;
pub mod progress;
pub mod run;
pub mod sink_session;
pub mod source_session;
pub mod spool;
pub mod store;
pub mod sys;
pub mod tls;

pub use error::TransferError;
