-- Transfer history (issue 15): every transfer that touched the grid (uploads, downloads and
-- copies within it, replication, repair, runs), with its summary and per-file outcomes.
CREATE TABLE transfers (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,               -- upload, download, copy, replicate, repair, reconcile, drain, run
    user_name TEXT NOT NULL,          -- who asked (from the caller's certificate), or "system"
    source TEXT NOT NULL,
    destination TEXT NOT NULL,
    src_site TEXT NOT NULL,
    dst_site TEXT NOT NULL,
    started_ms INTEGER NOT NULL,
    ended_ms INTEGER NOT NULL,
    files INTEGER NOT NULL,
    files_failed INTEGER NOT NULL,
    bytes INTEGER NOT NULL,           -- bytes of the files delivered
    bytes_moved INTEGER NOT NULL,     -- bytes that crossed the network (all attempts)
    streams INTEGER NOT NULL,
    retransmits INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    error_kind TEXT NOT NULL DEFAULT '',
    exit_code INTEGER NOT NULL DEFAULT 0,
    error TEXT NOT NULL DEFAULT '',
    summary TEXT NOT NULL DEFAULT ''  -- plan, congestion control, bottleneck: the transfer log's summary
);
CREATE INDEX transfers_by_end ON transfers (ended_ms);
CREATE INDEX transfers_by_user ON transfers (user_name, ended_ms);

CREATE TABLE transfer_files (
    transfer INTEGER NOT NULL REFERENCES transfers(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    path TEXT NOT NULL,
    node TEXT NOT NULL DEFAULT '',
    bytes INTEGER NOT NULL,
    checksum TEXT NOT NULL DEFAULT '',
    error_kind TEXT NOT NULL DEFAULT '',
    error TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (transfer, seq)
);
