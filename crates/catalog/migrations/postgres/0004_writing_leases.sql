-- Until when a replica being written is held by the session writing it (milliseconds since the
-- epoch; renewed while the session runs). A replica of a committed file still being written
-- after its lease ended belongs to a session that died with its metadata server: it is
-- dropped, so that it no longer blocks its node (issue 11 C8). 0: no lease (uploads, whose
-- rows live and die with their pending file).
ALTER TABLE replicas ADD COLUMN lease_ms BIGINT NOT NULL DEFAULT 0;
