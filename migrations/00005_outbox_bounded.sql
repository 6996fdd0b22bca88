-- fencelock schema v5: the outbox's operators' reads stay bounded however
-- large the backlog grows, and sqlfence's effects commit only through the
-- commit's check.
--
-- 00003 counts the outbox in one pass over the table (outbox_counts) and
-- finds dead rows by walking the primary key past every live one
-- (outbox_list with dead), because dead rows have no index. With a backlog
-- of a million rows a count reads a million rows, and a monitor that
-- takes one every interval pays that each time. This migration adds:
--
--   outbox_dead_idx, a partial index of the dead rows by id. A new row is
--   live, so an insert only evaluates its predicate; a row enters it when
--   it dies (an update that moves due_at, already outside HOT) and leaves
--   it when it is requeued or deleted.
--   outbox_backlog(limit), the counts of outbox_counts read over indexes,
--   at most limit + 1 rows per index, each count saying whether it reached
--   the limit.
--   outbox_list repeated whole (CREATE OR REPLACE) so that dead rows are
--   listed through outbox_dead_idx.
--
-- outbox_counts stays as it is, exact, for tables known to be small.
-- Building the index reads the table once and holds off inserts into
-- fencelock.outbox until it is built, in the migration's transaction.
--
-- It also makes sqlfence's effects commit only through the commit's
-- check. sqlfence writes them at once in fn's transaction (so that a
-- savepoint fn rolls back in SQL undoes them), where fn could also end the
-- transaction itself (a COMMIT sent as SQL, Commit on its *sql.Tx): rows
-- written live would then commit without the check, and be sent however
-- stale their token. So package outbox inserts them dead, with the reason
-- as last_error, returning their ids (the grants below let a writer do
-- it), and sqlfence's commit statement passes fencelock.close's result to
-- outbox_revive, which makes those rows live again: an argument is
-- evaluated before the call, so they come alive only in a transaction
-- whose close passed. A transaction that fn ended leaves them dead, with the reason,
-- never sent (fencectl outbox list --dead shows them).
--
-- A released migration never changes: a later change is a new migration
-- that repeats each changed function whole, and whose Down restores what
-- it replaced.

-- +goose Up

CREATE INDEX outbox_dead_idx ON fencelock.outbox (id) WHERE dead_at IS NOT NULL;

-- outbox_backlog counts the rows by state as outbox_counts does (due: may
-- be claimed now; waiting: backing off, or parked behind an older ordered
-- row; claimed: held by a relay within its visibility timeout; dead),
-- reading at most p_limit + 1 rows from each of four index ranges: live
-- unordered rows due now and due later (outbox_due_idx), live ordered rows
-- (outbox_ordered_idx, which has no due time: each is read to tell its
-- state) and dead rows (outbox_dead_idx). A count is exact when every
-- range it is read from had at most p_limit rows and it is at most p_limit
-- itself; otherwise its *_capped column is true, and it reports a lower
-- bound of at most p_limit. So a count never exceeds p_limit, and a count
-- of a state with more rows than that is p_limit or, when another state's
-- rows filled a range they share, less; the *_capped column says which.
-- STABLE, so its four reads share one snapshot: the counts add up to one
-- moment's table.
-- +goose StatementBegin
CREATE FUNCTION fencelock.outbox_backlog(p_limit integer)
RETURNS TABLE (due bigint, waiting bigint, claimed bigint, dead bigint,
               due_capped boolean, waiting_capped boolean, claimed_capped boolean, dead_capped boolean)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n    bigint := p_limit::bigint + 1;
    ud   bigint; -- unordered, due now
    uf   bigint; -- unordered, due later
    ufc  bigint; -- of those, claimed
    od   bigint; -- ordered
    odd  bigint; -- of those, due now
    odc  bigint; -- of those, due later and claimed
    dd   bigint; -- dead
    more boolean;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        PERFORM fencelock.raise_invalid('outbox_backlog', 'a limit >= 1 is required');
    END IF;
    -- Each range in its index's order, so that each is an index scan that
    -- stops after n rows.
    SELECT count(*) INTO ud FROM (
        SELECT 1 FROM fencelock.outbox o
         WHERE o.dead_at IS NULL AND NOT o.ordered AND o.due_at <= now()
         ORDER BY o.due_at LIMIT n) s;
    SELECT count(*), count(*) FILTER (WHERE s.claim IS NOT NULL) INTO uf, ufc FROM (
        SELECT o.claim FROM fencelock.outbox o
         WHERE o.dead_at IS NULL AND NOT o.ordered AND o.due_at > now()
         ORDER BY o.due_at LIMIT n) s;
    SELECT count(*), count(*) FILTER (WHERE s.due_at <= now()),
           count(*) FILTER (WHERE s.due_at > now() AND s.claim IS NOT NULL) INTO od, odd, odc FROM (
        SELECT o.due_at, o.claim FROM fencelock.outbox o
         WHERE o.dead_at IS NULL AND o.ordered
         ORDER BY o.resource, o.token, o.id LIMIT n) s;
    SELECT count(*) INTO dd FROM (
        SELECT 1 FROM fencelock.outbox o
         WHERE o.dead_at IS NOT NULL
         ORDER BY o.id LIMIT n) s;
    -- A range that gave n rows has more than p_limit: what is counted from
    -- it is a lower bound.
    more := od = n;
    due := ud + odd;
    waiting := uf - ufc + od - odd - odc;
    claimed := ufc + odc;
    dead := dd;
    due_capped := more OR ud = n OR due > p_limit;
    waiting_capped := more OR uf = n OR waiting > p_limit;
    claimed_capped := more OR uf = n OR claimed > p_limit;
    dead_capped := dd = n;
    due := least(due, p_limit);
    waiting := least(waiting, p_limit);
    claimed := least(claimed, p_limit);
    dead := least(dead, p_limit);
    RETURN NEXT;
END;
$$;
-- +goose StatementEnd

-- outbox_list returns up to p_limit rows, oldest first, without their
-- payload (its size instead): dead rows only when p_dead, through
-- outbox_dead_idx (as many rows read as are listed); else live ones, by
-- the primary key, which also steps over the dead rows older than the
-- last one listed.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.outbox_list(p_dead boolean, p_limit integer)
RETURNS TABLE (id bigint, resource text, token bigint, holder text, destination text, key text,
               payload_bytes integer, ordered boolean, attempts integer, created_at timestamptz,
               due_at timestamptz, claimed boolean, last_error text, dead_at timestamptz)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n integer := greatest(coalesce(p_limit, 100), 0);
BEGIN
    IF coalesce(p_dead, false) THEN
        RETURN QUERY
        SELECT o.id, o.resource, o.token, o.holder, o.destination, o.key, octet_length(o.payload), o.ordered,
               o.attempts, o.created_at, o.due_at, o.claim IS NOT NULL AND o.due_at > now(), o.last_error, o.dead_at
          FROM fencelock.outbox o
         WHERE o.dead_at IS NOT NULL
         ORDER BY o.id
         LIMIT n;
    ELSE
        RETURN QUERY
        SELECT o.id, o.resource, o.token, o.holder, o.destination, o.key, octet_length(o.payload), o.ordered,
               o.attempts, o.created_at, o.due_at, o.claim IS NOT NULL AND o.due_at > now(), o.last_error, o.dead_at
          FROM fencelock.outbox o
         WHERE o.dead_at IS NULL
         ORDER BY o.id
         LIMIT n;
    END IF;
END;
$$;
-- +goose StatementEnd

-- A writer may insert a row dead, with its reason, and read back the ids
-- of the rows it inserts (INSERT ... RETURNING id): what package outbox
-- does with sqlfence (see above). No new power to send anything: a role
-- that may insert a live row may insert a dead one, and a dead row is
-- never sent. The ids tell a role how many rows the outbox holds, no more
-- (the fencelock tables' contents are PUBLIC's to read already).
GRANT INSERT (dead_at, last_error), SELECT (id) ON fencelock.outbox TO PUBLIC;

-- outbox_revive makes the rows p_ids live again (due now, dead_at and
-- last_error cleared) and returns p_closed: sqlfence's commit statement
-- calls it as outbox_revive(ids, fencelock.close(...)), so it runs only
-- once close's check has passed (an argument is evaluated before the
-- call; close raises otherwise, and the statement fails). It revives only
-- rows of the transaction's claim that died at the transaction's start
-- time (now()), which are the rows this transaction recorded: an id of a
-- row another transaction recorded, or of a row a rolled-back savepoint
-- removed, changes nothing. Reviving rows by id is no new power for a
-- role: one that may execute it may execute outbox_requeue, which revives
-- any dead row. Not STRICT (close may return NULL); PL/pgSQL, so never
-- inlined (the argument is always evaluated).
-- +goose StatementBegin
CREATE FUNCTION fencelock.outbox_revive(p_ids bigint[], p_closed bigint)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE fencelock.outbox o
       SET dead_at = NULL, last_error = NULL, due_at = pg_catalog.now()
     WHERE o.id OPERATOR(pg_catalog.=) ANY (p_ids)
       AND o.dead_at OPERATOR(pg_catalog.=) pg_catalog.now()
       AND o.token::pg_catalog.text OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) pg_catalog.length(o.resource)::pg_catalog.text
           OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) o.resource OPERATOR(pg_catalog.||) o.holder
           OPERATOR(pg_catalog.=) pg_catalog.current_setting('fencelock.claim', true);
    RETURN p_closed;
END;
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION fencelock.outbox_revive(bigint[], bigint) IS
    'outbox_revive(ids, closed): internal to sqlfence''s commit, as outbox_revive(ids, fencelock.close(...)): makes the rows ids that this transaction recorded dead (its claim, dead since it began) live again, once close has passed. Returns closed.';
COMMENT ON FUNCTION fencelock.outbox_backlog(integer) IS
    'outbox_backlog(limit): rows due, waiting, claimed and dead as outbox_counts counts them, read over indexes, at most limit + 1 rows per index; a count is at most limit, and its *_capped column is true when it may be more (fencectl outbox list, the otel backlog gauge). 22023 for a limit below 1.';
COMMENT ON FUNCTION fencelock.outbox_counts() IS
    'outbox_counts(): rows due, waiting, claimed and dead, exact: one pass over the table (outbox_backlog counts up to a limit over indexes).';

REVOKE ALL ON FUNCTION fencelock.outbox_backlog(integer), fencelock.outbox_revive(bigint[], bigint) FROM PUBLIC;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.schema_version() RETURNS bigint LANGUAGE sql STABLE AS $$ SELECT 5::bigint $$;
-- +goose StatementEnd

-- +goose Down
-- outbox_list and the comment on outbox_counts as 00003 defines them,
-- the writer's columns as 00003 grants them, schema_version() as 00004
-- does.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.outbox_list(p_dead boolean, p_limit integer)
RETURNS TABLE (id bigint, resource text, token bigint, holder text, destination text, key text,
               payload_bytes integer, ordered boolean, attempts integer, created_at timestamptz,
               due_at timestamptz, claimed boolean, last_error text, dead_at timestamptz)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT o.id, o.resource, o.token, o.holder, o.destination, o.key, octet_length(o.payload), o.ordered,
           o.attempts, o.created_at, o.due_at, o.claim IS NOT NULL AND o.due_at > now(), o.last_error, o.dead_at
      FROM fencelock.outbox o
     WHERE (o.dead_at IS NOT NULL) = coalesce(p_dead, false)
     ORDER BY o.id
     LIMIT greatest(coalesce(p_limit, 100), 0);
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION fencelock.outbox_counts() IS
    'outbox_counts(): rows due, waiting, claimed and dead.';
-- IF EXISTS: a database migrated to 5 by a development build of 00005
-- has no outbox_revive, and migrates down to 4 and up again to get it.
DROP FUNCTION IF EXISTS fencelock.outbox_revive(bigint[], bigint);
REVOKE INSERT (dead_at, last_error), SELECT (id) ON fencelock.outbox FROM PUBLIC;
DROP FUNCTION fencelock.outbox_backlog(integer);
DROP INDEX fencelock.outbox_dead_idx;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.schema_version() RETURNS bigint LANGUAGE sql STABLE AS $$ SELECT 4::bigint $$;
-- +goose StatementEnd
