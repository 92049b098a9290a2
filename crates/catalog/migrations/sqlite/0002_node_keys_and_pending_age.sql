-- The key a node's capabilities are signed with: kept in the catalog so that every metadata
-- server sharing it signs alike, and a node keeps its key across restarts.
ALTER TABLE nodes ADD COLUMN cap_key BLOB NOT NULL DEFAULT X'';
-- When a pending file was started (stale ones are dropped after a grace period).
ALTER TABLE inodes ADD COLUMN ctime_ms INTEGER NOT NULL DEFAULT 0;
CREATE INDEX inodes_pending ON inodes (ctime_ms) WHERE parent < 0;
CREATE INDEX replicas_by_state ON replicas (state, node);
-- The root is world-writable with the sticky bit (like /tmp): anyone may create a top-level
-- directory, and only its owner may remove or rename it.
UPDATE inodes SET mode = 1023 WHERE id = 1 AND mode = 493;
