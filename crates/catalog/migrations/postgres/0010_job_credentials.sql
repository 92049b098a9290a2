-- The delegation a job acts with at standalone endpoints (PEM chain and key, as JSON), held
-- for the job's life only: cleared when the job ends.
ALTER TABLE jobs ADD COLUMN credential TEXT NOT NULL DEFAULT '';
-- What a standalone endpoint's listing said of a source file (mtime, mode): the grid copy
-- is created with them.
ALTER TABLE job_files ADD COLUMN src_mtime_ns BIGINT NOT NULL DEFAULT 0;
ALTER TABLE job_files ADD COLUMN src_mode BIGINT NOT NULL DEFAULT 0;
