//! The bodies of every gRPC request the metadata server accepts, as an authenticated (or any
//! CA-signed) peer sends them: each decodes without panicking, and what decodes encodes back to
//! a message that decodes and encodes to the same bytes (compared as bytes: a float field may
//! be NaN, which equals nothing; the server treats a NaN load as idle).
#![no_main]
use api::meta as pb;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fn round_trip<M: Message + Default>(bytes: &[u8]) {
    if let Ok(m) = M::decode(bytes) {
        let encoded = m.encode_to_vec();
        let again = M::decode(encoded.as_slice()).expect("re-encoded message decodes");
        assert_eq!(again.encode_to_vec(), encoded);
    }
}

fuzz_target!(|bytes: &[u8]| {
    // The first byte picks the request type, as a method path picks it on the wire.
    let Some((&which, body)) = bytes.split_first() else {
        return;
    };
    match which % 35 {
        0 => round_trip::<pb::PathRequest>(body),
        1 => round_trip::<pb::ListRequest>(body),
        2 => round_trip::<pb::MkdirRequest>(body),
        3 => round_trip::<pb::RemoveRequest>(body),
        4 => round_trip::<pb::RenameRequest>(body),
        5 => round_trip::<pb::ChmodRequest>(body),
        6 => round_trip::<pb::ChownRequest>(body),
        7 => round_trip::<pb::XattrRequest>(body),
        8 => round_trip::<pb::XattrSetRequest>(body),
        9 => round_trip::<pb::StatManyRequest>(body),
        10 => round_trip::<pb::RenewRequest>(body),
        11 => round_trip::<pb::CreateFilesRequest>(body),
        12 => round_trip::<pb::AbortFilesRequest>(body),
        13 => round_trip::<pb::OpenReadRequest>(body),
        14 => round_trip::<pb::ReplicateRequest>(body),
        15 => round_trip::<pb::PolicyRequest>(body),
        16 => round_trip::<pb::VerifyRequest>(body),
        17 => round_trip::<pb::RegisterRequest>(body),
        18 => round_trip::<pb::HeartbeatRequest>(body),
        19 => round_trip::<pb::InventoryRequest>(body),
        20 => round_trip::<pb::ReplicaWrittenRequest>(body),
        21 => round_trip::<pb::RemovedRequest>(body),
        22 => round_trip::<pb::RegisterOutputsRequest>(body),
        23 => round_trip::<pb::DrainRequest>(body),
        24 => round_trip::<pb::RemoveNodeRequest>(body),
        25 => round_trip::<pb::RecordTransferRequest>(body),
        26 => round_trip::<pb::TransfersRequest>(body),
        27 => round_trip::<pb::TransferRequest>(body),
        28 => round_trip::<pb::LiveReport>(body),
        29 => round_trip::<pb::SubmitJobRequest>(body),
        30 => round_trip::<pb::JobsRequest>(body),
        31 => round_trip::<pb::GetJobRequest>(body),
        32 => round_trip::<pb::JobId>(body),
        33 => round_trip::<pb::RetryJobRequest>(body),
        _ => round_trip::<pb::Empty>(body),
    }
});
