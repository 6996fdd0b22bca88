-- fencelock schema: fencing tokens, applied idempotency keys, resumable
-- runs, the claim function and the table-protection trigger function.
--
-- SQLSTATEs raised here (class FL is not used by Postgres):
--   FL001  stale token: a higher token (or the same token with another
--          holder) has already been seen for the resource. DETAIL is a JSON
--          object {"resource": ..., "token": ..., "current": ...}.
--   FL002  write to a protected table without a fence claim in the
--          transaction.
--   FL003  idempotency key already applied. DETAIL is JSON
--          {"resource": ..., "key": ..., "token": <token that applied it>}.
--   FL004  resumable run already finished. DETAIL is JSON
--          {"resource": ..., "run_key": ..., "token": ...}.
--   22023  invalid argument (empty resource, token <= 0, empty holder, ...).
--
-- The functions name every object with its schema and are not SECURITY
-- DEFINER, so they carry no SET search_path clause: it would cost a
-- settings save and restore on every claim, the hot path of every guarded
-- transaction.

-- +goose Up
CREATE SCHEMA fencelock;

COMMENT ON SCHEMA fencelock IS 'fencelock: fencing tokens and fenced, idempotent writes (managed by goose migrations; do not edit by hand)';

-- The newest token seen per resource. Only ever raised (or re-claimed by
-- the same holder with the same token).
CREATE TABLE fencelock.fence (
    resource   text        PRIMARY KEY CHECK (resource <> ''),
    token      bigint      NOT NULL CHECK (token > 0),
    holder     text        NOT NULL CHECK (holder <> ''),
    updated_at timestamptz NOT NULL DEFAULT now()
);

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

-- Resumable runs: a long batch split into fenced steps; the cursor says
-- where the next holder resumes, finished makes the run a no-op.
CREATE TABLE fencelock.runs (
    resource   text        NOT NULL CHECK (resource <> ''),
    run_key    text        NOT NULL CHECK (run_key <> ''),
    token      bigint      NOT NULL,
    cursor     text        NOT NULL DEFAULT '',
    finished   boolean     NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (resource, run_key)
);

CREATE INDEX runs_finished_updated_at_idx ON fencelock.runs (updated_at) WHERE finished;

-- claim accepts p_token for p_resource if it is higher than the stored one
-- (and stores it) or equal to it with the same holder; otherwise it raises
-- FL001. With p_key it then records that idempotency key (see apply_key):
-- one statement instead of two in the round trip that opens a guarded
-- transaction. It locks only the fence row, until the end of the transaction, so
-- a later claim with a higher token waits for this transaction to end:
-- committed tokens per resource never decrease. It records the claim in
-- transaction-local settings that the protect trigger checks. Returns the
-- previously stored token (0 when the resource was new).
-- +goose StatementBegin
CREATE FUNCTION fencelock.claim(p_resource text, p_token bigint, p_holder text, p_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    cur        bigint;
    cur_holder text;
BEGIN
    IF p_resource IS NULL OR p_resource = '' THEN
        RAISE EXCEPTION 'fencelock: claim: empty resource name' USING ERRCODE = '22023';
    END IF;
    IF p_token IS NULL OR p_token <= 0 THEN
        RAISE EXCEPTION 'fencelock: claim: token must be > 0, got %', coalesce(p_token::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    IF p_holder IS NULL OR p_holder = '' THEN
        RAISE EXCEPTION 'fencelock: claim: empty holder' USING ERRCODE = '22023';
    END IF;

    -- Under READ COMMITTED each statement sees the latest committed row;
    -- FOR UPDATE waits for a concurrent claimer and then re-reads.
    SELECT f.token, f.holder INTO cur, cur_holder
      FROM fencelock.fence f WHERE f.resource = p_resource FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO fencelock.fence (resource, token, holder)
        VALUES (p_resource, p_token, p_holder)
        ON CONFLICT (resource) DO NOTHING;
        IF FOUND THEN
            cur := 0;
        ELSE
            -- A concurrent first claim won the insert: compare with it.
            SELECT f.token, f.holder INTO cur, cur_holder
              FROM fencelock.fence f WHERE f.resource = p_resource FOR UPDATE;
        END IF;
    END IF;

    IF cur <> 0 THEN
        IF p_token > cur THEN
            UPDATE fencelock.fence SET token = p_token, holder = p_holder, updated_at = now()
             WHERE resource = p_resource;
        ELSIF p_token = cur AND p_holder = cur_holder THEN
            NULL; -- re-claim by the current holder: the row lock is enough
        ELSE
            RAISE EXCEPTION 'fencelock: stale token % for resource "%": the database has seen token % (holder "%")',
                    p_token, p_resource, cur, cur_holder
                USING ERRCODE = 'FL001',
                      DETAIL = json_build_object('resource', p_resource, 'token', p_token, 'current', cur)::text,
                      HINT = 'another holder took the lock after this one lost it; do not retry with this token';
        END IF;
    END IF;

    PERFORM set_config('fencelock.resource', p_resource, true),
            set_config('fencelock.token', p_token::text, true),
            set_config('fencelock.holder', p_holder, true);
    IF p_key IS NOT NULL THEN
        PERFORM fencelock.apply_key(p_resource, p_key, p_token);
    END IF;
    RETURN cur;
END;
$$;
-- +goose StatementEnd

-- apply_key records an idempotency key for a resource, or raises FL003 when
-- it was recorded before. Call it after claim, in the same transaction.
-- +goose StatementBegin
CREATE FUNCTION fencelock.apply_key(p_resource text, p_key text, p_token bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    prev bigint;
BEGIN
    IF p_key IS NULL OR p_key = '' THEN
        RAISE EXCEPTION 'fencelock: apply_key: empty idempotency key' USING ERRCODE = '22023';
    END IF;
    INSERT INTO fencelock.applied (resource, key, token)
    VALUES (p_resource, p_key, p_token)
    ON CONFLICT (resource, key) DO NOTHING;
    IF NOT FOUND THEN
        SELECT a.token INTO prev FROM fencelock.applied a WHERE a.resource = p_resource AND a.key = p_key;
        RAISE EXCEPTION 'fencelock: key "%" for resource "%" was already applied (by token %)', p_key, p_resource, prev
            USING ERRCODE = 'FL003',
                  DETAIL = json_build_object('resource', p_resource, 'key', p_key, 'token', prev)::text;
    END IF;
END;
$$;
-- +goose StatementEnd

-- run_step advances the cursor of a resumable run (creating the run), or
-- raises FL004 when the run is finished. Call it after claim.
-- +goose StatementBegin
CREATE FUNCTION fencelock.run_step(p_resource text, p_run_key text, p_token bigint, p_cursor text)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    done boolean;
BEGIN
    IF p_run_key IS NULL OR p_run_key = '' THEN
        RAISE EXCEPTION 'fencelock: run_step: empty run key' USING ERRCODE = '22023';
    END IF;
    INSERT INTO fencelock.runs AS r (resource, run_key, token, cursor)
    VALUES (p_resource, p_run_key, p_token, coalesce(p_cursor, ''))
    ON CONFLICT (resource, run_key) DO UPDATE
        SET token = excluded.token, cursor = excluded.cursor, updated_at = now()
        WHERE NOT r.finished;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fencelock: run "%" of resource "%" is finished', p_run_key, p_resource
            USING ERRCODE = 'FL004',
                  DETAIL = json_build_object('resource', p_resource, 'run_key', p_run_key, 'token', p_token)::text;
    END IF;
END;
$$;
-- +goose StatementEnd

-- run_finish marks a resumable run finished (creating it if needed); a
-- finished run stays finished. Call it after claim.
-- +goose StatementBegin
CREATE FUNCTION fencelock.run_finish(p_resource text, p_run_key text, p_token bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_run_key IS NULL OR p_run_key = '' THEN
        RAISE EXCEPTION 'fencelock: run_finish: empty run key' USING ERRCODE = '22023';
    END IF;
    INSERT INTO fencelock.runs AS r (resource, run_key, token, finished)
    VALUES (p_resource, p_run_key, p_token, true)
    ON CONFLICT (resource, run_key) DO UPDATE
        SET token = excluded.token, finished = true, updated_at = now()
        WHERE NOT r.finished;
END;
$$;
-- +goose StatementEnd

-- protect_guard is the statement trigger installed by pgfence.Protect: a
-- write is accepted only when its transaction has claimed a fence (see
-- claim) whose token and holder are still the stored ones. FOR SHARE keeps
-- a higher claim from committing in between. With a trigger argument the
-- claim must be for that resource.
-- +goose StatementBegin
CREATE FUNCTION fencelock.protect_guard()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    r          text := current_setting('fencelock.resource', true);
    t          text := current_setting('fencelock.token', true);
    h          text := current_setting('fencelock.holder', true);
    cur        bigint;
    cur_holder text;
BEGIN
    -- After a claiming transaction ends the settings read as '' for the
    -- rest of the session, not NULL.
    IF coalesce(r, '') = '' OR coalesce(t, '') = '' OR coalesce(h, '') = '' THEN
        RAISE EXCEPTION 'fencelock: % on %.% without a fence claim: call fencelock.claim(resource, token, holder) first in the same transaction',
                TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME
            USING ERRCODE = 'FL002';
    END IF;
    IF TG_NARGS > 0 AND TG_ARGV[0] <> r THEN
        RAISE EXCEPTION 'fencelock: % on %.% claimed resource "%", but the table is protected by resource "%"',
                TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME, r, TG_ARGV[0]
            USING ERRCODE = 'FL002';
    END IF;
    SELECT f.token, f.holder INTO cur, cur_holder
      FROM fencelock.fence f WHERE f.resource = r FOR SHARE;
    IF NOT FOUND OR cur <> t::bigint OR cur_holder <> h THEN
        RAISE EXCEPTION 'fencelock: stale token % for resource "%": the database has seen token %', t, r, coalesce(cur, 0)
            USING ERRCODE = 'FL001',
                  DETAIL = json_build_object('resource', r, 'token', t::bigint, 'current', coalesce(cur, 0))::text;
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- CASCADE also drops the protect triggers installed on user tables, which
-- depend on fencelock.protect_guard.
DROP SCHEMA fencelock CASCADE;
