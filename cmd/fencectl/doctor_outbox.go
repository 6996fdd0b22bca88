package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Doctor's outbox checks read fencelock.outbox directly. Each query walks
// an index under a LIMIT, so that a backlog of millions of rows costs a
// check what a small one does; where a limit cuts the reading short, the
// evidence says so.
const (
	// outboxDueRead is how many due unordered rows are read, oldest due
	// first (outbox_due_idx).
	outboxDueRead = 10000
	// outboxHeadsRead is how many resources with ordered rows have their
	// head read (a loose scan of outbox_ordered_idx, one probe each).
	outboxHeadsRead = 1000
	// outboxDeadRead is how many dead rows are counted, oldest first
	// (outbox_dead_idx, migration 5).
	outboxDeadRead = 10000
)

// Due unordered rows, oldest due first: how many were read, how many are
// due for longer than $1 ms, the age of the oldest; then those still
// claimed (a claim moves due_at past the visibility timeout, so a claimed
// row that is due has outlived its claim) and the oldest such claim's age.
const sqlOutboxDue = `SELECT count(*),
       count(*) FILTER (WHERE due_at <= now() - $1 * interval '1 millisecond'),
       coalesce(extract(epoch FROM now() - min(due_at)), 0)::float8,
       count(*) FILTER (WHERE claim IS NOT NULL),
       coalesce(extract(epoch FROM now() - min(due_at) FILTER (WHERE claim IS NOT NULL)), 0)::float8
  FROM (SELECT due_at, claim FROM fencelock.outbox
         WHERE dead_at IS NULL AND NOT ordered AND due_at <= now()
         ORDER BY due_at
         LIMIT $2) d`

// The head (oldest live ordered row) of up to $2 resources, found by a
// loose scan: how many were read, how many are due, due for longer than
// $1 ms, the oldest due one's age, then the expired claims as in
// sqlOutboxDue. Rows behind a head wait for it, due or not, so only heads
// say whether an ordered resource is stuck.
const sqlOutboxHeads = `WITH RECURSIVE r(resource) AS (
    (SELECT o.resource FROM fencelock.outbox o
      WHERE o.dead_at IS NULL AND o.ordered
      ORDER BY o.resource LIMIT 1)
  UNION ALL
    SELECT (SELECT o.resource FROM fencelock.outbox o
             WHERE o.dead_at IS NULL AND o.ordered AND o.resource > r.resource
             ORDER BY o.resource LIMIT 1)
      FROM r WHERE r.resource IS NOT NULL
), heads AS (
    SELECT h.due_at, h.claim
      FROM (SELECT resource FROM r WHERE resource IS NOT NULL LIMIT $2) rs
      CROSS JOIN LATERAL (SELECT o.due_at, o.claim FROM fencelock.outbox o
                           WHERE o.dead_at IS NULL AND o.ordered AND o.resource = rs.resource
                           ORDER BY o.token, o.id LIMIT 1) h
)
SELECT count(*),
       count(*) FILTER (WHERE due_at <= now()),
       count(*) FILTER (WHERE due_at <= now() - $1 * interval '1 millisecond'),
       coalesce(extract(epoch FROM now() - min(due_at) FILTER (WHERE due_at <= now())), 0)::float8,
       count(*) FILTER (WHERE claim IS NOT NULL AND due_at <= now()),
       coalesce(extract(epoch FROM now() - min(due_at) FILTER (WHERE claim IS NOT NULL AND due_at <= now())), 0)::float8
  FROM heads`

// Up to $1 dead rows, oldest first: how many, and the age of the oldest
// death among them.
const sqlOutboxDead = `SELECT count(*), coalesce(extract(epoch FROM now() - min(dead_at)), 0)::float8
  FROM (SELECT dead_at FROM fencelock.outbox WHERE dead_at IS NOT NULL ORDER BY id LIMIT $1) o`

// Whether the role may read the outbox (USAGE on the schema, SELECT on the
// table), from the catalogs every role may read; no row when there is no
// outbox table.
const sqlOutboxAccess = `SELECT has_schema_privilege(n.oid, 'USAGE'), has_table_privilege(c.oid, 'SELECT')
  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'fencelock' AND c.relname = 'outbox' AND c.relkind = 'r'`

// rowQuerier is what the outbox checks read through: a pool, or one
// connection in tests.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// outboxScan is what the bounded queries found.
type outboxScan struct {
	stuckAfter time.Duration

	// Unordered due rows read (all due), due for longer than stuckAfter,
	// claimed; the ages in seconds of the oldest due and oldest claimed.
	dueRead, stuck, expired  int64
	oldestDue, oldestExpired float64

	// Heads of ordered resources read, due, stuck, claimed; ages.
	headsRead, headsDue, headsStuck, headsExpired int64
	oldestDueHead, oldestExpiredHead              float64

	// Dead rows counted (all of them, unless outboxDeadRead), the age in
	// seconds of the oldest death among them.
	dead       int64
	oldestDead float64
}

// scanOutbox runs the three bounded queries.
func scanOutbox(ctx context.Context, q rowQuerier, stuckAfter time.Duration) (outboxScan, error) {
	s := outboxScan{stuckAfter: stuckAfter}
	ms := stuckAfter.Milliseconds()
	if err := q.QueryRow(ctx, sqlOutboxDue, ms, outboxDueRead).Scan(&s.dueRead, &s.stuck, &s.oldestDue, &s.expired, &s.oldestExpired); err != nil {
		return s, err
	}
	if err := q.QueryRow(ctx, sqlOutboxHeads, ms, outboxHeadsRead).Scan(&s.headsRead, &s.headsDue, &s.headsStuck, &s.oldestDueHead, &s.headsExpired, &s.oldestExpiredHead); err != nil {
		return s, err
	}
	if err := q.QueryRow(ctx, sqlOutboxDead, outboxDeadRead).Scan(&s.dead, &s.oldestDead); err != nil {
		return s, err
	}
	return s, nil
}

// checkOutbox reports, when the database has an outbox: effects due for
// longer than --outbox-stuck (no relay claims them), dead rows, and claims
// that outlived their visibility timeout (a relay stopped mid-send).
func (d *doctor) checkOutbox(ctx context.Context, db *dbConn) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout(db))
	defer cancel()
	var usage, sel bool
	switch err := db.pool.QueryRow(ctx, sqlOutboxAccess).Scan(&usage, &sel); {
	case errors.Is(err, pgx.ErrNoRows):
		return // no outbox: the migrations check says what is missing
	case err != nil:
		d.outboxUnread(db, err)
		return
	case usage && !sel:
		// An application role: it writes effects, an operator reads them.
		d.skip("outbox", fmt.Sprintf("not checked as role %s, which may not read fencelock.outbox (an operator's grant; the application needs none)", pgIdent(db.cfg.ConnConfig.User)), d.outboxGrant(db, usage))
		return
	case !usage:
		d.warn("outbox", fmt.Sprintf("not checked: user %s may not read fencelock.outbox", pgIdent(db.cfg.ConnConfig.User)), d.outboxGrant(db, usage))
		return
	}
	s, err := scanOutbox(ctx, db.pool, d.outboxStuck)
	if err != nil {
		d.outboxUnread(db, err)
		return
	}
	d.outboxBacklog(db, s)
	d.outboxDead(db, s)
	d.outboxClaims(s)
}

// outboxUnread reports a query of the outbox checks that failed.
func (d *doctor) outboxUnread(db *dbConn, err error) {
	var pgErr *pgconn.PgError
	var se *serverError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		d.warn("outbox", "not checked: fencelock.outbox cannot be read: "+oneLine(err), d.outboxGrant(db, true))
	case errors.As(db.explain(err), &se):
		d.warn("outbox", "not checked: fencelock.outbox cannot be read: "+se.Cause(), se.Fix())
	default:
		d.warn("outbox", "not checked: fencelock.outbox cannot be read: "+oneLine(err), "check the server's logs")
	}
}

// outboxGrant is the fix for a role that may not read the outbox: the
// grants to paste as the schema's owner.
func (d *doctor) outboxGrant(db *dbConn, usage bool) string {
	user := pgIdent(db.cfg.ConnConfig.User)
	var grants []string
	if !usage {
		grants = append(grants, "GRANT USAGE ON SCHEMA fencelock TO "+user)
	}
	grants = append(grants, "GRANT SELECT ON fencelock.outbox TO "+user)
	as := "run fencectl doctor as the fencelock schema's owner"
	owner := db.schemaOwner()
	if owner != "" {
		as += " (role " + owner + ")"
	}
	return as + ", or grant what it reads: " + runAs("that owner", owner, db.cfg.ConnConfig.Database, grants)
}

func (d *doctor) outboxBacklog(db *dbConn, s outboxScan) {
	// A limit reached means there may be more than were counted. Stuck
	// rows are the oldest due ones, so they were all counted unless every
	// row read was one.
	count := func(n int64, cut bool) string {
		if cut || s.headsRead == outboxHeadsRead {
			return fmt.Sprintf("at least %d", n)
		}
		return fmt.Sprint(n)
	}
	due, stuck := s.dueRead+s.headsDue, s.stuck+s.headsStuck
	oldest := max(s.oldestDue, s.oldestDueHead)
	switch {
	case due == 0:
		d.ok("outbox.backlog", fmt.Sprintf("no effect due for more than %s", s.stuckAfter))
	case stuck == 0:
		d.ok("outbox.backlog", fmt.Sprintf("no effect due for more than %s (%s due, the oldest for %s)", s.stuckAfter, count(due, s.dueRead == outboxDueRead), age(oldest)))
	default:
		ordered := ""
		if s.headsStuck > 0 {
			ordered = fmt.Sprintf("; %d of them the next of an ordered resource", s.headsStuck)
		}
		d.warn("outbox.backlog", fmt.Sprintf("%s effects due for more than %s (the oldest for %s%s): no relay claims them", count(stuck, s.stuck == outboxDueRead), s.stuckAfter, age(oldest), ordered),
			"run a relay on this database (outbox.NewRelay(pool, sender), then Run), or find in the running relays' logs why they do not claim; fencectl outbox list --db "+db.src.arg()+" shows the rows"+db.src.maskNote())
	}
}

func (d *doctor) outboxDead(db *dbConn, s outboxScan) {
	if s.dead == 0 {
		d.ok("outbox.dead", "no dead row")
		return
	}
	n, oldest := plural(s.dead, "dead row", "dead rows"), "the oldest dead for "
	if s.dead == outboxDeadRead {
		n, oldest = "at least "+n, fmt.Sprintf("of the %d recorded first, the oldest dead for ", outboxDeadRead)
	}
	d.warn("outbox.dead", fmt.Sprintf("%s (refused for good, out of attempts, or recorded by a transaction whose fence check did not run, %s%s): nothing sends them until they are requeued", n, oldest, age(s.oldestDead)),
		"fencectl outbox list --dead --db "+db.src.arg()+" shows why each failed; once that is fixed: fencectl outbox requeue --all --db "+db.src.arg()+" (or the row IDs instead of --all; never requeue a row whose reason says its fence check did not run: no check cleared it)"+db.src.maskNote())
}

func (d *doctor) outboxClaims(s outboxScan) {
	expired := s.expired + s.headsExpired
	among := ""
	if s.dueRead == outboxDueRead {
		among = fmt.Sprintf(" among the %d oldest due rows", outboxDueRead)
	}
	if expired == 0 {
		d.ok("outbox.claims", "no claim past its visibility timeout"+among)
		return
	}
	d.warn("outbox.claims", fmt.Sprintf("%d rows%s whose relay's claim expired without an outcome (the oldest %s ago): a relay stopped mid-send (killed, paused, cut off from the database), and the next claim sends each again",
		expired, among, age(max(s.oldestExpired, s.oldestExpiredHead))),
		"check the relays' processes and logs; a running relay claims these rows again at its next poll (so a receiver that does not deduplicate by key gets them twice); if none runs, start one (see outbox.backlog)")
}

// age renders a number of seconds for people: seconds under a minute,
// minutes under a day, then days.
func age(seconds float64) string {
	d := time.Duration(seconds * float64(time.Second))
	switch {
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < 24*time.Hour:
		return d.Round(time.Minute).String()
	}
	return fmt.Sprintf("%.0f days", d.Hours()/24)
}
