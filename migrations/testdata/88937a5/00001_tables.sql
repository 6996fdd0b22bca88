-- fencelock schema v2, part 1: the schema and its tables. The functions
-- that read and write them are in 00002_functions.sql; an application
-- role reaches the tables only through those functions (SECURITY DEFINER),
-- so it needs no privilege on the tables at all.

-- +goose Up
CREATE SCHEMA fencelock;

COMMENT ON SCHEMA fencelock IS 'fencelock: fencing tokens and fenced, idempotent writes (installed by fencelock''s goose migrations, version table fencelock_db_version; do not edit by hand). Application roles need USAGE on this schema and EXECUTE on its functions, nothing else.';

-- The newest token seen per resource. Only ever raised (or re-claimed by
-- the same holder with the same token).
CREATE TABLE fencelock.fence (
    resource   text        PRIMARY KEY CHECK (resource <> ''),
    token      bigint      NOT NULL CHECK (token > 0),
    holder     text        NOT NULL CHECK (holder <> ''),
    updated_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE fencelock.fence IS 'Newest fencing token seen per resource (lock name). A write fenced by fencelock commits only if its token is this one; rows are never pruned, they are what rejects stale holders. Written only by fencelock.claim/advance/close.';
COMMENT ON COLUMN fencelock.fence.resource IS 'Lock name the token belongs to.';
COMMENT ON COLUMN fencelock.fence.token IS 'Highest token claimed so far; never decreases.';
COMMENT ON COLUMN fencelock.fence.holder IS 'Holder id that claimed the token (the same token with another holder is refused).';
COMMENT ON COLUMN fencelock.fence.updated_at IS 'When the token was last raised.';

-- Idempotency keys applied per resource: a batch with a recorded key is
-- never applied a second time, whoever holds the lock.
CREATE TABLE fencelock.applied (
    resource   text        NOT NULL CHECK (resource <> ''),
    key        text        NOT NULL CHECK (key <> ''),
    token      bigint      NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (resource, key)
);

CREATE INDEX applied_applied_at_idx ON fencelock.applied (applied_at);

COMMENT ON TABLE fencelock.applied IS 'Idempotency keys applied per resource: a fenced write with a recorded key is refused (FL003) whoever holds the lock. Old rows are deleted by fencelock.prune (pgfence Store.Prune).';
COMMENT ON COLUMN fencelock.applied.token IS 'Token of the transaction that applied the key.';
COMMENT ON COLUMN fencelock.applied.applied_at IS 'Commit time of that transaction; prune deletes by it.';

-- Resumable runs: a long batch split into fenced steps; the cursor says
-- where the next holder resumes, finished makes the run a no-op.
--
-- Every step rewrites its run's row (token, cursor, updated_at). No index
-- covers those columns, so the rewrite is a HOT update (no index entries
-- to add) as long as the page has room: hence the fillfactor. Only
-- finishing a run sets finished and finished_at, the indexed columns that
-- prune looks runs up by.
CREATE TABLE fencelock.runs (
    resource    text        NOT NULL CHECK (resource <> ''),
    run_key     text        NOT NULL CHECK (run_key <> ''),
    token       bigint      NOT NULL,
    cursor      text        NOT NULL DEFAULT '',
    finished    boolean     NOT NULL DEFAULT false,
    finished_at timestamptz,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (resource, run_key),
    CHECK (finished = (finished_at IS NOT NULL))
) WITH (fillfactor = 70);

CREATE INDEX runs_finished_at_idx ON fencelock.runs (finished_at) WHERE finished;

COMMENT ON TABLE fencelock.runs IS 'Resumable runs (pgfence Store.Run): a long batch in fenced steps. cursor is where the next holder resumes; a finished run refuses further steps (FL004). fillfactor 70 keeps the per-step rewrite a HOT update. Finished runs are deleted by fencelock.prune.';
COMMENT ON COLUMN fencelock.runs.token IS 'Token of the last step (or of the finish).';
COMMENT ON COLUMN fencelock.runs.cursor IS 'Cursor committed by the last step ('''' before the first).';
COMMENT ON COLUMN fencelock.runs.finished IS 'The run is done: every later step, by any holder, is refused.';

-- +goose Down
-- The functions (00002) are gone by now; a table or other object someone
-- added to the schema makes this fail rather than vanish with it.
DROP TABLE fencelock.runs;
DROP TABLE fencelock.applied;
DROP TABLE fencelock.fence;
DROP SCHEMA fencelock;
