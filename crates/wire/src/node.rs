//! The storage node's own requests, carried in the control channel's `Service` frames
//! ([`crate::control::Request::Service`]): re-reading replicas where they are (`Verify`) and
//! running a command on them (`Run`, then `Task`s, then `RunEnd`). The data-plane engine
//! passes these bodies on unread; only a storage node and its clients (the metadata server's
//! verifier, `haul run`) decode them.

use crate::checksum::Digest;
use crate::codec::{self, DecodeError};
use crate::control::ListedFile;
use crate::error::ErrorInfo;
use crate::grant::SignedGrant;
use serde::{Deserialize, Serialize};

/// Client to storage node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeRequest {
    /// Recompute the checksums of these replicas where they are (a `Verify` grant covers
    /// them); answered by `Verified`.
    Verify {
        files: Vec<ListedFile>,
        grant: Option<SignedGrant>,
    },
    /// Start running `argv` on replicas, at most `parallel` processes at a time, as the user a
    /// `Run` grant names; answered by `RunReady`, then one `TaskDone` per `Task`, then
    /// `RunDone` after `RunEnd`.
    Run(Box<RunSpec>),
    /// One task of the running `Run`: the command on one replica.
    Task(RunTask),
    /// No more tasks: answer `RunDone` when the running ones have finished.
    RunEnd,
}

/// Storage node to client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeResponse {
    Verified(Vec<VerifyResult>),
    /// A `Run` was accepted: tasks run as `user`, at most `slots` at a time.
    RunReady {
        user: String,
        slots: u32,
    },
    TaskDone(Box<TaskResult>),
    RunDone,
}

impl NodeRequest {
    /// The body of a `Service` request.
    pub fn encode(&self) -> Vec<u8> {
        codec::encode_body(self)
    }

    pub fn decode(body: &[u8]) -> Result<Self, DecodeError> {
        codec::decode_body(body)
    }
}

impl NodeResponse {
    /// The body of a `Service` response.
    pub fn encode(&self) -> Vec<u8> {
        codec::encode_body(self)
    }

    pub fn decode(body: &[u8]) -> Result<Self, DecodeError> {
        codec::decode_body(body)
    }
}

/// A command to run on replicas where they are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpec {
    /// Program and arguments; `{}` becomes the replica's local path, `{name}` the grid file's
    /// name, `{path}` its grid path, `{out}` the task's output directory.
    pub argv: Vec<String>,
    /// Grid directory where files written to `{out}` are registered (empty: none).
    pub output: String,
    pub parallel: u32,
    /// Seconds a task may run before it is killed (0: no limit).
    pub timeout_s: u32,
    pub grant: Option<SignedGrant>,
}

/// One task: the command on one file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunTask {
    pub task: u64,
    /// The replica (locator: file id; name: grid path). An empty locator runs on an empty
    /// input (empty files have no replicas).
    pub file: ListedFile,
}

/// How a task ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskResult {
    pub task: u64,
    /// Exit status, if the process exited.
    pub exit: Option<i32>,
    /// Signal that killed it, if one did.
    pub signal: Option<i32>,
    /// The first bytes of its standard output and error.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Bytes of output beyond what was kept.
    pub truncated: u64,
    /// From start to exit, on the node.
    pub micros: u64,
    /// Output files registered in the grid: (grid path, size).
    pub outputs: Vec<(String, u64)>,
    /// The task could not run, or its outputs could not be registered.
    pub error: Option<ErrorInfo>,
}

/// What a node found when it re-read a replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyResult {
    pub locator: String,
    /// Size on disk (0 if missing).
    pub size: u64,
    /// Checksums recomputed from the bytes on disk.
    pub digests: Vec<Digest>,
    /// Why it could not be read (missing, unreadable).
    pub error: Option<ErrorInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{self, Request, Response};
    use crate::error::ErrorKind;

    #[test]
    fn node_messages_round_trip_inside_service_frames() {
        let reqs = [
            NodeRequest::Verify {
                files: vec![],
                grant: None,
            },
            NodeRequest::Run(Box::new(RunSpec {
                argv: vec!["wc".into(), "-l".into(), "{}".into()],
                output: "/out".into(),
                parallel: 4,
                timeout_s: 0,
                grant: None,
            })),
            NodeRequest::RunEnd,
        ];
        let mut fb = codec::FrameBuffer::new();
        for r in &reqs {
            fb.extend(&Request::Service(r.encode()).encode());
        }
        for r in &reqs {
            let (h, body) = fb.next_frame(control::limits).unwrap().unwrap();
            let Request::Service(inner) = control::decode_request(h, &body).unwrap() else {
                panic!("not a service request");
            };
            assert_eq!(&NodeRequest::decode(&inner).unwrap(), r);
        }
        let resps = [
            NodeResponse::TaskDone(Box::new(TaskResult {
                task: 3,
                exit: Some(1),
                stdout: b"12 x\n".to_vec(),
                outputs: vec![("/out/x.txt".into(), 5)],
                error: Some(ErrorInfo::new(ErrorKind::NotFound, "gone")),
                ..Default::default()
            })),
            NodeResponse::RunDone,
        ];
        for resp in resps {
            fb.extend(&Response::Service(resp.encode()).encode());
            let (h, body) = fb.next_frame(control::limits).unwrap().unwrap();
            let Response::Service(inner) = control::decode_response(h, &body).unwrap() else {
                panic!("not a service response");
            };
            assert_eq!(NodeResponse::decode(&inner).unwrap(), resp);
        }
    }

    #[test]
    fn garbage_and_trailing_bytes_are_refused() {
        assert!(NodeRequest::decode(&[0xff, 0xff, 0xff]).is_err());
        let mut body = NodeRequest::RunEnd.encode();
        body.push(0);
        assert!(NodeRequest::decode(&body).is_err());
    }
}
