//! The longhaul wire protocol as pure state machines: frames and their codecs, the source and
//! sink sides of a transfer session, restart ledgers, stream planning, pacing and retry
//! decisions. This crate does no I/O and reads no clock: time comes in as arguments, so a whole
//! transfer over simulated streams runs in a unit test (see `sim` tests).
//!
//! What it does not own: sockets, files, TLS and threads (the `transfer` crate drives these
//! state machines), and the user interface (`haul`).

pub mod bottleneck;
pub mod checksum;
pub mod codec;
pub mod control;
pub mod data;
pub mod delegation;
pub mod error;
pub mod grant;
pub mod known_crcs;
pub mod losscause;
pub mod node;
pub mod pacing;
pub mod perf;
pub mod plan;
pub mod ranges;
pub mod retry;
pub mod sink;
pub mod source;
pub mod units;

#[cfg(test)]
mod sim;

pub use checksum::{Algorithm, Digest};
pub use data::FileId;
pub use error::{ErrorInfo, ErrorKind};
pub use ranges::RangeSet;
