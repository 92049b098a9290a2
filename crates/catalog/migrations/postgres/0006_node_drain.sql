-- Node drain (issue 15): when an administrator began draining the node (0: not draining), and
-- how many complete replicas it held then (its progress is measured against that).
ALTER TABLE nodes ADD COLUMN drain_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN drain_replicas BIGINT NOT NULL DEFAULT 0;
-- When each replica record was made (0: before this column): a drain tells the copies it
-- made (after it began) from those a file already had.
ALTER TABLE replicas ADD COLUMN created_ms BIGINT NOT NULL DEFAULT 0;
