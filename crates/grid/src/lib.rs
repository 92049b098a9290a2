//! The grid client: talks to a metadata server (`client`) and moves data to, from and within
//! the grid with the data-plane engine (`copy`). Used by the `haul` command line, storage nodes
//! (which are clients of the metadata server too) and the benchmarks.

pub mod client;
pub mod copy;
pub mod history;
pub mod live;
pub mod run;

pub use client::{DEFAULT_META_PORT, MetaClient};

/// The messages of the grid API that its users read and write: requests to the metadata
/// server and what it answers (generated from `meta.proto`; see the `api` crate).
pub mod types {
    pub use api::meta::{
        Entry, FileError, GetJobRequest, JobDetail, JobFileInfo, JobInfo, JobLink, JobPair,
        JobsReply, JobsRequest, LiveCopy, NodeInfo, OpenReadRequest, Policy, PolicyRequest,
        ReadSource, ReplicaInfo, ReplicateRequest, SubmitJobRequest, Transfer, TransferFile,
        TransferReply, TransfersRequest, VerifyRequest,
    };
}
