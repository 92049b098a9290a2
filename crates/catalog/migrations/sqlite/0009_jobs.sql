-- Transfer jobs (issue 16): work handed to the metadata server, kept across restarts, done
-- file by file by its scheduler, node to node.
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user_name TEXT NOT NULL,          -- the submitter (from the certificate)
    priority INTEGER NOT NULL,        -- 1 (lowest) .. 5 (highest), 3 by default
    state TEXT NOT NULL,              -- queued, running, done, failed, cancelled
    options TEXT NOT NULL,            -- JSON: site, overwrite, tries, deadline, rate, webhook
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    ended_ms INTEGER NOT NULL DEFAULT 0,
    error TEXT NOT NULL DEFAULT '',
    notified INTEGER NOT NULL DEFAULT 0   -- its end was told to its webhook (or it has none)
);
CREATE INDEX jobs_by_state ON jobs (state, id);
CREATE INDEX jobs_by_user ON jobs (user_name, id);

CREATE TABLE job_files (
    job INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    source TEXT NOT NULL,
    destination TEXT NOT NULL,
    size INTEGER NOT NULL,
    state TEXT NOT NULL,              -- queued, running, done, failed, cancelled
    tries INTEGER NOT NULL DEFAULT 0,
    next_ms INTEGER NOT NULL DEFAULT 0,   -- not tried again before (back-off)
    target INTEGER NOT NULL DEFAULT 0,    -- inode id of the copy being written (0: none)
    node TEXT NOT NULL DEFAULT '',
    checksum TEXT NOT NULL DEFAULT '',
    error_kind TEXT NOT NULL DEFAULT '',
    error TEXT NOT NULL DEFAULT '',
    updated_ms INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job, seq)
);
CREATE INDEX job_files_by_state ON job_files (job, state, next_ms);

-- What the jobs' optimizer learned per link (source site, destination site): the number of
-- sessions it settled on and the goodput it measured there, the start for the next job.
CREATE TABLE link_tuning (
    src_site TEXT NOT NULL,
    dst_site TEXT NOT NULL,
    sessions INTEGER NOT NULL,
    goodput_bps REAL NOT NULL,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (src_site, dst_site)
);

-- Which metadata server runs the jobs (several may share a PostgreSQL catalog): the holder
-- renews its lease; another takes over once it ran out.
CREATE TABLE job_lease (
    id INTEGER PRIMARY KEY,
    holder TEXT NOT NULL,
    until_ms INTEGER NOT NULL
);
