//! Capabilities: short-lived permissions the metadata server signs for one storage node, one
//! operation, a set of files and one holder, so that a client cannot bypass the namespace's
//! permissions by talking to nodes directly. The node checks the signature (HMAC-SHA256 with a
//! key it shares with the metadata servers, agreed at registration), its own name, the
//! operation, the files, the expiry, and that the connection presenting the grant is the
//! holder's: the SHA-256 fingerprint of the TLS client certificate must be the one the grant
//! names. A grant is therefore not a bearer token: copied to another user it is useless.

use crate::codec;
use hmac::{KeyInit, Mac};
use serde::{Deserialize, Serialize};

/// What a grant allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operation {
    /// Read (download, or push to another node).
    Read,
    /// Write new replicas.
    Write,
    /// Recompute checksums of replicas (verification).
    Verify,
    /// Run the grant's user's command on replicas (file-affinity computing), and register the
    /// files it writes in the output directory.
    Run,
}

/// The content of a capability.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub node: String,
    pub op: Operation,
    /// Inode ids the grant covers.
    pub ids: Vec<i64>,
    /// `Write` only: ids (of `ids`) whose replica on the node is known to be damaged or
    /// missing, which the write may replace. A node never replaces a replica of any other id
    /// (a write capability replayed after the commit must not destroy the verified copy).
    pub replace: Vec<i64>,
    /// Identity the operation is done for (for logs, and the account of a run).
    pub user: String,
    /// SHA-256 fingerprint of the certificate that may present the grant (the caller's, or the
    /// metadata server's own for its copies). Empty: nobody may.
    pub holder: Vec<u8>,
    /// Milliseconds since the Unix epoch after which the grant is void.
    pub expires_ms: i64,
}

/// A grant with its signature, as carried in requests.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedGrant {
    pub token: Vec<u8>,
    pub mac: Vec<u8>,
}

/// Why a capability was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error("capability signature does not verify (forged, or signed for another node)")]
    BadSignature,
    #[error("capability is malformed: {0}")]
    Malformed(String),
    #[error("capability is for node {0}, not this node")]
    WrongNode(String),
    #[error("capability expired")]
    Expired,
    #[error("capability was issued to another certificate (capabilities are not transferable)")]
    WrongHolder,
    #[error("capability allows {have:?}, not {want:?}")]
    WrongOperation { have: Operation, want: Operation },
    #[error("capability does not cover file {0}")]
    NotCovered(i64),
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

fn mac(key: &[u8], token: &[u8]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC accepts any key length");
    // v2: grants name their holder.
    m.update(b"longhaul capability v2");
    m.update(token);
    m
}

impl Grant {
    /// Encodes and signs the grant with `key`.
    pub fn sign(&self, key: &[u8]) -> SignedGrant {
        let token = postcard::to_allocvec(self).expect("serializing to a Vec cannot fail");
        let tag = mac(key, &token).finalize().into_bytes().to_vec();
        SignedGrant { token, mac: tag }
    }
}

impl SignedGrant {
    /// Signs raw `token` bytes with `key` (for tests and fuzzing of the decoder; grants are
    /// made with [`Grant::sign`]).
    #[doc(hidden)]
    pub fn sign_token(key: &[u8], token: &[u8]) -> SignedGrant {
        SignedGrant {
            token: token.to_vec(),
            mac: mac(key, token).finalize().into_bytes().to_vec(),
        }
    }

    /// Checks the signature, node, operation, expiry and holder (`presenter`: the fingerprint
    /// of the certificate of the connection the grant came on); returns the grant.
    pub fn verify(
        &self,
        key: &[u8],
        node: &str,
        op: Operation,
        now_ms: i64,
        presenter: &[u8],
    ) -> Result<Grant, GrantError> {
        let grant = self.verify_relayed(key, node, op, now_ms)?;
        if grant.holder.is_empty() || grant.holder != presenter {
            return Err(GrantError::WrongHolder);
        }
        Ok(grant)
    }

    /// Checks the signature, node, operation and expiry, not the holder: for a grant relayed by
    /// the node it was issued for (which checked its holder when it was presented), e.g. the
    /// run grant a node sends with the outputs of its tasks.
    pub fn verify_relayed(
        &self,
        key: &[u8],
        node: &str,
        op: Operation,
        now_ms: i64,
    ) -> Result<Grant, GrantError> {
        if self.token.len() > codec::MAX_MESSAGE_LEN as usize {
            return Err(GrantError::Malformed("too long".into()));
        }
        mac(key, &self.token)
            .verify_slice(&self.mac)
            .map_err(|_| GrantError::BadSignature)?;
        let grant: Grant =
            codec::decode_body(&self.token).map_err(|e| GrantError::Malformed(e.to_string()))?;
        if grant.node != node {
            return Err(GrantError::WrongNode(grant.node));
        }
        if grant.op != op {
            return Err(GrantError::WrongOperation {
                have: grant.op,
                want: op,
            });
        }
        if now_ms > grant.expires_ms {
            return Err(GrantError::Expired);
        }
        Ok(grant)
    }
}

impl Grant {
    /// Errors unless every id is covered.
    pub fn covers(&self, ids: impl IntoIterator<Item = i64>) -> Result<(), GrantError> {
        for id in ids {
            if !self.ids.contains(&id) {
                return Err(GrantError::NotCovered(id));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: [u8; 32] = [0xa1; 32];

    fn grant() -> Grant {
        Grant {
            node: "n1".into(),
            op: Operation::Write,
            ids: vec![7, 9],
            replace: vec![],
            user: "alice".into(),
            holder: ALICE.to_vec(),
            expires_ms: 1000,
        }
    }

    #[test]
    fn a_signed_grant_verifies_only_as_issued() {
        let key = [1u8; 32];
        let s = grant().sign(&key);
        let verify =
            |s: &SignedGrant, key: &[u8], node, op, now| s.verify(key, node, op, now, &ALICE);
        assert_eq!(
            verify(&s, &key, "n1", Operation::Write, 999).unwrap(),
            grant()
        );
        assert_eq!(
            verify(&s, &[2u8; 32], "n1", Operation::Write, 999),
            Err(GrantError::BadSignature)
        );
        assert_eq!(
            verify(&s, &key, "n2", Operation::Write, 999),
            Err(GrantError::WrongNode("n1".into()))
        );
        assert!(matches!(
            verify(&s, &key, "n1", Operation::Read, 999),
            Err(GrantError::WrongOperation { .. })
        ));
        assert_eq!(
            verify(&s, &key, "n1", Operation::Write, 1001),
            Err(GrantError::Expired)
        );
        let mut tampered = s.clone();
        tampered.token[3] ^= 1;
        assert_eq!(
            verify(&tampered, &key, "n1", Operation::Write, 0),
            Err(GrantError::BadSignature)
        );
        let g = verify(&s, &key, "n1", Operation::Write, 0).unwrap();
        assert!(g.covers([7, 9]).is_ok());
        assert_eq!(g.covers([7, 8]), Err(GrantError::NotCovered(8)));
    }

    /// Issue 11 C11: capabilities were bearer tokens; another user holding one could use it.
    #[test]
    fn a_grant_serves_only_its_holder() {
        let key = [1u8; 32];
        let s = grant().sign(&key);
        assert_eq!(
            s.verify(&key, "n1", Operation::Write, 0, &[0xb0; 32]),
            Err(GrantError::WrongHolder)
        );
        assert_eq!(
            s.verify(&key, "n1", Operation::Write, 0, &[]),
            Err(GrantError::WrongHolder)
        );
        // A grant for nobody serves nobody, not even a presenter without a certificate.
        let nobody = Grant {
            holder: vec![],
            ..grant()
        }
        .sign(&key);
        assert_eq!(
            nobody.verify(&key, "n1", Operation::Write, 0, &[]),
            Err(GrantError::WrongHolder)
        );
        // Relayed by its node: the holder is not checked, everything else is.
        assert!(s.verify_relayed(&key, "n1", Operation::Write, 0).is_ok());
        assert_eq!(
            s.verify_relayed(&key, "n1", Operation::Write, 2000),
            Err(GrantError::Expired)
        );
        // The v1 signature domain is gone: a grant signed the old way does not verify.
        let mut m = HmacSha256::new_from_slice(&key).unwrap();
        m.update(b"longhaul capability v1");
        m.update(&s.token);
        let v1 = SignedGrant {
            token: s.token.clone(),
            mac: m.finalize().into_bytes().to_vec(),
        };
        assert_eq!(
            v1.verify(&key, "n1", Operation::Write, 0, &ALICE),
            Err(GrantError::BadSignature)
        );
    }
}
