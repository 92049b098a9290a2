//! Who is looking at the dashboard. A browser has no grid certificate, so a user proves who
//! they are with their certificate over gRPC (`haul dashboard`), and gets a *login token*:
//! short-lived (2 minutes), good once, signed by this server. The dashboard's `/login`
//! exchanges it for a *session token* (12 hours) kept in an HTTP-only cookie. Tokens carry the
//! user's name only; rights (groups, administrator) are looked up again on every request.
//!
//! Written by hand (HMAC-SHA256 over a small binary payload, hex-encoded) rather than with a
//! JWT crate: two fields and one algorithm, no header to parse and no algorithm to choose, so
//! there is nothing to confuse. The key is random per server start: a restart signs everybody
//! out.

use hmac::{KeyInit, Mac};
use std::collections::HashMap;
use std::sync::Mutex;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// How long a login token may wait to be used.
pub const LOGIN_TTL_MS: i64 = 120_000;
/// How long a dashboard session lasts.
pub const SESSION_TTL_MS: i64 = 12 * 3_600_000;
/// Tokens longer than this are refused before decoding.
const MAX_TOKEN: usize = 600;
/// Login tokens remembered as used (until they expire) at most; beyond it new logins wait.
const MAX_USED: usize = 10_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    Login = 1,
    Session = 2,
}

/// Why a token was refused (said to the browser as one sentence).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the sign-in link is malformed")]
    Malformed,
    #[error("the sign-in link was not made by this metadata server (or it restarted since)")]
    BadSignature,
    #[error("the sign-in link has expired")]
    Expired,
    #[error("the sign-in link was used already; run `haul dashboard` for a new one")]
    Replayed,
    #[error("too many sign-ins at once; try again in a minute")]
    Busy,
}

/// The server's signing key and the login tokens already used.
pub struct WebAuth {
    key: [u8; 32],
    used: Mutex<HashMap<[u8; 16], i64>>,
}

impl Default for WebAuth {
    fn default() -> Self {
        Self::new(rand::random())
    }
}

impl WebAuth {
    pub fn new(key: [u8; 32]) -> Self {
        Self {
            key,
            used: Mutex::new(HashMap::new()),
        }
    }

    fn mac(&self) -> HmacSha256 {
        let mut m = HmacSha256::new_from_slice(&self.key).expect("HMAC accepts any key length");
        m.update(b"longhaul dashboard v1");
        m
    }

    /// A token for `user`, of `purpose`, valid until `now_ms` plus its lifetime.
    pub fn issue(&self, user: &str, purpose: Purpose, now_ms: i64) -> String {
        let ttl = match purpose {
            Purpose::Login => LOGIN_TTL_MS,
            Purpose::Session => SESSION_TTL_MS,
        };
        let nonce: [u8; 16] = rand::random();
        let mut payload = Vec::with_capacity(25 + user.len());
        payload.push(purpose as u8);
        payload.extend_from_slice(&(now_ms + ttl).to_be_bytes());
        payload.extend_from_slice(&nonce);
        payload.extend_from_slice(user.as_bytes());
        let mut m = self.mac();
        m.update(&payload);
        let tag = m.finalize().into_bytes();
        format!("{}.{}", hex::encode(&payload), hex::encode(tag))
    }

    /// The user a token names, if it is genuine, of `purpose`, and unexpired at `now_ms`; a
    /// login token is good once.
    pub fn verify(&self, token: &str, purpose: Purpose, now_ms: i64) -> Result<String, TokenError> {
        if token.len() > MAX_TOKEN {
            return Err(TokenError::Malformed);
        }
        let (p, t) = token.split_once('.').ok_or(TokenError::Malformed)?;
        let payload = hex::decode(p).map_err(|_| TokenError::Malformed)?;
        let tag = hex::decode(t).map_err(|_| TokenError::Malformed)?;
        let mut m = self.mac();
        m.update(&payload);
        m.verify_slice(&tag).map_err(|_| TokenError::BadSignature)?;
        // Signed by us: the layout is ours.
        if payload.len() < 25 || payload[0] != purpose as u8 {
            return Err(TokenError::Malformed);
        }
        let expires = i64::from_be_bytes(payload[1..9].try_into().expect("8 bytes"));
        if now_ms >= expires {
            return Err(TokenError::Expired);
        }
        let user = std::str::from_utf8(&payload[25..])
            .map_err(|_| TokenError::Malformed)?
            .to_string();
        if purpose == Purpose::Login {
            let nonce: [u8; 16] = payload[9..25].try_into().expect("16 bytes");
            let mut used = self.used.lock().expect("used tokens");
            used.retain(|_, exp| *exp > now_ms);
            if used.contains_key(&nonce) {
                return Err(TokenError::Replayed);
            }
            if used.len() >= MAX_USED {
                return Err(TokenError::Busy);
            }
            used.insert(nonce, expires);
        }
        Ok(user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_login_token_is_good_once_and_only_for_logging_in() {
        let w = WebAuth::new([7; 32]);
        let now = 1_000_000;
        let t = w.issue("alice", Purpose::Login, now);
        assert_eq!(
            w.verify(&t, Purpose::Session, now),
            Err(TokenError::Malformed)
        );
        assert_eq!(w.verify(&t, Purpose::Login, now + 1).unwrap(), "alice");
        assert_eq!(
            w.verify(&t, Purpose::Login, now + 2),
            Err(TokenError::Replayed)
        );
        let late = w.issue("alice", Purpose::Login, now);
        assert_eq!(
            w.verify(&late, Purpose::Login, now + LOGIN_TTL_MS),
            Err(TokenError::Expired)
        );
        let s = w.issue("bob", Purpose::Session, now);
        // A session token is used on every request.
        for _ in 0..3 {
            assert_eq!(w.verify(&s, Purpose::Session, now + 5).unwrap(), "bob");
        }
        assert_eq!(
            w.verify(&s, Purpose::Login, now),
            Err(TokenError::Malformed)
        );
        assert_eq!(
            w.verify(&s, Purpose::Session, now + SESSION_TTL_MS),
            Err(TokenError::Expired)
        );
    }

    #[test]
    fn forged_altered_and_garbage_tokens_are_refused() {
        let w = WebAuth::new([7; 32]);
        let other = WebAuth::new([8; 32]);
        let now = 5_000;
        let t = w.issue("alice", Purpose::Session, now);
        assert_eq!(
            other.verify(&t, Purpose::Session, now),
            Err(TokenError::BadSignature)
        );
        // Another user's name (or a later expiry) in a copied token breaks the signature.
        let (p, tag) = t.split_once('.').unwrap();
        let mut payload = hex::decode(p).unwrap();
        *payload.last_mut().unwrap() = b'x';
        let forged = format!("{}.{tag}", hex::encode(&payload));
        assert_eq!(
            w.verify(&forged, Purpose::Session, now),
            Err(TokenError::BadSignature)
        );
        for junk in [
            "",
            ".",
            "zz.zz",
            "00.00",
            &"a".repeat(MAX_TOKEN + 1),
            &t[..t.len() - 1],
            "é.é",
        ] {
            assert!(w.verify(junk, Purpose::Session, now).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn used_login_tokens_are_forgotten_when_they_expire_and_bounded() {
        let w = WebAuth::new([1; 32]);
        for i in 0..MAX_USED {
            let t = w.issue("u", Purpose::Login, i as i64);
            w.verify(&t, Purpose::Login, i as i64).unwrap();
        }
        let t = w.issue("u", Purpose::Login, 0);
        assert_eq!(w.verify(&t, Purpose::Login, 10), Err(TokenError::Busy));
        let later = (MAX_USED as i64) + LOGIN_TTL_MS;
        let t = w.issue("u", Purpose::Login, later);
        assert_eq!(w.verify(&t, Purpose::Login, later).unwrap(), "u");
        assert_eq!(w.used.lock().unwrap().len(), 1);
    }
}
