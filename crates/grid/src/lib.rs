//! The grid client: talks to a metadata server (`client`) and moves data to, from and within
//! the grid with the data-plane engine (`copy`). Used by the `haul` command line, storage nodes
//! (which are clients of the metadata server too) and the benchmarks.

pub mod client;
pub mod copy;
pub mod run;

pub use client::{DEFAULT_META_PORT, MetaClient};
