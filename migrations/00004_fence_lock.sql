-- fencelock schema v4: the fence lock, for every database.
--
-- 00001 and 00002 were changed after a landing had released them: the
-- fence lock (a transaction-level advisory lock per resource, taken
-- before the fence row's lock), the one claim setting
-- fencelock.claim, fencelock.schema_version(), SELECT on the three tables
-- for PUBLIC, and a cheaper close. A database migrated with the earlier
-- files records versions 1 and 2 and so, upgraded, got only 00003: it kept
-- the row-lock functions while the stores check their tokens under the
-- advisory lock with plain statements, which an application role may not
-- run without the read grant, and which a token stored without the
-- exclusive advisory lock does not keep in commit order.
--
-- This migration brings either history to the same schema: it repeats
-- whole each function whose body changed (as 00002 defines it now, where
-- each is documented), the grants and the comment 00001 and 00002 give,
-- and schema_version() with its ACL and comment. On a database whose 00001
-- and 00002 are the current files it changes nothing but
-- schema_version(), which is now STABLE: every migration redefines it, so
-- its value is not IMMUTABLE, which would promise that it never changes
-- (and let it into an index expression or a generated column).
--
-- A released migration never changes: a later change is a new migration
-- that repeats each changed function whole, and whose Down restores what
-- it replaced.

-- +goose Up

-- claim: a new token is stored under the exclusive fence lock, a re-claim
-- checks under the shared one; sets fencelock.claim.
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
        -- Already ours: the resource's shared lock (the fence lock, above),
        -- then the row's, keep a newer claim out until we end. Under READ
        -- COMMITTED the share lock waits for a concurrent updater and
        -- returns the latest row, which is checked again.
        PERFORM pg_advisory_xact_lock_shared(pg_catalog.hashtextextended(p_resource, 1380730187));
        SELECT f.token, f.holder INTO cur, cur_holder
          FROM fencelock.fence f WHERE f.resource = p_resource FOR SHARE;
        ours := fencelock.check_token(p_resource, p_token, p_holder, cur, cur_holder);
    END IF;
    IF NOT ours THEN
        -- The resource's exclusive lock first (a new token waits for every
        -- check that holds the shared one, and each such check that comes
        -- later sees the new token), then FOR UPDATE, which waits for a
        -- concurrent claimer and then re-reads. Locks are always taken in
        -- that order, advisory then row, so no two claims deadlock.
        PERFORM pg_advisory_xact_lock(pg_catalog.hashtextextended(p_resource, 1380730187));
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

    PERFORM set_config('fencelock.claim', p_token || ':' || length(p_resource) || ':' || p_resource || p_holder, true);
    IF p_key IS NOT NULL THEN
        PERFORM fencelock.apply_key(p_resource, p_key, p_token);
    END IF;
    RETURN coalesce(cur, 0);
END;
$$;
-- +goose StatementEnd

-- open_full: open's whole check; sets fencelock.claim.
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
    PERFORM set_config('fencelock.claim', p_token || ':' || length(p_resource) || ':' || p_resource || p_holder, true);
    RETURN coalesce(cur, 0);
END;
$$;
-- +goose StatementEnd

-- open: the check at begin; sets fencelock.claim.
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
    RETURN CASE WHEN pg_catalog.set_config('fencelock.claim', p_token::pg_catalog.text OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) pg_catalog.length(p_resource)::pg_catalog.text OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) p_resource OPERATOR(pg_catalog.||) p_holder, true) IS NULL
                THEN NULL ELSE cur END;
END;
$$;
-- +goose StatementEnd

-- close_full: close's whole claim, under the shared fence lock.
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

    PERFORM pg_advisory_xact_lock_shared(pg_catalog.hashtextextended(p_resource, 1380730187));
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

-- close: the claim at commit, under the shared fence lock, the token
-- read in the statement that moves the run or records the key.
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
    IF p_finish OR p_key OPERATOR(pg_catalog.=) '' OR p_run_key OPERATOR(pg_catalog.=) ''
       OR (p_run_key IS NULL AND p_cursor IS NOT NULL) THEN
        RETURN fencelock.close_full(p_resource, p_token, p_holder, p_key, p_run_key, p_cursor, p_finish);
    END IF;
    -- The resource's shared fence lock, then the token read in a later
    -- statement (its snapshot is taken once the lock is held): every new
    -- token is stored under the exclusive lock, so the token read is the
    -- latest and stays so until this transaction ends. The read rides in
    -- the statement that moves the run or records the key, when there is
    -- one: a statement less.
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(pg_catalog.hashtextextended(p_resource, 1380730187));
    IF p_run_key IS NOT NULL THEN
        UPDATE fencelock.runs r
           SET token = p_token, cursor = COALESCE(p_cursor, ''), updated_at = pg_catalog.now()
         WHERE r.resource OPERATOR(pg_catalog.=) p_resource AND r.run_key OPERATOR(pg_catalog.=) p_run_key
           AND NOT r.finished
           AND (SELECT f.token OPERATOR(pg_catalog.=) p_token AND f.holder OPERATOR(pg_catalog.=) p_holder
                  FROM fencelock.fence f WHERE f.resource OPERATOR(pg_catalog.=) p_resource);
        IF NOT FOUND THEN
            RETURN fencelock.close_full(p_resource, p_token, p_holder, p_key, p_run_key, p_cursor, p_finish);
        END IF;
        IF p_key IS NOT NULL THEN
            INSERT INTO fencelock.applied (resource, key, token) VALUES (p_resource, p_key, p_token)
            ON CONFLICT (resource, key) DO NOTHING;
            IF NOT FOUND THEN
                RETURN fencelock.close_full(p_resource, p_token, p_holder, p_key, p_run_key, p_cursor, p_finish);
            END IF;
        END IF;
        RETURN p_token;
    END IF;
    IF p_key IS NOT NULL THEN
        INSERT INTO fencelock.applied (resource, key, token)
        SELECT p_resource, p_key, p_token
         WHERE (SELECT f.token OPERATOR(pg_catalog.=) p_token AND f.holder OPERATOR(pg_catalog.=) p_holder
                  FROM fencelock.fence f WHERE f.resource OPERATOR(pg_catalog.=) p_resource)
        ON CONFLICT (resource, key) DO NOTHING;
        IF NOT FOUND THEN
            RETURN fencelock.close_full(p_resource, p_token, p_holder, p_key, p_run_key, p_cursor, p_finish);
        END IF;
        RETURN p_token;
    END IF;
    SELECT f.token, f.holder INTO cur, cur_holder
      FROM fencelock.fence f WHERE f.resource OPERATOR(pg_catalog.=) p_resource;
    IF (cur OPERATOR(pg_catalog.=) p_token AND cur_holder OPERATOR(pg_catalog.=) p_holder) IS NOT TRUE THEN
        RETURN fencelock.close_full(p_resource, p_token, p_holder, p_key, p_run_key, p_cursor, p_finish);
    END IF;
    RETURN cur;
END;
$$;
-- +goose StatementEnd

-- protect_guard: reads fencelock.claim (or the three older settings).
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
    c        text := nullif(current_setting('fencelock.claim', true), '');
    r        text := nullif(current_setting('fencelock.resource', true), '');
    t        text := nullif(current_setting('fencelock.token', true), '');
    h        text := nullif(current_setting('fencelock.holder', true), '');
    n        integer;
    rest     text;
    required text;
    problem  text;
BEGIN
    -- fencelock.claim is '<token>:<length of resource>:<resource><holder>'
    -- (see the fence lock, above); a writer may set the three settings
    -- fencelock.resource, fencelock.token and fencelock.holder instead.
    IF c IS NOT NULL THEN
        t := split_part(c, ':', 1);
        n := split_part(c, ':', 2)::integer;
        rest := substr(c, length(t) + length(n::text) + 3);
        r := left(rest, n);
        h := nullif(substr(rest, n + 1), '');
        -- The statement that fired the trigger may read the claim the
        -- same way (the outbox's outbox_add does): set the three too.
        PERFORM set_config('fencelock.resource', r, true),
                set_config('fencelock.token', t, true),
                set_config('fencelock.holder', h, true);
    END IF;
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

-- What 00002 grants: a role that may use the schema may read the three
-- tables (pgfence and sqlfence check tokens with plain statements).
GRANT SELECT ON fencelock.fence, fencelock.applied, fencelock.runs TO PUBLIC;

-- schema_version() as 00001 makes it (an earlier 00003 created it on the
-- earlier files, executable by PUBLIC and without its comment).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.schema_version() RETURNS bigint LANGUAGE sql STABLE AS $$ SELECT 4::bigint $$;
-- +goose StatementEnd

COMMENT ON FUNCTION fencelock.schema_version() IS 'Version of the fencelock migrations this schema implements (migrations.Up adopts a schema by it; redefined by every migration).';

REVOKE ALL ON FUNCTION fencelock.schema_version() FROM PUBLIC;

-- +goose Down
-- The functions, the grants and the comment are what 00001 to 00003
-- define: only schema_version() goes back (to 3, IMMUTABLE as there).
-- Down does not restore the row-lock functions of the earlier files.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.schema_version() RETURNS bigint LANGUAGE sql IMMUTABLE AS $$ SELECT 3::bigint $$;
-- +goose StatementEnd
