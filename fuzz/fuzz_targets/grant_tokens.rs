//! Capabilities a node receives: any token, correctly signed or not, is checked without
//! panicking, a decoded grant signs back to the same token, and only its holder may present it.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wire::grant::{Operation, SignedGrant};

const KEY: [u8; 32] = [7; 32];
const HOLDER: [u8; 32] = [9; 32];

fuzz_target!(|bytes: &[u8]| {
    // As received: a token with a signature that does not verify.
    let forged = SignedGrant {
        token: bytes.to_vec(),
        mac: vec![0; 32],
    };
    assert!(forged.verify(&KEY, "n1", Operation::Read, 0, &HOLDER).is_err());
    assert!(forged.verify_relayed(&KEY, "n1", Operation::Read, 0).is_err());
    // Signed by the metadata server (a valid MAC over arbitrary bytes): the decoder runs.
    let signed = SignedGrant::sign_token(&KEY, bytes);
    for op in [Operation::Read, Operation::Write, Operation::Verify, Operation::Run] {
        if let Ok(g) = signed.verify_relayed(&KEY, "n1", op, 0) {
            assert_eq!(g.op, op);
            assert_eq!(g.node, "n1");
            // Only its holder may present it.
            let by_holder = signed.verify(&KEY, "n1", op, 0, &HOLDER);
            assert_eq!(by_holder.is_ok(), g.holder == HOLDER);
            let again = g.sign(&KEY);
            assert!(again.verify_relayed(&KEY, "n1", op, 0).is_ok());
            assert_eq!(again.verify(&KEY, "n1", op, 0, &g.holder).is_ok(), !g.holder.is_empty());
        }
    }
});
