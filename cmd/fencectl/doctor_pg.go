package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"

	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/fencelock/fencelock/migrations"
)

// checkPostgres connects and runs the Postgres checks; nil (and a failing
// finding) when Postgres is unreachable, an error only for a bad command
// line.
func (d *doctor) checkPostgres(ctx context.Context) (*dbConn, error) {
	db, err := openDB(ctx, d.a.dbSrc(), d.a.timeout)
	if isUsage(err) {
		return nil, err
	}
	if err != nil {
		d.failErr("postgres", err)
		return nil, nil
	}
	var version, user, dbname string
	if err := db.pool.QueryRow(ctx, `SELECT current_setting('server_version'), current_user, current_database()`).Scan(&version, &user, &dbname); err != nil {
		d.fail("postgres", "connected to "+db.display+" but a query failed: "+oneLine(err), "check the server's logs")
		return db, nil
	}
	d.ok("postgres", fmt.Sprintf("PostgreSQL %s, user %s, database %s, at %s", version, user, dbname, db.display))
	d.checkMigrations(ctx, db)
	d.checkPooler(ctx, db)
	d.checkOutbox(ctx, db)
	return db, nil
}

func (d *doctor) checkMigrations(ctx context.Context, db *dbConn) {
	sdb := db.sqlDB()
	defer sdb.Close()
	st, err := migrations.Status(ctx, sdb, quiet())
	switch {
	case errors.Is(err, migrations.ErrUnrecorded), errors.Is(err, migrations.ErrRecordedMissing):
		// The error names the difference and the fix.
		d.fail("migrations", oneLine(err), "the step the evidence names, then 'fencectl migrate status'")
		return
	case err != nil && pgcore.Code(err) == pgcore.InsufficientPrivilege:
		d.migrationsFromCatalog(ctx, db, err)
		return
	case err != nil:
		var se *serverError
		if errors.As(db.explain(err), &se) {
			d.fail("migrations", "cannot read the version table "+migrations.VersionTable+": "+se.Cause(), se.Fix())
			return
		}
		d.fail("migrations", "cannot read the version table "+migrations.VersionTable+": "+oneLine(err),
			"check the server's logs; 'fencectl migrate status' shows the same")
		return
	}
	var applied, pending []string
	for _, s := range st {
		name := s.Source.Path
		if i := strings.LastIndexByte(name, '/'); i >= 0 {
			name = name[i+1:]
		}
		if s.State == goose.StateApplied {
			applied = append(applied, name)
		} else {
			pending = append(pending, name)
		}
	}
	var schema bool
	_ = db.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'fencelock')`).Scan(&schema)
	total := len(applied) + len(pending)
	// Status reports a schema installed without our version table (the goose
	// CLI without -table) as applied when it matches; Up records it.
	var recorded int
	if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM `+migrations.VersionTable+` WHERE version_id > 0 AND is_applied`).Scan(&recorded); err != nil {
		recorded = 0
	}
	switch {
	case len(pending) == 0 && recorded < len(applied):
		d.warn("migrations", fmt.Sprintf("%d of %d applied, but %s records %d of them (installed with the goose CLI without -table?)",
			len(applied), total, migrations.VersionTable, recorded),
			"fencectl migrate up --db "+db.src.arg()+" (records them; changes nothing else)"+db.src.maskNote())
	case len(pending) == 0:
		d.ok("migrations", fmt.Sprintf("%d of %d applied (latest %s), recorded in %s", len(applied), total, applied[len(applied)-1], migrations.VersionTable))
	case len(applied) == 0 && schema:
		// Status adopts a schema that matches the migrations, so this one
		// does not match them: a goose CLI run would fail on it too.
		d.fail("migrations", fmt.Sprintf("schema fencelock exists, but it does not match the migrations and %s records none of its %d migrations", migrations.VersionTable, total),
			"'fencectl migrate up' says what differs; if nothing in schema fencelock is yours, DROP SCHEMA fencelock CASCADE, then fencectl migrate up --db "+db.src.arg()+db.src.maskNote())
	case len(applied) == 0:
		d.fail("migrations", fmt.Sprintf("the fencelock schema is not installed (0 of %d migrations applied)", total),
			"fencectl migrate up --db "+db.src.arg()+db.src.maskNote())
	default:
		d.fail("migrations", fmt.Sprintf("%d of %d applied; pending: %s", len(applied), total, strings.Join(pending, ", ")),
			"fencectl migrate up --db "+db.src.arg()+db.src.maskNote())
	}
}

// migrationsFromCatalog is the migrations check of a role that may not
// read the version table (an application role: reading it is an
// operator's grant): the schema's version is read from the catalog, as
// the stores read it, which needs no privilege.
func (d *doctor) migrationsFromCatalog(ctx context.Context, db *dbConn, readErr error) {
	var s pgcore.Schema
	var usage bool
	err := db.pool.QueryRow(ctx, pgcore.SchemaSQL).Scan(s.Dest()...)
	if err == nil && s.Exists {
		err = db.pool.QueryRow(ctx, `SELECT has_schema_privilege('fencelock', 'USAGE')`).Scan(&usage)
	}
	if err != nil || !usage {
		// Not an application role either: it lacks the schema's USAGE.
		var se *serverError
		if errors.As(db.explain(readErr), &se) {
			d.fail("migrations", "cannot read the version table "+migrations.VersionTable+": "+se.Cause(), se.Fix())
			return
		}
		d.failErr("migrations", db.explain(readErr))
		return
	}
	if err := s.Err(nil); err != nil {
		d.fail("migrations", strings.TrimPrefix(err.Error(), "guard: "), "fencectl migrate up --db "+db.src.arg()+db.src.maskNote()+", as the schema's owner")
		return
	}
	d.ok("migrations", fmt.Sprintf("schema fencelock at %s, as this fencelock needs (read from the catalog)", s.Have()))
	var se *serverError
	how := "run fencectl doctor as the schema's owner"
	if errors.As(db.explain(readErr), &se) {
		how = se.Fix()
	}
	d.skip("migrations.recorded", fmt.Sprintf("not checked as role %s, which may not read the version table %s (an operator's grant; the application needs none)",
		pgIdent(db.cfg.ConnConfig.User), migrations.VersionTable), how)
}

// checkPooler looks for a transaction pooler (PgBouncer in transaction
// mode, and the like) between fencectl and Postgres, as far as a client can
// tell: two sessions that run on the same server process are proof of one;
// a server port that differs from the one dialled shows a proxy of some
// kind. A session pooler and a direct connection look alike, and say so.
func (d *doctor) checkPooler(ctx context.Context, db *dbConn) {
	var hints []string
	var serverPort *int32
	if err := db.pool.QueryRow(ctx, `SELECT inet_server_port()`).Scan(&serverPort); err == nil && serverPort != nil {
		dialled := db.cfg.ConnConfig.Port
		if !strings.HasPrefix(db.cfg.ConnConfig.Host, "/") && int32(dialled) != *serverPort {
			hints = append(hints, fmt.Sprintf("port %d was dialled, the server listens on %d: a proxy or pooler forwards", dialled, *serverPort))
		}
	}
	shared, err := sharedBackend(ctx, db)
	if err != nil {
		d.warn("postgres.pooler", "not detectable: "+oneLine(err), "")
		return
	}
	mode := execModeName(db.userMode)
	direct, err := cancelKeyIsBackend(ctx, db)
	if err != nil {
		d.warn("postgres.pooler", "not detectable: "+oneLine(err), "")
		return
	}
	statements := "; pgfence sends its own statements unnamed here (the connection's cancel key is not the backend's: a pooler or proxy hands out its own), parsed in every transaction"
	if direct {
		statements = "; pgfence prepares its own statements once per connection here (the connection's cancel key is the backend's)"
	}
	if shared != "" {
		hints = append([]string{shared}, hints...)
		ev := "a transaction pooler sits in between (" + strings.Join(hints, "; ") + ")"
		switch db.userMode {
		case pgx.QueryExecModeCacheStatement:
			d.fail("postgres.pooler", ev+"; the address leaves pgx's exec mode at cache_statement, whose named prepared statements a transaction pooler does not keep per client"+statements,
				"add default_query_exec_mode=exec (or simple_protocol) to the address your application uses, or enable prepared statements in the pooler (PgBouncer 1.21+: max_prepared_statements); run 'fencectl migrate' against Postgres directly (goose's session lock needs a session)")
		default:
			d.ok("postgres.pooler", ev+"; the address's exec mode "+mode+" works through it"+statements+"; run 'fencectl migrate' against Postgres directly (goose's session lock needs a session)")
		}
		return
	}
	ev := "no transaction pooler detected (two sessions ran on distinct server processes; a session pooler and a direct connection look alike); exec mode " + mode + statements
	if len(hints) > 0 {
		ev = strings.Join(hints, "; ") + "; " + ev
	}
	d.ok("postgres.pooler", ev)
}

// cancelKeyIsBackend reports whether a connection's cancel key (its
// BackendKeyData) names the server process its statements run on: what
// pgfence asks, once per connection, to decide whether to prepare its
// statements there.
func cancelKeyIsBackend(ctx context.Context, db *dbConn) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout(db))
	defer cancel()
	c, err := db.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer c.Release()
	var pid uint32
	if err := c.QueryRow(ctx, `SELECT pg_backend_pid()::int8`).Scan(&pid); err != nil {
		return false, err
	}
	return pid == c.Conn().PgConn().PID(), nil
}

// sharedBackend opens two client sessions at once and runs statements on
// them in turn: in session mode each keeps its own server process; a
// transaction pooler hands both the same idle one. It returns a
// description of the proof, or "" when none was seen.
func sharedBackend(ctx context.Context, db *dbConn) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout(db))
	defer cancel()
	a, err := db.pool.Acquire(ctx)
	if err != nil {
		return "", err
	}
	defer a.Release()
	b, err := db.pool.Acquire(ctx)
	if err != nil {
		return "", err
	}
	defer b.Release()
	// Statements alternate A, B, A, B, ... so that an idle server process
	// freed by one is the one the pooler hands the other.
	var pids [2][]int32
	for i := 0; i < 3; i++ {
		for j, c := range []*pgxpool.Conn{a, b} {
			var pid int32
			if err := c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return "", err
			}
			pids[j] = append(pids[j], pid)
		}
	}
	for _, pa := range pids[0] {
		for _, pb := range pids[1] {
			if pa == pb {
				return fmt.Sprintf("two client sessions ran statements on the same server process %d", pa), nil
			}
		}
	}
	for _, ps := range pids {
		for _, p := range ps[1:] {
			if p != ps[0] {
				return fmt.Sprintf("one client session ran on server processes %d and %d", ps[0], p), nil
			}
		}
	}
	return "", nil
}

func probeTimeout(db *dbConn) time.Duration {
	if db.cfg.ConnConfig.ConnectTimeout > 0 {
		return 3 * db.cfg.ConnConfig.ConnectTimeout
	}
	return 30 * time.Second
}

func execModeName(m pgx.QueryExecMode) string {
	switch m {
	case pgx.QueryExecModeCacheStatement:
		return "cache_statement"
	case pgx.QueryExecModeCacheDescribe:
		return "cache_describe"
	case pgx.QueryExecModeDescribeExec:
		return "describe_exec"
	case pgx.QueryExecModeExec:
		return "exec"
	case pgx.QueryExecModeSimpleProtocol:
		return "simple_protocol"
	}
	return strconv.Itoa(int(m))
}

// checkTokens compares, for every fenced resource, the database's
// high-water mark with what the next token would be.
func (d *doctor) checkTokens(ctx context.Context, rc *redisConn, db *dbConn) {
	states, err := readFences(ctx, db, nil)
	if err != nil {
		var pgErr *pgconn.PgError
		var se *serverError
		switch {
		case errors.Is(err, errSchemaMissing):
			d.warn("tokens", "not checked: the fencelock schema is not installed", "see the migrations check")
		case errors.As(err, &se):
			d.warn("tokens", "not checked: fencelock.fence cannot be read: "+se.Cause(), se.Fix())
		case errors.As(err, &pgErr):
			d.warn("tokens", "not checked: fencelock.fence cannot be read: "+oneLine(err), "check the server's logs")
		default:
			d.fail("tokens", "cannot read fencelock.fence: "+oneLine(err), "check the database")
		}
		return
	}
	locks, err := rc.locks()
	if err != nil {
		d.fail("tokens", "cannot use Redis for locks: "+oneLine(err), "see the redis checks")
		return
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = locks.Close(cctx)
	}()
	compareTokens(ctx, rc, locks, d.a.prefix, states)
	checked, skipped, bad := 0, 0, 0
	for _, s := range states {
		switch s.Status {
		case "ok":
			checked++
		case "skipped":
			skipped++
		case "error":
			bad++
			d.fail("tokens", fmt.Sprintf("%s: cannot read its counter or clock: %s", s.Resource, s.Detail), orDefault(s.Fix, "see the redis checks"))
		case "behind":
			bad++
			node := ""
			if s.Node != "" {
				node = " on " + s.Node
			}
			d.fail("tokens", fmt.Sprintf("%s: the database's mark %d is ahead of the Redis counter %d and clock %d%s (by %s): every new holder gets a lower token and is rejected (guard.ErrStaleToken)",
				s.Resource, s.Mark, *s.Counter, s.Clock, node, aheadBy(s.Mark-s.Clock)),
				"fencectl tokens repair "+shellQuote(s.Resource)+" "+d.a.redisArgs()+" --db "+db.src.arg()+" (or --all instead of the name)"+maskNotes(d.a.redisSrc(), db.src))
		}
	}
	if bad > 0 {
		return
	}
	ev := plural(checked, "fenced resource", "fenced resources") + ": every next token is above the database's mark"
	if skipped > 0 {
		ev += fmt.Sprintf(" (%d skipped: not fence lock names)", skipped)
	}
	d.ok("tokens", ev)
}

// aheadBy renders a difference in µs for people.
func aheadBy(us int64) string {
	if us <= 0 {
		return "0s"
	}
	if days := float64(us) / 86400e6; days >= 1 {
		return fmt.Sprintf("%.0f days", days)
	}
	return (time.Duration(us) * time.Microsecond).Round(time.Millisecond).String()
}
