-- fencelock schema: fencing tokens, applied idempotency keys, resumable
-- runs, the precheck and claim functions and the table-protection trigger
-- function.
--
-- A guarded transaction (pgfence) runs, in the round trip that opens it,
-- advance in a transaction of its own (records the token, so older
-- holders' commits are refused from then on; skipped when the client
-- knows the token is stored already) and open after BEGIN (precheck and
-- run_check in one call, no lock: an applied key or a finished run fails
-- before fn writes), and close in the round trip that commits it (claim,
-- apply_key and run_step or run_finish in one call). The fence row lock is
-- held only while advance or the commit runs. Raw SQL writers call claim
-- first.
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
--          {"resource": ..., "run_key": ...[, "token": ...]}.
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
--
-- Every step rewrites its run's row (token, cursor, updated_at). No index
-- covers those columns, so the rewrite is a HOT update (no index entries
-- to add) as long as the page has room: hence the fillfactor. Only
-- finishing a run sets finished and finished_at, the indexed columns that
-- Prune looks runs up by.
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

-- precheck is the non-locking check at the start of a guarded transaction:
-- it raises FL001 (same DETAIL as claim) when the stored token for
-- p_resource is higher than p_token, or equal with another holder, and
-- FL003 when p_key is already applied, so that a stale holder or a repeated
-- batch fails before it writes anything. It locks nothing and stores
-- nothing: the token is claimed at commit (claim, in the round trip that
-- carries COMMIT), so a holder that is paused in the middle of its
-- transaction holds up no one. It records the claim-to-be in the
-- transaction-local settings that the protect trigger reads. Returns the
-- stored token (0 when the resource is new).
-- +goose StatementBegin
CREATE FUNCTION fencelock.precheck(p_resource text, p_token bigint, p_holder text, p_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
AS $$
BEGIN
    -- The same check guard.Exec runs at begin (open), without a run.
    RETURN fencelock.open(p_resource, p_token, p_holder, p_key, NULL);
END;
$$;
-- +goose StatementEnd

-- advance records p_token for p_resource in the round trip that opens a
-- guarded transaction, in a transaction of its own that commits before
-- BEGIN ("SELECT fencelock.advance(...); COMMIT; BEGIN ..."): from then on
-- an older holder's commit is refused, so a holder that read before it
-- froze cannot commit over what the new holder reads (a lost update in a
-- read-modify-write). When the token is already the stored one it only
-- reads (no lock, no write, nothing to commit); when it is stale it raises
-- FL001; otherwise it claims. The fence row lock lasts only as long as that
-- little transaction.
-- +goose StatementBegin
CREATE FUNCTION fencelock.advance(p_resource text, p_token bigint, p_holder text)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    cur        bigint;
    cur_holder text;
BEGIN
    SELECT f.token, f.holder INTO cur, cur_holder
      FROM fencelock.fence f WHERE f.resource = p_resource;
    IF FOUND AND cur = p_token AND cur_holder = p_holder THEN
        RETURN cur;
    END IF;
    IF FOUND AND (cur > p_token OR cur = p_token) THEN
        PERFORM fencelock.raise_stale(p_resource, p_token, cur, cur_holder);
    END IF;
    RETURN fencelock.claim(p_resource, p_token, p_holder);
END;
$$;
-- +goose StatementEnd

-- claim accepts p_token for p_resource if it is higher than the stored one
-- (and stores it) or equal to it with the same holder; otherwise it raises
-- FL001. With p_key it then records that idempotency key (see apply_key).
-- guard.Exec calls it in the round trip that commits; raw SQL writers call
-- it first in their transaction.
--
-- The invariant it keeps: committed tokens per resource never decrease in
-- commit order. It checks the token under a lock on the fence row that
-- lasts until the transaction ends: FOR UPDATE when it stores a new token,
-- FOR SHARE when the token is already the stored one (a re-claim, e.g. after
-- Advance, or by the protect trigger earlier in the transaction). A newer
-- claim must update the row, so it waits for every transaction that holds
-- either lock and commits after them; a transaction whose check comes after
-- a newer claim sees the newer token and is refused. Taking the share lock
-- only after a plain read said the token is ours keeps two transactions of
-- one holder from deadlocking on a share-to-update upgrade.
--
-- It records the claim in the transaction-local settings that the protect
-- trigger checks. Returns the previously stored token (0 when the resource
-- was new).
-- +goose StatementBegin
CREATE FUNCTION fencelock.claim(p_resource text, p_token bigint, p_holder text, p_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    cur        bigint;
    cur_holder text;
BEGIN
    PERFORM fencelock.check_args('claim', p_resource, p_token, p_holder);

    SELECT f.token, f.holder INTO cur, cur_holder
      FROM fencelock.fence f WHERE f.resource = p_resource;
    IF FOUND AND cur = p_token AND cur_holder = p_holder THEN
        -- Already ours: a share lock keeps a newer claim out until we end.
        -- Under READ COMMITTED it waits for a concurrent updater and
        -- returns the latest row, which is checked again below.
        SELECT f.token, f.holder INTO cur, cur_holder
          FROM fencelock.fence f WHERE f.resource = p_resource FOR SHARE;
    ELSE
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
    END IF;

    IF cur <> 0 THEN
        IF p_token > cur THEN
            UPDATE fencelock.fence SET token = p_token, holder = p_holder, updated_at = now()
             WHERE resource = p_resource;
        ELSIF p_token = cur AND p_holder = cur_holder THEN
            NULL; -- re-claim by the current holder: the row lock is enough
        ELSE
            PERFORM fencelock.raise_stale(p_resource, p_token, cur, cur_holder);
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

-- open is the check at the start of a guarded transaction, what precheck
-- and run_check do, in one call (one statement in the begin round trip):
-- FL001 when the stored token for p_resource is higher than p_token, or
-- equal with another holder; FL003 when p_key is already applied; FL004
-- when the run p_run_key is finished. It locks nothing and stores nothing,
-- and records the claim-to-be in the transaction-local settings that the
-- protect trigger reads (close relies on them). Returns the stored token
-- (0 when the resource is new).
-- +goose StatementBegin
CREATE FUNCTION fencelock.open(p_resource text, p_token bigint, p_holder text,
                               p_key text DEFAULT NULL, p_run_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    cur        bigint;
    cur_holder text;
    prev       bigint;
BEGIN
    IF p_resource IS NULL OR p_resource = '' OR p_token IS NULL OR p_token <= 0 OR p_holder IS NULL OR p_holder = '' THEN
        PERFORM fencelock.check_args('open', p_resource, p_token, p_holder);
    END IF;
    SELECT f.token, f.holder INTO cur, cur_holder
      FROM fencelock.fence f WHERE f.resource = p_resource;
    IF NOT FOUND THEN
        cur := 0;
    ELSIF cur > p_token OR (cur = p_token AND cur_holder <> p_holder) THEN
        PERFORM fencelock.raise_stale(p_resource, p_token, cur, cur_holder);
    END IF;
    IF p_key IS NOT NULL THEN
        IF p_key = '' THEN
            RAISE EXCEPTION 'fencelock: open: empty idempotency key' USING ERRCODE = '22023';
        END IF;
        SELECT a.token INTO prev FROM fencelock.applied a WHERE a.resource = p_resource AND a.key = p_key;
        IF FOUND THEN
            PERFORM fencelock.raise_applied(p_resource, p_key, prev);
        END IF;
    END IF;
    IF p_run_key IS NOT NULL THEN
        IF p_run_key = '' THEN
            RAISE EXCEPTION 'fencelock: open: empty run key' USING ERRCODE = '22023';
        END IF;
        PERFORM 1 FROM fencelock.runs r WHERE r.resource = p_resource AND r.run_key = p_run_key AND r.finished;
        IF FOUND THEN
            RAISE EXCEPTION 'fencelock: run "%" of resource "%" is finished', p_run_key, p_resource
                USING ERRCODE = 'FL004',
                      DETAIL = json_build_object('resource', p_resource, 'run_key', p_run_key)::text;
        END IF;
    END IF;
    PERFORM set_config('fencelock.resource', p_resource, true),
            set_config('fencelock.token', p_token::text, true),
            set_config('fencelock.holder', p_holder, true);
    RETURN cur;
END;
$$;
-- +goose StatementEnd

-- close is the claim at the end of a guarded transaction, in the round
-- trip that carries COMMIT, in one call: it claims the fence (as claim
-- does), records p_key (as apply_key), and then, with p_run_key, moves the
-- run's cursor to p_cursor (as run_step, FL004 when the run is finished)
-- or, with p_finish, finishes the run (as run_finish). Call it after open
-- in the same transaction: it leaves the protect trigger's settings as
-- open set them.
--
-- In a guarded transaction the token is already stored when close runs
-- (advance stored it before BEGIN), so close reads the fence row once,
-- under FOR SHARE, and finds the token its own: the share lock keeps a
-- newer claim from committing before this transaction ends, as in claim.
-- A newer token there is FL001. Only when the stored token is lower or
-- missing (the fence row was deleted since, or close is called without
-- advance) does it hand over to claim, which stores it under FOR UPDATE.
-- +goose StatementBegin
CREATE FUNCTION fencelock.close(p_resource text, p_token bigint, p_holder text,
                                p_key text DEFAULT NULL, p_run_key text DEFAULT NULL,
                                p_cursor text DEFAULT NULL, p_finish boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    cur        bigint;
    cur_holder text;
    prev       bigint;
BEGIN
    IF p_resource IS NULL OR p_resource = '' OR p_token IS NULL OR p_token <= 0 OR p_holder IS NULL OR p_holder = '' THEN
        PERFORM fencelock.check_args('close', p_resource, p_token, p_holder);
    END IF;
    IF p_key = '' THEN
        RAISE EXCEPTION 'fencelock: close: empty idempotency key' USING ERRCODE = '22023';
    END IF;
    IF p_run_key = '' OR (p_run_key IS NULL AND (p_finish OR p_cursor IS NOT NULL)) THEN
        RAISE EXCEPTION 'fencelock: close: empty run key' USING ERRCODE = '22023';
    END IF;

    SELECT f.token, f.holder INTO cur, cur_holder
      FROM fencelock.fence f WHERE f.resource = p_resource FOR SHARE;
    IF NOT FOUND OR cur < p_token THEN
        cur := fencelock.claim(p_resource, p_token, p_holder);
    ELSIF cur > p_token OR cur_holder <> p_holder THEN
        PERFORM fencelock.raise_stale(p_resource, p_token, cur, cur_holder);
    END IF;

    IF p_key IS NOT NULL THEN
        INSERT INTO fencelock.applied (resource, key, token)
        VALUES (p_resource, p_key, p_token)
        ON CONFLICT (resource, key) DO NOTHING;
        IF NOT FOUND THEN
            SELECT a.token INTO prev FROM fencelock.applied a WHERE a.resource = p_resource AND a.key = p_key;
            PERFORM fencelock.raise_applied(p_resource, p_key, prev);
        END IF;
    END IF;

    IF p_finish THEN
        INSERT INTO fencelock.runs AS r (resource, run_key, token, finished, finished_at)
        VALUES (p_resource, p_run_key, p_token, true, now())
        ON CONFLICT (resource, run_key) DO UPDATE
            SET token = excluded.token, finished = true, finished_at = now(), updated_at = now()
            WHERE NOT r.finished;
    ELSIF p_run_key IS NOT NULL THEN
        -- Every step but the first finds its run's row: a plain UPDATE
        -- (HOT, see the runs table) is cheaper than an upsert, which
        -- probes the index and locks the row before it updates it.
        UPDATE fencelock.runs r SET token = p_token, cursor = coalesce(p_cursor, ''), updated_at = now()
         WHERE r.resource = p_resource AND r.run_key = p_run_key AND NOT r.finished;
        IF NOT FOUND THEN
            INSERT INTO fencelock.runs AS r (resource, run_key, token, cursor)
            VALUES (p_resource, p_run_key, p_token, coalesce(p_cursor, ''))
            ON CONFLICT (resource, run_key) DO UPDATE
                SET token = excluded.token, cursor = excluded.cursor, updated_at = now()
                WHERE NOT r.finished;
        END IF;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'fencelock: run "%" of resource "%" is finished', p_run_key, p_resource
                USING ERRCODE = 'FL004',
                      DETAIL = json_build_object('resource', p_resource, 'run_key', p_run_key, 'token', p_token)::text;
        END IF;
    END IF;
    RETURN cur;
END;
$$;
-- +goose StatementEnd

-- check_args raises 22023 for the arguments no claim accepts.
-- +goose StatementBegin
CREATE FUNCTION fencelock.check_args(p_fn text, p_resource text, p_token bigint, p_holder text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_resource IS NULL OR p_resource = '' THEN
        RAISE EXCEPTION 'fencelock: %: empty resource name', p_fn USING ERRCODE = '22023';
    END IF;
    IF p_token IS NULL OR p_token <= 0 THEN
        RAISE EXCEPTION 'fencelock: %: token must be > 0, got %', p_fn, coalesce(p_token::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    IF p_holder IS NULL OR p_holder = '' THEN
        RAISE EXCEPTION 'fencelock: %: empty holder', p_fn USING ERRCODE = '22023';
    END IF;
END;
$$;
-- +goose StatementEnd

-- raise_stale raises FL001, the one stale-token error of every function
-- here (pgfence maps it to *guard.StaleTokenError by its DETAIL).
-- +goose StatementBegin
CREATE FUNCTION fencelock.raise_stale(p_resource text, p_token bigint, p_cur bigint, p_cur_holder text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'fencelock: stale token % for resource "%": the database has seen token % (holder "%")',
            p_token, p_resource, p_cur, coalesce(p_cur_holder, '')
        USING ERRCODE = 'FL001',
              DETAIL = json_build_object('resource', p_resource, 'token', p_token, 'current', p_cur)::text,
              HINT = 'another holder took the lock after this one lost it; do not retry with this token';
END;
$$;
-- +goose StatementEnd

-- raise_applied raises FL003 for a key applied by token p_by.
-- +goose StatementBegin
CREATE FUNCTION fencelock.raise_applied(p_resource text, p_key text, p_by bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'fencelock: key "%" for resource "%" was already applied (by token %)', p_key, p_resource, p_by
        USING ERRCODE = 'FL003',
              DETAIL = json_build_object('resource', p_resource, 'key', p_key, 'token', p_by)::text;
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
        PERFORM fencelock.raise_applied(p_resource, p_key, prev);
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
    INSERT INTO fencelock.runs AS r (resource, run_key, token, finished, finished_at)
    VALUES (p_resource, p_run_key, p_token, true, now())
    ON CONFLICT (resource, run_key) DO UPDATE
        SET token = excluded.token, finished = true, finished_at = now(), updated_at = now()
        WHERE NOT r.finished;
END;
$$;
-- +goose StatementEnd

-- run_check raises FL004 when the run is finished: the non-locking check at
-- the start of a step (run_step checks again at commit), so that a step of a
-- finished run does not run its writes at all.
-- +goose StatementBegin
CREATE FUNCTION fencelock.run_check(p_resource text, p_run_key text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_run_key IS NULL OR p_run_key = '' THEN
        RAISE EXCEPTION 'fencelock: run_check: empty run key' USING ERRCODE = '22023';
    END IF;
    PERFORM 1 FROM fencelock.runs r WHERE r.resource = p_resource AND r.run_key = p_run_key AND r.finished;
    IF FOUND THEN
        RAISE EXCEPTION 'fencelock: run "%" of resource "%" is finished', p_run_key, p_resource
            USING ERRCODE = 'FL004',
                  DETAIL = json_build_object('resource', p_resource, 'run_key', p_run_key)::text;
    END IF;
END;
$$;
-- +goose StatementEnd

-- protect_guard is the statement trigger installed by pgfence.Protect: a
-- write is accepted only when its transaction has checked or claimed a
-- fence (precheck or claim set the settings) whose token is still current.
-- It runs claim for that token, so the check happens under a lock on the
-- fence row that lasts until commit: FOR SHARE when the token is already
-- stored (a raw writer that claimed first, a holder that ran Advance), FOR
-- UPDATE when it stores it (a guarded transaction whose claim was due at
-- commit). Either keeps a newer claim from committing in between, so even a
-- writer that only ran precheck commits in token order. The price: a holder
-- frozen after writing to a protected table delays the next claim until its
-- transaction ends (pgfence's WithIdleTimeout and WithLockTimeout bound
-- that). With a trigger argument the claim must be for that resource.
-- +goose StatementBegin
CREATE FUNCTION fencelock.protect_guard()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    r text := current_setting('fencelock.resource', true);
    t text := current_setting('fencelock.token', true);
    h text := current_setting('fencelock.holder', true);
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
    PERFORM fencelock.claim(r, t::bigint, h);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- CASCADE also drops the protect triggers installed on user tables, which
-- depend on fencelock.protect_guard.
DROP SCHEMA fencelock CASCADE;
