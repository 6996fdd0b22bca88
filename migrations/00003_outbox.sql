-- fencelock schema v2, part 3: the transactional outbox (package outbox).
-- A fenced transaction records its side effects (an HTTP call, a message)
-- as rows here, in the round trip that commits it; a relay claims due rows
-- in short transactions of its own, sends them, and deletes each row it
-- sent. So an effect leaves only if its transaction committed, and a stale
-- holder's effects never do: they roll back with its writes.
--
-- A writer inserts its rows itself (INSERT on the columns a writer sets
-- is granted to PUBLIC, reachable only with USAGE on the schema, so an
-- application role needs no grant of its own); the row trigger
-- fencelock_outbox_protect refuses a row that does not carry its
-- transaction's claim (FL002). Everything else goes through the functions
-- below (SECURITY DEFINER, search_path pinned), like the rest of the
-- schema: outbox_add for writers in raw SQL, outbox_claim / outbox_ack /
-- outbox_retry / outbox_release for relays, outbox_list / outbox_counts /
-- outbox_requeue for operators.

-- +goose Up

-- One row per effect not yet delivered. resource, token and holder are the
-- claim of the transaction that wrote it: the trigger below refuses any
-- other.
--
-- A row is due when due_at has passed. Claiming sets claim (a number the
-- relay picked for that claim) and moves due_at by the visibility timeout:
-- a relay that dies or hangs loses the row to the next claim once it is
-- due again, and its late ack, which names its claim, matches nothing.
-- After max attempts (or a terminal refusal) dead_at is set: dead rows are
-- never claimed until requeued.
--
-- Written in every transaction that records an effect, so it is kept
-- lean: no CHECK constraint (each costs its expression's compilation in
-- every inserting statement; outbox_add and package outbox check what
-- they write), headers NULL when there are none.
CREATE TABLE fencelock.outbox (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource    text        NOT NULL,
    token       bigint      NOT NULL,
    holder      text        NOT NULL,
    destination text        NOT NULL,
    key         text        NOT NULL,
    payload     bytea       NOT NULL,
    headers     jsonb,
    ordered     boolean     NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    due_at      timestamptz NOT NULL DEFAULT now(),
    attempts    integer     NOT NULL DEFAULT 0,
    claim       bigint,
    last_error  text,
    dead_at     timestamptz
);

-- The claim's two paths, neither a full scan (each row is in one of them;
-- each costs every insert its predicate, the one a row matches its entry): unordered rows by due time;
-- ordered rows by resource, then token and id, so that the head of each
-- resource is found by one index probe per resource.
CREATE INDEX outbox_due_idx ON fencelock.outbox (due_at) WHERE dead_at IS NULL AND NOT ordered;
CREATE INDEX outbox_ordered_idx ON fencelock.outbox (resource, token, id) WHERE dead_at IS NULL AND ordered;
-- Dead rows have no index of their own: only operators look for them
-- (outbox_list, outbox_counts), and every index costs each insert.

COMMENT ON TABLE fencelock.outbox IS 'Side effects recorded by fenced transactions (package outbox), deleted once delivered. Written in a transaction with a claim, each row carrying that claim (resource, token, holder): the fencelock_outbox_protect trigger refuses any other row (FL002); the claim is checked under the fence lock by the transaction itself (the commit''s check in a guarded transaction, fencelock.claim or outbox_add in raw SQL). Claimed, retried and deleted by relays through outbox_claim/outbox_retry/outbox_ack.';
COMMENT ON COLUMN fencelock.outbox.resource IS 'Resource (lock name) of the transaction that recorded the effect.';
COMMENT ON COLUMN fencelock.outbox.token IS 'Fencing token of that transaction; sent as Fencing-Token.';
COMMENT ON COLUMN fencelock.outbox.holder IS 'Holder of that transaction; sent as Fencing-Holder.';
COMMENT ON COLUMN fencelock.outbox.headers IS 'Extra headers, {name: [values]}; NULL when none.';
COMMENT ON COLUMN fencelock.outbox.destination IS 'Where the effect goes (a URL for the HTTP sender).';
COMMENT ON COLUMN fencelock.outbox.key IS 'Idempotency key; sent as Idempotency-Key, the same on every attempt.';
COMMENT ON COLUMN fencelock.outbox.ordered IS 'Delivered only after every older live ordered row of the same resource (by token, then id).';
COMMENT ON COLUMN fencelock.outbox.due_at IS 'Next time the row may be claimed: now at insert, claim time + visibility timeout while claimed, + backoff after a failure.';
COMMENT ON COLUMN fencelock.outbox.attempts IS 'Claims so far (each is a delivery attempt).';
COMMENT ON COLUMN fencelock.outbox.claim IS 'The claim of the relay that holds the row, NULL when free; an ack or retry must name it.';
COMMENT ON COLUMN fencelock.outbox.last_error IS 'Why the last attempt failed.';
COMMENT ON COLUMN fencelock.outbox.dead_at IS 'Set when the row ran out of attempts or was refused for good; dead rows wait for fencelock.outbox_requeue.';

-- outbox_guard, the row trigger fencelock_outbox_protect: a row is
-- accepted only with the claim of its transaction (the setting
-- fencelock.claim, which open, the stores' check at begin and claim set),
-- so a row written without a claim, or for another one, is refused
-- (FL002, as protect_guard refuses a write to a protected table). It does
-- not check the claim against the fence: the transaction's own claim does
-- that, under the fence lock, before it commits (a guarded transaction's
-- commit; in raw SQL fencelock.claim, which the writer calls first and
-- outbox_add calls itself), so every row commits only with a current
-- token. A raw SQL writer that only ran precheck must claim.
--
-- It runs for every effect recorded, so it is written like open and close
-- (see 00002): no SET clause, not SECURITY DEFINER (it reads only the
-- row and the setting), every name schema-qualified, and the row's claim
-- compared with the setting in one expression,
-- '<token>:<length of resource>:<resource><holder>'.
-- +goose StatementBegin
CREATE FUNCTION fencelock.outbox_guard()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    c pg_catalog.text;
BEGIN
    IF (NEW.token::pg_catalog.text OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) pg_catalog.length(NEW.resource)::pg_catalog.text
        OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) NEW.resource OPERATOR(pg_catalog.||) NEW.holder
        OPERATOR(pg_catalog.=) pg_catalog.current_setting('fencelock.claim', true)) IS NOT TRUE THEN
        -- After a claiming transaction ends the setting reads '' for the
        -- rest of the session, not NULL.
        c := pg_catalog.current_setting('fencelock.claim', true);
        RAISE EXCEPTION 'fencelock: INSERT on fencelock.outbox %',
            CASE WHEN c IS NULL OR c OPERATOR(pg_catalog.=) ''
                 THEN 'without a fence claim: record effects inside a guarded transaction, or call fencelock.claim(resource, token, holder) first in the same transaction (fencelock.outbox_add does it for you)'
                 ELSE pg_catalog.format('of a row for resource "%s", token %s, holder "%s", which is not the transaction''s claim: a row carries the claim of its transaction (fencelock.outbox_add fills it in)',
                                        NEW.resource, NEW.token, NEW.holder) END
            USING ERRCODE = 'FL002',
                  DETAIL = pg_catalog.json_build_object('table', 'fencelock.outbox',
                      'claimed', CASE WHEN c OPERATOR(pg_catalog.<>) '' THEN c END, 'required', NEW.resource)::pg_catalog.text;
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER fencelock_outbox_protect BEFORE INSERT ON fencelock.outbox
    FOR EACH ROW EXECUTE FUNCTION fencelock.outbox_guard();

-- A writer needs no grant of its own: the columns it sets are open to
-- every role that may use the schema (the trigger holds the claim's to
-- the transaction's); the relay's columns are the functions'.
GRANT INSERT (resource, token, holder, destination, key, payload, headers, ordered) ON fencelock.outbox TO PUBLIC;

-- outbox_add records effects for the transaction's claim, for writers in
-- raw SQL and other languages: p_effects is a JSON array of
-- {"d": destination, "k": key, "p": payload in base64,
-- "h": {name: [values]}, "o": ordered}, each with a non-empty d and k
-- (22023 otherwise), each row carrying the transaction's claim. It claims
-- that claim first (fencelock.claim: the token checked, and the fence
-- lock held, until the transaction ends; FL001 when overtaken), so a
-- writer that only ran precheck commits in token order too; without a
-- claim the trigger refuses the rows (FL002). With p_notify it also queues a NOTIFY on
-- channel fencelock_outbox, sent by Postgres at commit (relays that
-- listen wake at once; it costs a lock at commit, see package outbox).
-- +goose StatementBegin
CREATE FUNCTION fencelock.outbox_add(p_effects jsonb, p_notify boolean DEFAULT false)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c    text := nullif(current_setting('fencelock.claim', true), '');
    t    text;
    n    text;
    rest text;
    r    text;
    h    text;
    cnt  integer;
BEGIN
    IF EXISTS (SELECT FROM jsonb_array_elements(p_effects) e
                WHERE coalesce(e->>'d', '') = '' OR coalesce(e->>'k', '') = '') THEN
        PERFORM fencelock.raise_invalid('outbox_add', 'every effect needs a non-empty "d" (destination) and "k" (key)');
    END IF;
    IF c IS NOT NULL THEN
        t := split_part(c, ':', 1);
        n := split_part(c, ':', 2);
        rest := substr(c, length(t) + length(n) + 3);
        r := left(rest, n::integer);
        h := substr(rest, n::integer + 1);
        PERFORM fencelock.claim(r, t::bigint, h);
    END IF;
    INSERT INTO fencelock.outbox (resource, token, holder, destination, key, payload, headers, ordered)
    SELECT r, t::bigint, h, e->>'d', e->>'k', decode(coalesce(e->>'p', ''), 'base64'),
           nullif(e->'h', '{}'::jsonb), coalesce((e->>'o')::boolean, false)
      FROM jsonb_array_elements(p_effects) e;
    GET DIAGNOSTICS cnt = ROW_COUNT;
    IF p_notify AND cnt > 0 THEN
        PERFORM pg_notify('fencelock_outbox', '');
    END IF;
    RETURN cnt;
END;
$$;
-- +goose StatementEnd

-- outbox_heads returns the ids of up to p_limit due ordered rows that
-- head their resource (no older live ordered row of the same resource),
-- for resources after p_after and up to p_upto (NULL: no bound), in
-- resource order. A loose scan of outbox_ordered_idx: one probe per
-- resource with live ordered rows, however many rows each has queued; it
-- stops once p_limit due heads are found, or past p_upto (the bound stops
-- the walk rather than filter the index scan, which would read on through
-- every row past it). Internal, called by outbox_claim (no SET clause,
-- so that it can be inlined).
-- +goose StatementBegin
CREATE FUNCTION fencelock.outbox_heads(p_after text, p_upto text, p_limit integer)
RETURNS TABLE (id bigint, pos bigint)
LANGUAGE sql
STABLE
AS $$
    WITH RECURSIVE heads AS (
        (SELECT o.resource, o.id, o.due_at, 1::bigint AS pos FROM fencelock.outbox o
          WHERE o.ordered AND o.dead_at IS NULL AND o.resource OPERATOR(pg_catalog.>) p_after
          ORDER BY o.resource, o.token, o.id LIMIT 1)
        UNION ALL
        SELECT nx.resource, nx.id, nx.due_at, h.pos OPERATOR(pg_catalog.+) 1 FROM heads h CROSS JOIN LATERAL (
            SELECT o.resource, o.id, o.due_at FROM fencelock.outbox o
             WHERE o.ordered AND o.dead_at IS NULL AND o.resource OPERATOR(pg_catalog.>) h.resource
             ORDER BY o.resource, o.token, o.id LIMIT 1) nx
         WHERE p_upto IS NULL OR h.resource OPERATOR(pg_catalog.<) p_upto
    )
    SELECT h.id, h.pos FROM heads h
     WHERE h.due_at OPERATOR(pg_catalog.<=) pg_catalog.now()
       AND (p_upto IS NULL OR h.resource OPERATOR(pg_catalog.<=) p_upto)
     LIMIT p_limit;
$$;
-- +goose StatementEnd

-- outbox_claim claims up to p_limit due rows for claim p_claim, for
-- p_visibility, and returns them, each statement FOR UPDATE SKIP LOCKED
-- so that relays never wait for one another: first ordered rows at the
-- head of their resource (outbox_heads, starting after p_after, the last
-- resource the relay claimed, and wrapping around, so that every resource
-- gets its turn) for half the batch, then unordered rows oldest due first
-- (outbox_due_idx), then ordered heads again for whatever room is left
-- (only if the first pass found a full half: otherwise there are none).
-- Each claim counts as an attempt.
-- +goose StatementBegin
CREATE FUNCTION fencelock.outbox_claim(p_claim bigint, p_limit integer, p_visibility interval, p_after text DEFAULT '')
RETURNS TABLE (id bigint, resource text, token bigint, holder text, destination text, key text,
               payload bytea, headers jsonb, ordered boolean, attempts integer, created_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    after       text := coalesce(p_after, '');
    got         integer := 0;
    ordered_got integer := 0;
    n           integer;
BEGIN
    IF p_claim IS NULL OR p_limit IS NULL OR p_limit < 1 OR p_visibility IS NULL OR p_visibility <= interval '0' THEN
        PERFORM fencelock.raise_invalid('outbox_claim', 'a claim, a limit >= 1 and a visibility > 0 are required');
    END IF;
    FOR pass IN 1..3 LOOP
        n := CASE pass WHEN 1 THEN greatest(p_limit / 2, 1) ELSE p_limit - got END;
        EXIT WHEN n <= 0;
        -- Pass 3 only when pass 1 filled its half: else no ordered head was
        -- left.
        CONTINUE WHEN pass = 3 AND ordered_got < greatest(p_limit / 2, 1);
        IF pass = 2 THEN
            RETURN QUERY
            WITH due AS (
                SELECT o.id FROM fencelock.outbox o
                 WHERE o.dead_at IS NULL AND NOT o.ordered AND o.due_at <= now()
                 ORDER BY o.due_at
                 LIMIT n
                 FOR UPDATE SKIP LOCKED
            )
            UPDATE fencelock.outbox o
               SET due_at = now() + p_visibility, attempts = o.attempts + 1, claim = p_claim
              FROM due WHERE o.id = due.id
            RETURNING o.id, o.resource, o.token, o.holder, o.destination, o.key, o.payload, o.headers, o.ordered, o.attempts, o.created_at;
        ELSE
            RETURN QUERY
            WITH heads AS (
                SELECT h.id, 1 AS part, h.pos FROM fencelock.outbox_heads(after, NULL, n) h
                UNION ALL
                SELECT h.id, 2, h.pos FROM fencelock.outbox_heads('', after, n) h
            ), due AS (
                SELECT o.id FROM heads JOIN fencelock.outbox o ON o.id = heads.id
                 WHERE o.dead_at IS NULL AND o.due_at <= now()
                 ORDER BY heads.part, heads.pos
                 LIMIT n
                 FOR UPDATE OF o SKIP LOCKED
            )
            UPDATE fencelock.outbox o
               SET due_at = now() + p_visibility, attempts = o.attempts + 1, claim = p_claim
              FROM due WHERE o.id = due.id
            RETURNING o.id, o.resource, o.token, o.holder, o.destination, o.key, o.payload, o.headers, o.ordered, o.attempts, o.created_at;
        END IF;
        GET DIAGNOSTICS n = ROW_COUNT;
        got := got + n;
        IF pass = 1 THEN
            ordered_got := n;
        END IF;
    END LOOP;
END;
$$;
-- +goose StatementEnd

-- outbox_ack deletes the rows p_ids[i] still held by claim p_claims[i]
-- (sent, or refused as superseded); a row another claim took meanwhile is
-- left alone. Returns the rows deleted.
-- +goose StatementBegin
CREATE FUNCTION fencelock.outbox_ack(p_claims bigint[], p_ids bigint[])
RETURNS integer
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH d AS (
        DELETE FROM fencelock.outbox o
         USING unnest(p_claims, p_ids) AS u(claim, id)
         WHERE o.id = u.id AND o.claim = u.claim
        RETURNING 1)
    SELECT count(*)::integer FROM d;
$$;
-- +goose StatementEnd

-- outbox_retry records failed attempts: row p_ids[i], held by claim
-- p_claims[i], failed with p_errors[i]; it is due again in p_delays_ms[i]
-- ms, or dead at once when p_dead[i]. Rows another claim took meanwhile
-- are left alone. Returns the rows changed.
-- +goose StatementBegin
CREATE FUNCTION fencelock.outbox_retry(p_claims bigint[], p_ids bigint[], p_errors text[], p_delays_ms bigint[], p_dead boolean[])
RETURNS integer
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH f AS (
        UPDATE fencelock.outbox o
           SET claim = NULL, last_error = u.err,
               due_at = now() + u.delay_ms * interval '1 millisecond',
               dead_at = CASE WHEN u.dead THEN now() END
          FROM unnest(p_claims, p_ids, p_errors, p_delays_ms, p_dead) AS u(claim, id, err, delay_ms, dead)
         WHERE o.id = u.id AND o.claim = u.claim
        RETURNING 1)
    SELECT count(*)::integer FROM f;
$$;
-- +goose StatementEnd

-- outbox_release hands rows back unsent (a relay that stops with rows it
-- has claimed but not sent): due at once, the attempt not counted.
-- +goose StatementBegin
CREATE FUNCTION fencelock.outbox_release(p_claims bigint[], p_ids bigint[])
RETURNS integer
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH r AS (
        UPDATE fencelock.outbox o
           SET claim = NULL, due_at = now(), attempts = greatest(o.attempts - 1, 0)
          FROM unnest(p_claims, p_ids) AS u(claim, id)
         WHERE o.id = u.id AND o.claim = u.claim
        RETURNING 1)
    SELECT count(*)::integer FROM r;
$$;
-- +goose StatementEnd

-- outbox_list returns up to p_limit rows, oldest first, without their
-- payload (its size instead): dead rows only when p_dead, else live ones.
-- +goose StatementBegin
CREATE FUNCTION fencelock.outbox_list(p_dead boolean, p_limit integer)
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

-- outbox_counts counts the rows by state: due (may be claimed now),
-- waiting (backing off, or parked behind an older ordered row's due time),
-- claimed (held by a relay within its visibility timeout) and dead.
-- +goose StatementBegin
CREATE FUNCTION fencelock.outbox_counts()
RETURNS TABLE (due bigint, waiting bigint, claimed bigint, dead bigint)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT count(*) FILTER (WHERE dead_at IS NULL AND due_at <= now()),
           count(*) FILTER (WHERE dead_at IS NULL AND due_at > now() AND claim IS NULL),
           count(*) FILTER (WHERE dead_at IS NULL AND due_at > now() AND claim IS NOT NULL),
           count(*) FILTER (WHERE dead_at IS NOT NULL)
      FROM fencelock.outbox;
$$;
-- +goose StatementEnd

-- outbox_requeue makes dead rows due again with their attempts reset:
-- the rows p_ids, or every dead row when p_ids is NULL. Returns the rows
-- requeued.
-- +goose StatementBegin
CREATE FUNCTION fencelock.outbox_requeue(p_ids bigint[])
RETURNS integer
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH r AS (
        UPDATE fencelock.outbox
           SET dead_at = NULL, attempts = 0, claim = NULL, due_at = now()
         WHERE dead_at IS NOT NULL AND (p_ids IS NULL OR id = ANY (p_ids))
        RETURNING 1)
    SELECT count(*)::integer FROM r;
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION fencelock.outbox_add(jsonb, boolean) IS
    'outbox_add(effects jsonb[, notify]): raw SQL: claims the transaction''s claim (fencelock.claim, FL001 when overtaken) and records effects ([{"d","k","p" base64,"h","o"}], d and k non-empty, else 22023) for it (FL002 without one, through the protect trigger); with notify, NOTIFY fencelock_outbox at commit. Returns the rows added.';
COMMENT ON FUNCTION fencelock.outbox_guard() IS
    'Row trigger fencelock_outbox_protect on fencelock.outbox: refuses a row whose resource, token and holder are not the transaction''s claim, or without one (FL002). The claim itself is checked under the fence lock by the transaction''s commit or by fencelock.claim.';
COMMENT ON FUNCTION fencelock.outbox_heads(text, text, integer) IS
    'Internal (called by outbox_claim): ids of due ordered rows that head their resource, resources in (after, upto], loose index scan.';
COMMENT ON FUNCTION fencelock.outbox_claim(bigint, integer, interval, text) IS
    'outbox_claim(claim, limit, visibility[, after]): a relay claims up to limit due rows for visibility (FOR UPDATE SKIP LOCKED; ordered rows only at the head of their resource). Returns them.';
COMMENT ON FUNCTION fencelock.outbox_ack(bigint[], bigint[]) IS
    'outbox_ack(claims, ids): deletes row ids[i] if claims[i] still holds it (delivered). Returns the rows deleted.';
COMMENT ON FUNCTION fencelock.outbox_retry(bigint[], bigint[], text[], bigint[], boolean[]) IS
    'outbox_retry(claims, ids, errors, delays_ms, dead): failed attempts: row ids[i], if claims[i] still holds it, is due again after delays_ms[i], or dead. Returns the rows changed.';
COMMENT ON FUNCTION fencelock.outbox_release(bigint[], bigint[]) IS
    'outbox_release(claims, ids): hands claimed rows back unsent, due at once, the attempt not counted.';
COMMENT ON FUNCTION fencelock.outbox_list(boolean, integer) IS
    'outbox_list(dead, limit): rows oldest first, dead ones or live ones, without payload (fencectl outbox list).';
COMMENT ON FUNCTION fencelock.outbox_counts() IS
    'outbox_counts(): rows due, waiting, claimed and dead.';
COMMENT ON FUNCTION fencelock.outbox_requeue(bigint[]) IS
    'outbox_requeue(ids): makes dead rows (all of them when ids is NULL) due again, attempts reset (fencectl outbox requeue). Returns the rows requeued.';

REVOKE ALL ON FUNCTION fencelock.outbox_guard(), fencelock.outbox_add(jsonb, boolean), fencelock.outbox_heads(text, text, integer),
    fencelock.outbox_claim(bigint, integer, interval, text), fencelock.outbox_ack(bigint[], bigint[]),
    fencelock.outbox_retry(bigint[], bigint[], text[], bigint[], boolean[]), fencelock.outbox_release(bigint[], bigint[]),
    fencelock.outbox_list(boolean, integer), fencelock.outbox_counts(), fencelock.outbox_requeue(bigint[]) FROM PUBLIC;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.schema_version() RETURNS bigint LANGUAGE sql IMMUTABLE AS $$ SELECT 3::bigint $$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION fencelock.outbox_requeue(bigint[]);
DROP FUNCTION fencelock.outbox_counts();
DROP FUNCTION fencelock.outbox_list(boolean, integer);
DROP FUNCTION fencelock.outbox_release(bigint[], bigint[]);
DROP FUNCTION fencelock.outbox_retry(bigint[], bigint[], text[], bigint[], boolean[]);
DROP FUNCTION fencelock.outbox_ack(bigint[], bigint[]);
DROP FUNCTION fencelock.outbox_claim(bigint, integer, interval, text);
DROP FUNCTION fencelock.outbox_heads(text, text, integer);
DROP FUNCTION fencelock.outbox_add(jsonb, boolean);
DROP TABLE fencelock.outbox;
DROP FUNCTION fencelock.outbox_guard();
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.schema_version() RETURNS bigint LANGUAGE sql IMMUTABLE AS $$ SELECT 2::bigint $$;
-- +goose StatementEnd
