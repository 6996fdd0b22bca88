-- fencelock schema v2, part 2: the functions. Every function is CREATE OR
-- REPLACE, so a later migration changes one by repeating it whole.
--
-- A guarded transaction (pgfence) runs, in the round trip that opens it,
-- advance in a transaction of its own (records the token, so older
-- holders' commits are refused from then on; skipped when the client
-- knows the token is stored already) and open after BEGIN (checks token,
-- key and run without locking: a stale holder, an applied key or a
-- finished run fails before fn writes), and close in the round trip that
-- commits it (claims the token under the fence row lock, records the key,
-- moves the run). Raw SQL writers call claim first in their transaction.
--
-- Privileges. The entry points (advance, claim, close, open, precheck,
-- protect_guard, prune, run_state) are SECURITY DEFINER: they run with the
-- rights of the role that ran these migrations, so an application role
-- needs only
--
--   GRANT USAGE ON SCHEMA fencelock TO app;
--   GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO app;
--
-- and no privilege on the tables: it cannot lower a token by hand. None of
-- them can be steered by the caller's search_path (its own operators or
-- tables in front of the real ones): each pins it (SET search_path =
-- pg_catalog, pg_temp, and names every fencelock object with its schema),
-- except open and close, which run in every guarded transaction and
-- instead name everything with its schema, pg_catalog's operators and
-- types included (a SET clause costs a settings save and restore per
-- call). EXECUTE is revoked from PUBLIC at the end of this file; a later
-- migration that adds a function must revoke it too.
--
-- The helpers (check_args, check_token, apply_key, open_full, close_full
-- and the raise_* functions) are SECURITY INVOKER: they run inside an
-- entry point, with its rights. check_args and check_token carry no SET
-- clause, which would keep them from being inlined, and run only inside
-- entry points that pin the search_path; open_full and close_full pin it
-- themselves, since open and close do not. Called directly they have only
-- the caller's rights (apply_key, open_full and close_full, which read or
-- write the tables, fail with permission denied for an application role).
--
-- SQLSTATEs, each raised in exactly one place with one DETAIL shape (JSON):
--   FL001  stale token (raise_stale, from check_token): a higher token, or the same token with
--          another holder, has been seen for the resource.
--          DETAIL {"resource": text, "token": bigint, "current": bigint}
--   FL002  write to a protected table without a current claim for it
--          (protect_guard). DETAIL {"table": "schema.name",
--          "claimed": text|null, "required": text|null}
--   FL003  idempotency key already applied (raise_applied).
--          DETAIL {"resource": text, "key": text, "token": bigint} (token
--          that applied it)
--   FL004  resumable run already finished (raise_finished).
--          DETAIL {"resource": text, "run_key": text, "token": bigint}
--          (token that finished it)
--   22023  invalid argument (raise_invalid, from check_args): empty resource, holder, key or
--          run key, token <= 0.

-- +goose Up

-- The raise_* functions raise one SQLSTATE each, with its one DETAIL
-- shape. They never return; they are declared boolean so that the checks
-- below can call them inside an expression.

-- raise_invalid raises 22023: argument problem p_problem of function p_fn.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.raise_invalid(p_fn text, p_problem text)
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'fencelock: %: %', p_fn, p_problem USING ERRCODE = '22023';
END;
$$;
-- +goose StatementEnd

-- raise_stale raises FL001: p_token for p_resource is stale, the stored
-- token is p_cur of holder p_cur_holder.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.raise_stale(p_resource text, p_token bigint, p_cur bigint, p_cur_holder text)
RETURNS boolean
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

-- raise_applied raises FL003: key p_key of p_resource was applied by token
-- p_by.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.raise_applied(p_resource text, p_key text, p_by bigint)
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'fencelock: key "%" for resource "%" was already applied (by token %)', p_key, p_resource, p_by
        USING ERRCODE = 'FL003',
              DETAIL = json_build_object('resource', p_resource, 'key', p_key, 'token', p_by)::text;
END;
$$;
-- +goose StatementEnd

-- raise_finished raises FL004: run p_run_key of p_resource was finished by
-- token p_by.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.raise_finished(p_resource text, p_run_key text, p_by bigint)
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'fencelock: run "%" of resource "%" is finished (by token %)', p_run_key, p_resource, p_by
        USING ERRCODE = 'FL004',
              DETAIL = json_build_object('resource', p_resource, 'run_key', p_run_key, 'token', p_by)::text;
END;
$$;
-- +goose StatementEnd

-- The two checks are plain SQL expressions (LANGUAGE sql, one SELECT, not
-- SECURITY DEFINER, VOLATILE like the raise they may call), so the planner
-- inlines them into the calling statement: the check costs no function
-- call on the hot path, only the raise on the error path does. Callers
-- use them in an assignment or an IF, which plpgsql evaluates as a simple
-- expression (a PERFORM would run a full query).

-- check_args returns true, or raises 22023 for the arguments no function
-- accepts; p_fn names the function in the message. p_needs_run: a cursor
-- or finish was given, so the run key must be too.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.check_args(p_fn text, p_resource text, p_token bigint, p_holder text,
                                                p_key text DEFAULT NULL, p_run_key text DEFAULT NULL,
                                                p_needs_run boolean DEFAULT false)
RETURNS boolean
LANGUAGE sql
AS $$
    SELECT CASE
        WHEN p_resource IS NULL OR p_resource = '' THEN fencelock.raise_invalid(p_fn, 'empty resource name')
        WHEN p_token IS NULL OR p_token <= 0 THEN fencelock.raise_invalid(p_fn, 'token must be > 0, got ' || coalesce(p_token::text, 'NULL'))
        WHEN p_holder IS NULL OR p_holder = '' THEN fencelock.raise_invalid(p_fn, 'empty holder')
        WHEN p_key = '' THEN fencelock.raise_invalid(p_fn, 'empty idempotency key (pass NULL for none)')
        WHEN p_run_key = '' OR (p_run_key IS NULL AND p_needs_run) THEN fencelock.raise_invalid(p_fn, 'empty run key')
        ELSE true
    END;
$$;
-- +goose StatementEnd

-- check_token is the one stale-token check. p_cur and p_cur_holder are
-- the stored token and holder of p_resource (NULL when it has none). It
-- returns true when the stored token is p_token with holder p_holder
-- (already ours), false when it is lower or missing (the caller may store
-- p_token), and raises FL001 otherwise.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.check_token(p_resource text, p_token bigint, p_holder text,
                                                 p_cur bigint, p_cur_holder text)
RETURNS boolean
LANGUAGE sql
AS $$
    SELECT CASE
        WHEN p_cur IS NULL OR p_cur < p_token THEN false
        WHEN p_cur = p_token AND p_cur_holder = p_holder THEN true
        ELSE fencelock.raise_stale(p_resource, p_token, p_cur, p_cur_holder)
    END;
$$;
-- +goose StatementEnd

-- apply_key records idempotency key p_key of p_resource as applied by
-- p_token, or raises FL003 when it was recorded before. It writes
-- fencelock.applied, so it works only inside claim and close (as their
-- owner).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.apply_key(p_resource text, p_key text, p_token bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    ok   boolean;
    prev bigint;
BEGIN
    INSERT INTO fencelock.applied (resource, key, token)
    VALUES (p_resource, p_key, p_token)
    ON CONFLICT (resource, key) DO NOTHING;
    IF NOT FOUND THEN
        SELECT a.token INTO prev FROM fencelock.applied a WHERE a.resource = p_resource AND a.key = p_key;
        ok := fencelock.raise_applied(p_resource, p_key, prev);
    END IF;
END;
$$;
-- +goose StatementEnd

-- claim accepts p_token for p_resource if it is higher than the stored one
-- (and stores it) or equal to it with the same holder; otherwise it raises
-- FL001. With p_key it then records that idempotency key (FL003 if it was
-- applied before). Raw SQL writers call it first in their transaction;
-- pgfence's Advance calls it on its own.
--
-- The invariant it keeps: committed tokens per resource never decrease in
-- commit order. It checks the token under a lock on the fence row that
-- lasts until the transaction ends: FOR UPDATE when it stores a new token,
-- FOR SHARE when the token is already the stored one (a re-claim, e.g.
-- after advance, or by the protect trigger earlier in the transaction). A
-- newer claim must update the row, so it waits for every transaction that
-- holds either lock and commits after them; a transaction whose check
-- comes after a newer claim sees the newer token and is refused. Taking
-- the share lock only after a plain read said the token is ours keeps two
-- transactions of one holder from deadlocking on a share-to-update
-- upgrade.
--
-- It records the claim in the transaction-local settings that the protect
-- trigger checks. Returns the previously stored token (0 when the
-- resource was new).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.claim(p_resource text, p_token bigint, p_holder text, p_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ok         boolean;
    cur        bigint;
    cur_holder text;
    ours       boolean;
BEGIN
    ok := fencelock.check_args('claim', p_resource, p_token, p_holder, p_key);

    SELECT f.token, f.holder INTO cur, cur_holder
      FROM fencelock.fence f WHERE f.resource = p_resource;
    ours := fencelock.check_token(p_resource, p_token, p_holder, cur, cur_holder);
    IF ours THEN
        -- Already ours: a share lock keeps a newer claim out until we end.
        -- Under READ COMMITTED it waits for a concurrent updater and
        -- returns the latest row, which is checked again.
        SELECT f.token, f.holder INTO cur, cur_holder
          FROM fencelock.fence f WHERE f.resource = p_resource FOR SHARE;
        ours := fencelock.check_token(p_resource, p_token, p_holder, cur, cur_holder);
    END IF;
    IF NOT ours THEN
        -- FOR UPDATE waits for a concurrent claimer and then re-reads.
        SELECT f.token, f.holder INTO cur, cur_holder
          FROM fencelock.fence f WHERE f.resource = p_resource FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO fencelock.fence (resource, token, holder)
            VALUES (p_resource, p_token, p_holder)
            ON CONFLICT (resource) DO NOTHING;
            ours := FOUND;
            IF NOT ours THEN
                -- A concurrent first claim won the insert: compare with it.
                SELECT f.token, f.holder INTO cur, cur_holder
                  FROM fencelock.fence f WHERE f.resource = p_resource FOR UPDATE;
            END IF;
        END IF;
        IF NOT ours AND NOT fencelock.check_token(p_resource, p_token, p_holder, cur, cur_holder) THEN
            UPDATE fencelock.fence SET token = p_token, holder = p_holder, updated_at = now()
             WHERE resource = p_resource;
        END IF;
    END IF;

    PERFORM set_config('fencelock.resource', p_resource, true),
            set_config('fencelock.token', p_token::text, true),
            set_config('fencelock.holder', p_holder, true);
    IF p_key IS NOT NULL THEN
        PERFORM fencelock.apply_key(p_resource, p_key, p_token);
    END IF;
    RETURN coalesce(cur, 0);
END;
$$;
-- +goose StatementEnd

-- advance records p_token for p_resource in the round trip that opens a
-- guarded transaction, in a transaction of its own that commits before
-- BEGIN: from then on an older holder's commit is refused, so a holder
-- that read before it froze cannot commit over what the new holder reads
-- (a lost update in a read-modify-write). When the token is already the
-- stored one it only reads (no lock, no write, nothing to commit); when it
-- is stale it raises FL001; otherwise it claims. The fence row lock lasts
-- only as long as that little transaction. Returns the stored token.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.advance(p_resource text, p_token bigint, p_holder text)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ok         boolean;
    cur        bigint;
    cur_holder text;
BEGIN
    ok := fencelock.check_args('advance', p_resource, p_token, p_holder);
    SELECT f.token, f.holder INTO cur, cur_holder
      FROM fencelock.fence f WHERE f.resource = p_resource;
    IF fencelock.check_token(p_resource, p_token, p_holder, cur, cur_holder) THEN
        RETURN cur;
    END IF;
    RETURN fencelock.claim(p_resource, p_token, p_holder);
END;
$$;
-- +goose StatementEnd

-- open_full is open's whole check, with its search_path pinned; open
-- hands over to it for anything but the common case. It is the check at
-- the start of a guarded transaction: FL001 when the stored token for
-- p_resource is higher than p_token, or equal with another holder; FL003
-- when p_key is already applied; FL004 when the run p_run_key is finished.
-- It locks nothing and stores nothing, and records the claim-to-be in the
-- transaction-local settings that the protect trigger reads (close relies
-- on them). Returns the stored token (0 when the resource is new).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.open_full(p_resource text, p_token bigint, p_holder text,
                                          p_key text DEFAULT NULL, p_run_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ok         boolean;
    cur        bigint;
    cur_holder text;
    prev       bigint;
BEGIN
    ok := fencelock.check_args('open', p_resource, p_token, p_holder, p_key, p_run_key);
    SELECT f.token, f.holder INTO cur, cur_holder
      FROM fencelock.fence f WHERE f.resource = p_resource;
    ok := fencelock.check_token(p_resource, p_token, p_holder, cur, cur_holder);
    IF p_key IS NOT NULL THEN
        SELECT a.token INTO prev FROM fencelock.applied a WHERE a.resource = p_resource AND a.key = p_key;
        IF FOUND THEN
            ok := fencelock.raise_applied(p_resource, p_key, prev);
        END IF;
    END IF;
    IF p_run_key IS NOT NULL THEN
        SELECT r.token INTO prev FROM fencelock.runs r
         WHERE r.resource = p_resource AND r.run_key = p_run_key AND r.finished;
        IF FOUND THEN
            ok := fencelock.raise_finished(p_resource, p_run_key, prev);
        END IF;
    END IF;
    PERFORM set_config('fencelock.resource', p_resource, true),
            set_config('fencelock.token', p_token::text, true),
            set_config('fencelock.holder', p_holder, true);
    RETURN coalesce(cur, 0);
END;
$$;
-- +goose StatementEnd

-- open is the check at the start of a guarded transaction, in one call
-- (one statement in the begin round trip): FL001 when the stored token for
-- p_resource is higher than p_token, or equal with another holder; FL003
-- when p_key is already applied; FL004 when the run p_run_key is finished.
-- It locks nothing and stores nothing, and records the claim-to-be in the
-- transaction-local settings that the protect trigger reads (close relies
-- on them). Returns the stored token (0 when the resource is new).
--
-- It runs in every guarded transaction, so it is written for speed: the
-- common case (the token is the stored one, the key is new, the run is not
-- finished) is a single read of the fence row, one lookup per key or run,
-- and the settings; anything else goes to open_full, which raises what
-- applies. It is SECURITY DEFINER without a SET search_path clause (a
-- settings save and restore on every call, about a sixth of its cost):
-- instead every name in it is schema-qualified, operators and types
-- included, so the caller's search_path cannot change what it runs.
-- migrations' TestHotPathQualified checks that; keep it so when editing.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.open(p_resource text, p_token bigint, p_holder text,
                                          p_key text DEFAULT NULL, p_run_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    cur        bigint;
    cur_holder pg_catalog.text;
BEGIN
    SELECT f.token, f.holder INTO cur, cur_holder
      FROM fencelock.fence f WHERE f.resource OPERATOR(pg_catalog.=) p_resource;
    IF (cur OPERATOR(pg_catalog.=) p_token AND cur_holder OPERATOR(pg_catalog.=) p_holder) IS NOT TRUE
       OR p_key OPERATOR(pg_catalog.=) '' OR p_run_key OPERATOR(pg_catalog.=) '' THEN
        RETURN fencelock.open_full(p_resource, p_token, p_holder, p_key, p_run_key);
    END IF;
    IF p_key IS NOT NULL THEN
        PERFORM FROM fencelock.applied a
          WHERE a.resource OPERATOR(pg_catalog.=) p_resource AND a.key OPERATOR(pg_catalog.=) p_key;
        IF FOUND THEN
            RETURN fencelock.open_full(p_resource, p_token, p_holder, p_key, p_run_key);
        END IF;
    END IF;
    IF p_run_key IS NOT NULL THEN
        PERFORM FROM fencelock.runs r
          WHERE r.resource OPERATOR(pg_catalog.=) p_resource AND r.run_key OPERATOR(pg_catalog.=) p_run_key AND r.finished;
        IF FOUND THEN
            RETURN fencelock.open_full(p_resource, p_token, p_holder, p_key, p_run_key);
        END IF;
    END IF;
    RETURN CASE WHEN pg_catalog.set_config('fencelock.resource', p_resource, true) IS NULL
                  OR pg_catalog.set_config('fencelock.token', p_token::pg_catalog.text, true) IS NULL
                  OR pg_catalog.set_config('fencelock.holder', p_holder, true) IS NULL
                THEN NULL ELSE cur END;
END;
$$;
-- +goose StatementEnd


-- precheck is open without a run, for raw SQL writers that want the
-- non-locking check before they write (the protect trigger or a later
-- claim still claims under the lock).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.precheck(p_resource text, p_token bigint, p_holder text, p_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT fencelock.open(p_resource, p_token, p_holder, p_key, NULL);
$$;
-- +goose StatementEnd

-- close_full is close's whole claim, with its search_path pinned; close
-- hands over to it for anything but the common case. It is the claim at
-- the end of a guarded transaction: it claims the fence (as claim
-- does), records p_key, and then, with p_run_key, moves the run's cursor
-- to p_cursor (FL004 when the run is finished) or, with p_finish, finishes
-- the run (finishing a finished run is a no-op). Call it after open in the
-- same transaction: it leaves the protect trigger's settings as open set
-- them.
--
-- In a guarded transaction the token is already stored when close runs
-- (advance stored it before BEGIN), so close reads the fence row once,
-- under FOR SHARE, and finds the token its own: the share lock keeps a
-- newer claim from committing before this transaction ends, as in claim.
-- A newer token there is FL001. Only when the stored token is lower or
-- missing (the fence row was deleted since, or close is called without
-- advance) does it hand over to claim, which stores it under FOR UPDATE.
-- Returns the stored token (0 when the resource was new).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.close_full(p_resource text, p_token bigint, p_holder text,
                                           p_key text DEFAULT NULL, p_run_key text DEFAULT NULL,
                                           p_cursor text DEFAULT NULL, p_finish boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ok         boolean;
    cur        bigint;
    cur_holder text;
    prev       bigint;
BEGIN
    ok := fencelock.check_args('close', p_resource, p_token, p_holder, p_key, p_run_key,
                                 coalesce(p_finish, false) OR p_cursor IS NOT NULL);

    SELECT f.token, f.holder INTO cur, cur_holder
      FROM fencelock.fence f WHERE f.resource = p_resource FOR SHARE;
    IF NOT fencelock.check_token(p_resource, p_token, p_holder, cur, cur_holder) THEN
        cur := fencelock.claim(p_resource, p_token, p_holder);
    END IF;

    IF p_key IS NOT NULL THEN
        PERFORM fencelock.apply_key(p_resource, p_key, p_token);
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
            IF NOT FOUND THEN
                SELECT r.token INTO prev FROM fencelock.runs r
                 WHERE r.resource = p_resource AND r.run_key = p_run_key;
                ok := fencelock.raise_finished(p_resource, p_run_key, prev);
            END IF;
        END IF;
    END IF;
    RETURN coalesce(cur, 0);
END;
$$;
-- +goose StatementEnd

-- close is the claim at the end of a guarded transaction, in the round
-- trip that carries COMMIT, in one call: it claims the fence (as claim
-- does), records p_key, and then, with p_run_key, moves the run's cursor
-- to p_cursor (FL004 when the run is finished) or, with p_finish, finishes
-- the run (finishing a finished run is a no-op). Call it after open in the
-- same transaction: it leaves the protect trigger's settings as open set
-- them. Returns the stored token (0 when the resource was new).
--
-- Like open it is written for speed, schema-qualified throughout and
-- without a SET clause: the common case (the stored token is p_token of
-- p_holder, as advance left it; a key not applied before; a step of a run
-- that has started and is not finished) reads the fence row under FOR
-- SHARE, moves the run with one UPDATE and records the key with one
-- INSERT; anything else (a lower or missing stored token to claim, a
-- newer one to refuse, a run's first step or its finish, an applied key,
-- bad arguments) goes to close_full, which does all of it again and
-- raises what applies. The run is moved before the key is recorded so
-- that close_full never finds the key recorded by this very call.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.close(p_resource text, p_token bigint, p_holder text,
                                           p_key text DEFAULT NULL, p_run_key text DEFAULT NULL,
                                           p_cursor text DEFAULT NULL, p_finish boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    cur        bigint;
    cur_holder pg_catalog.text;
BEGIN
    SELECT f.token, f.holder INTO cur, cur_holder
      FROM fencelock.fence f WHERE f.resource OPERATOR(pg_catalog.=) p_resource FOR SHARE;
    IF (cur OPERATOR(pg_catalog.=) p_token AND cur_holder OPERATOR(pg_catalog.=) p_holder) IS NOT TRUE
       OR p_finish OR p_key OPERATOR(pg_catalog.=) '' OR p_run_key OPERATOR(pg_catalog.=) ''
       OR (p_run_key IS NULL AND p_cursor IS NOT NULL) THEN
        RETURN fencelock.close_full(p_resource, p_token, p_holder, p_key, p_run_key, p_cursor, p_finish);
    END IF;
    IF p_run_key IS NOT NULL THEN
        UPDATE fencelock.runs r
           SET token = p_token, cursor = COALESCE(p_cursor, ''), updated_at = pg_catalog.now()
         WHERE r.resource OPERATOR(pg_catalog.=) p_resource AND r.run_key OPERATOR(pg_catalog.=) p_run_key
           AND NOT r.finished;
        IF NOT FOUND THEN
            RETURN fencelock.close_full(p_resource, p_token, p_holder, p_key, p_run_key, p_cursor, p_finish);
        END IF;
    END IF;
    IF p_key IS NOT NULL THEN
        INSERT INTO fencelock.applied (resource, key, token) VALUES (p_resource, p_key, p_token)
        ON CONFLICT (resource, key) DO NOTHING;
        IF NOT FOUND THEN
            RETURN fencelock.close_full(p_resource, p_token, p_holder, p_key, p_run_key, p_cursor, p_finish);
        END IF;
    END IF;
    RETURN cur;
END;
$$;
-- +goose StatementEnd

-- run_state is where resumable run p_run_key of p_resource stands: the
-- cursor of its last committed step and whether it is finished; no row
-- when it has not started. It claims nothing.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.run_state(p_resource text, p_run_key text)
RETURNS TABLE (cursor text, finished boolean)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.cursor, r.finished FROM fencelock.runs r
     WHERE r.resource = p_resource AND r.run_key = p_run_key;
$$;
-- +goose StatementEnd

-- prune deletes applied idempotency keys and finished runs older than
-- p_older_than and returns how many rows it deleted. Fence rows are never
-- pruned: they are what rejects stale holders.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.prune(p_older_than interval)
RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH a AS (DELETE FROM fencelock.applied WHERE applied_at < now() - p_older_than RETURNING 1),
         r AS (DELETE FROM fencelock.runs WHERE finished AND finished_at < now() - p_older_than RETURNING 1)
    SELECT (SELECT count(*) FROM a) + (SELECT count(*) FROM r);
$$;
-- +goose StatementEnd

-- protect_guard is the statement trigger installed by pgfence.Protect: a
-- write is accepted only when its transaction has checked or claimed a
-- fence (open, precheck or claim set the settings) whose token is still
-- current. It runs claim for that token, so the check happens under a
-- lock on the fence row that lasts until commit: FOR SHARE when the token
-- is already stored (a raw writer that claimed first, a holder that ran
-- advance), FOR UPDATE when it stores it. Either keeps a newer claim from
-- committing in between, so even a writer that only ran precheck commits
-- in token order. The price: a holder frozen after writing to a protected
-- table delays the next claim until its transaction ends (pgfence's
-- WithIdleTimeout and WithLockTimeout bound that). With a trigger argument
-- the claim must be for that resource. SECURITY DEFINER: a role that may
-- write the table needs no privilege on the fence table.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.protect_guard()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- After a claiming transaction ends the settings read as '' for the
    -- rest of the session, not NULL.
    r        text := nullif(current_setting('fencelock.resource', true), '');
    t        text := nullif(current_setting('fencelock.token', true), '');
    h        text := nullif(current_setting('fencelock.holder', true), '');
    required text;
    problem  text;
BEGIN
    IF TG_NARGS > 0 THEN
        required := TG_ARGV[0];
    END IF;
    IF r IS NULL OR t IS NULL OR h IS NULL THEN
        problem := 'without a fence claim: call fencelock.claim(resource, token, holder) first in the same transaction';
    ELSIF required IS NOT NULL AND required <> r THEN
        problem := format('claimed resource "%s", but the table is protected by resource "%s"', r, required);
    END IF;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'fencelock: % on %.% %', TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME, problem
            USING ERRCODE = 'FL002',
                  DETAIL = json_build_object('table', format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME),
                                             'claimed', r, 'required', required)::text;
    END IF;
    PERFORM fencelock.claim(r, t::bigint, h);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION fencelock.raise_invalid(text, text) IS
    'Internal: raises 22023 (invalid argument) for function p_fn.';
COMMENT ON FUNCTION fencelock.raise_stale(text, bigint, bigint, text) IS
    'Internal: raises FL001 (stale token), DETAIL {"resource","token","current"}.';
COMMENT ON FUNCTION fencelock.raise_applied(text, text, bigint) IS
    'Internal: raises FL003 (key already applied), DETAIL {"resource","key","token"} (token that applied the key).';
COMMENT ON FUNCTION fencelock.raise_finished(text, text, bigint) IS
    'Internal: raises FL004 (run finished), DETAIL {"resource","run_key","token"} (token that finished the run).';
COMMENT ON FUNCTION fencelock.check_args(text, text, bigint, text, text, text, boolean) IS
    'Internal, inlined SQL: true, or 22023 for an empty resource, holder, key or run key, or a token <= 0.';
COMMENT ON FUNCTION fencelock.check_token(text, bigint, text, bigint, text) IS
    'Internal, inlined SQL: the one stale-token check. true = the stored token is this one (same holder), false = lower or none stored, else FL001.';
COMMENT ON FUNCTION fencelock.apply_key(text, text, bigint) IS
    'Internal (called by claim and close): records an idempotency key, FL003 if it was applied before.';
COMMENT ON FUNCTION fencelock.claim(text, bigint, text, text) IS
    'claim(resource, token, holder[, key]): call first in a raw SQL transaction that writes fenced data. Stores the token if it is newer, accepts it if it is the stored one with the same holder, else FL001; locks the fence row until the transaction ends; with key records it (FL003 if applied). Returns the previous token (0 if none). 22023 on empty/invalid arguments.';
COMMENT ON FUNCTION fencelock.advance(text, bigint, text) IS
    'advance(resource, token, holder): pgfence, before BEGIN, in its own transaction: stores a newer token (as claim), only reads when it is already stored, FL001 when stale. Returns the stored token.';
COMMENT ON FUNCTION fencelock.open_full(text, bigint, text, text, text) IS
    'Internal (called by open for anything but the common case): open''s whole check, with a pinned search_path; raises FL001, FL003, FL004 or 22023.';
COMMENT ON FUNCTION fencelock.close_full(text, bigint, text, text, text, text, boolean) IS
    'Internal (called by close for anything but the common case): close''s whole claim, with a pinned search_path; claims a lower or missing token, raises FL001, FL003, FL004 or 22023.';
COMMENT ON FUNCTION fencelock.open(text, bigint, text, text, text) IS
    'open(resource, token, holder[, key[, run_key]]): pgfence, after BEGIN: non-locking check, FL001 stale token, FL003 key applied, FL004 run finished; sets the settings the protect trigger reads. Returns the stored token (0 if none).';
COMMENT ON FUNCTION fencelock.precheck(text, bigint, text, text) IS
    'precheck(resource, token, holder[, key]): open without a run, for raw SQL writers: non-locking FL001/FL003 check before writing (a protected table''s trigger then claims under the lock).';
COMMENT ON FUNCTION fencelock.close(text, bigint, text, text, text, text, boolean) IS
    'close(resource, token, holder, key, run_key, cursor, finish): pgfence, just before COMMIT: claims under the fence row lock (FL001), records key (FL003), moves the run''s cursor (FL004 if finished) or finishes it. Returns the stored token.';
COMMENT ON FUNCTION fencelock.run_state(text, text) IS
    'run_state(resource, run_key): cursor and finished flag of a resumable run; no row before its first step. Claims nothing.';
COMMENT ON FUNCTION fencelock.prune(interval) IS
    'prune(older_than): deletes applied keys and finished runs older than older_than; returns the number of rows deleted. Fence rows are never pruned.';
COMMENT ON FUNCTION fencelock.protect_guard() IS
    'Statement trigger installed by pgfence Protect: refuses INSERT/UPDATE/DELETE/TRUNCATE without a current claim in the transaction (FL002), and claims that token under the fence row lock (FL001 if overtaken). Optional argument: the only resource whose claim is accepted.';

-- SECURITY DEFINER functions are callable only by roles granted EXECUTE
-- (see the top of this file), not by everyone.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fencelock FROM PUBLIC;

-- +goose Down
-- While a table protected by pgfence's Protect still has its trigger,
-- dropping the functions would leave it unfenced (or, with CASCADE, drop
-- the trigger behind the owner's back): refuse, naming the tables.
-- migrations.Down checks the same first (and with Force drops the
-- triggers); this is for the goose CLI. protect_guard is dropped without
-- CASCADE all the same.
-- +goose StatementBegin
DO $$
DECLARE
    tables text;
BEGIN
    SELECT string_agg(format('%I.%I', n.nspname, c.relname), ', ' ORDER BY n.nspname, c.relname) INTO tables
      FROM pg_catalog.pg_trigger t
      JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE t.tgfoid = 'fencelock.protect_guard()'::pg_catalog.regprocedure;
    IF tables IS NOT NULL THEN
        RAISE EXCEPTION 'fencelock: down: tables still protected by pgfence Protect: %: unprotect them first (DROP TRIGGER fencelock_protect ON each), or use migrations.Down with migrations.Force()', tables
            USING ERRCODE = '2BP01';
    END IF;
END;
$$;
-- +goose StatementEnd
DROP FUNCTION fencelock.protect_guard();
DROP FUNCTION fencelock.prune(interval);
DROP FUNCTION fencelock.run_state(text, text);
DROP FUNCTION fencelock.close(text, bigint, text, text, text, text, boolean);
DROP FUNCTION fencelock.precheck(text, bigint, text, text);
DROP FUNCTION fencelock.open(text, bigint, text, text, text);
DROP FUNCTION fencelock.close_full(text, bigint, text, text, text, text, boolean);
DROP FUNCTION fencelock.open_full(text, bigint, text, text, text);
DROP FUNCTION fencelock.advance(text, bigint, text);
DROP FUNCTION fencelock.claim(text, bigint, text, text);
DROP FUNCTION fencelock.apply_key(text, text, bigint);
DROP FUNCTION fencelock.check_token(text, bigint, text, bigint, text);
DROP FUNCTION fencelock.check_args(text, text, bigint, text, text, text, boolean);
DROP FUNCTION fencelock.raise_finished(text, text, bigint);
DROP FUNCTION fencelock.raise_applied(text, text, bigint);
DROP FUNCTION fencelock.raise_stale(text, bigint, bigint, text);
DROP FUNCTION fencelock.raise_invalid(text, text);
