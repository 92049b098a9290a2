-- Transfer history (issue 15): every transfer that touched the grid (uploads, downloads and
-- copies within it, replication, repair, runs), with its summary and per-file outcomes.
CREATE TABLE transfers (
    id BIGSERIAL PRIMARY KEY,
    kind TEXT NOT NULL,               -- upload, download, copy, replicate, repair, reconcile, drain, run
    user_name TEXT NOT NULL,          -- who asked (from the caller's certificate), or "system"
    source TEXT NOT NULL,
    destination TEXT NOT NULL,
    src_site TEXT NOT NULL,
    dst_site TEXT NOT NULL,
    started_ms BIGINT NOT NULL,
    ended_ms BIGINT NOT NULL,
    files BIGINT NOT NULL,
    files_failed BIGINT NOT NULL,
    bytes BIGINT NOT NULL,           -- bytes of the files delivered
    bytes_moved BIGINT NOT NULL,     -- bytes that crossed the network (all attempts)
    streams BIGINT NOT NULL,
    retransmits BIGINT NOT NULL,
    attempts BIGINT NOT NULL,
    error_kind TEXT NOT NULL DEFAULT '',
    exit_code BIGINT NOT NULL DEFAULT 0,
    error TEXT NOT NULL DEFAULT '',
    summary TEXT NOT NULL DEFAULT ''  -- plan, congestion control, bottleneck: the transfer log's summary
);
CREATE INDEX transfers_by_end ON transfers (ended_ms);
CREATE INDEX transfers_by_user ON transfers (user_name, ended_ms);

CREATE TABLE transfer_files (
    transfer BIGINT NOT NULL REFERENCES transfers(id) ON DELETE CASCADE,
    seq BIGINT NOT NULL,
    path TEXT NOT NULL,
    node TEXT NOT NULL DEFAULT '',
    bytes BIGINT NOT NULL,
    checksum TEXT NOT NULL DEFAULT '',
    error_kind TEXT NOT NULL DEFAULT '',
    error TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (transfer, seq)
);
