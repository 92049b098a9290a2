-- The namespace: every directory and file. Files being written are hidden: their parent is
-- stored negated until the commit that makes them visible (so a pending file never shows in a
-- listing and two writers of one path conflict on the unique key).
CREATE TABLE inodes (
    id BIGSERIAL PRIMARY KEY,
    parent BIGINT NOT NULL,
    name TEXT NOT NULL,
    kind BIGINT NOT NULL,             -- 0 directory, 1 file
    owner TEXT NOT NULL,
    grp TEXT NOT NULL,
    mode BIGINT NOT NULL,
    size BIGINT NOT NULL DEFAULT 0,
    mtime_ns BIGINT NOT NULL,
    checksum TEXT NOT NULL DEFAULT '', -- "algo:hex algo:hex"
    UNIQUE (parent, name)
);
INSERT INTO inodes (id, parent, name, kind, owner, grp, mode, size, mtime_ns)
VALUES (1, 0, '', 0, 'root', 'root', 493, 0, 0);
SELECT setval('inodes_id_seq', 1);

-- User-defined extended attributes.
CREATE TABLE xattrs (
    inode BIGINT NOT NULL REFERENCES inodes(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    value BYTEA NOT NULL,
    PRIMARY KEY (inode, name)
);

-- Storage nodes.
CREATE TABLE nodes (
    name TEXT PRIMARY KEY,
    site TEXT NOT NULL,
    address TEXT NOT NULL,
    capacity BIGINT NOT NULL,
    free BIGINT NOT NULL,
    load DOUBLE PRECISION NOT NULL,
    heartbeat_ms BIGINT NOT NULL,
    registered_ms BIGINT NOT NULL,
    up BIGINT NOT NULL
);

-- Replica catalog: which node holds which file, in which state.
CREATE TABLE replicas (
    inode BIGINT NOT NULL REFERENCES inodes(id) ON DELETE CASCADE,
    node TEXT NOT NULL REFERENCES nodes(name),
    state BIGINT NOT NULL,            -- 0 writing, 1 complete, 2 damaged, 3 missing
    checksum TEXT NOT NULL DEFAULT '',
    updated_ms BIGINT NOT NULL,
    PRIMARY KEY (inode, node)
);
CREATE INDEX replicas_by_node ON replicas (node);

-- Replicas of deleted or replaced files that their nodes must remove.
CREATE TABLE dead_replicas (
    inode BIGINT NOT NULL,
    node TEXT NOT NULL,
    since_ms BIGINT NOT NULL,
    PRIMARY KEY (inode, node)
);
