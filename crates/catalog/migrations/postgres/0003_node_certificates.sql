-- The certificate (SHA-256 fingerprint, "sha256:hex") a node registered with. Its capability
-- key is handed only to a registration with the same certificate; another certificate gets a
-- new key, and only when the enrolment lists it (issue 11 C2).
ALTER TABLE nodes ADD COLUMN cert_fp TEXT NOT NULL DEFAULT '';
