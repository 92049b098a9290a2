-- The namespace: every directory and file. Files being written are hidden: their parent is
-- stored negated until the commit that makes them visible (so a pending file never shows in a
-- listing and two writers of one path conflict on the unique key).
CREATE TABLE inodes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    parent INTEGER NOT NULL,
    name TEXT NOT NULL,
    kind INTEGER NOT NULL,            -- 0 directory, 1 file
    owner TEXT NOT NULL,
    grp TEXT NOT NULL,
    mode INTEGER NOT NULL,
    size INTEGER NOT NULL DEFAULT 0,
    mtime_ns INTEGER NOT NULL,
    checksum TEXT NOT NULL DEFAULT '', -- "algo:hex algo:hex"
    UNIQUE (parent, name)
);
INSERT INTO inodes (id, parent, name, kind, owner, grp, mode, size, mtime_ns)
VALUES (1, 0, '', 0, 'root', 'root', 493, 0, 0);

-- User-defined extended attributes.
CREATE TABLE xattrs (
    inode INTEGER NOT NULL REFERENCES inodes(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (inode, name)
);

-- Storage nodes.
CREATE TABLE nodes (
    name TEXT PRIMARY KEY,
    site TEXT NOT NULL,
    address TEXT NOT NULL,
    capacity INTEGER NOT NULL,
    free INTEGER NOT NULL,
    load REAL NOT NULL,
    heartbeat_ms INTEGER NOT NULL,
    registered_ms INTEGER NOT NULL,
    up INTEGER NOT NULL
);

-- Replica catalog: which node holds which file, in which state.
CREATE TABLE replicas (
    inode INTEGER NOT NULL REFERENCES inodes(id) ON DELETE CASCADE,
    node TEXT NOT NULL REFERENCES nodes(name),
    state INTEGER NOT NULL,           -- 0 writing, 1 complete, 2 damaged, 3 missing
    checksum TEXT NOT NULL DEFAULT '',
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (inode, node)
);
CREATE INDEX replicas_by_node ON replicas (node);

-- Replicas of deleted or replaced files that their nodes must remove.
CREATE TABLE dead_replicas (
    inode INTEGER NOT NULL,
    node TEXT NOT NULL,
    since_ms INTEGER NOT NULL,
    PRIMARY KEY (inode, node)
);
