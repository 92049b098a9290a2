-- Per-file flags. 1: the file arrived over private (TLS) data streams, so its copies travel
-- privately too: replication, policies and repairs never send it in clear (issue 11 C10).
ALTER TABLE inodes ADD COLUMN flags INTEGER NOT NULL DEFAULT 0;
