package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/fencelock/fencelock/migrations"
)

// dbConn is an open Postgres pool.
type dbConn struct {
	pool    *pgxpool.Pool
	cfg     *pgxpool.Config
	src     source // the address as given and where it came from
	display string // the address as given, password redacted
	timeout time.Duration
	// userMode is the exec mode the address itself asks for (pgx's default,
	// cache_statement, when it says nothing): what an application using the
	// same address gets. fencectl's own connections use exec when the
	// address does not say, so that it works through a transaction pooler.
	userMode pgx.QueryExecMode
}

// parseDBAddr accepts a postgres:// URL, a keyword/value DSN, or a bare
// host:port (user and database then come from libpq's defaults: $PGUSER,
// $PGDATABASE, the OS user).
func parseDBAddr(s string) (*pgxpool.Config, error) {
	u := s
	if !strings.Contains(u, "://") && !strings.Contains(u, "=") {
		u = "postgres://" + u
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		return nil, usageErrorf("Postgres address %s: %v; give host:port, postgres://user[:password]@host:port/db or key=value pairs",
			redactAddr(s), oneLine(err))
	}
	return cfg, nil
}

func openDB(ctx context.Context, src source, timeout time.Duration) (*dbConn, error) {
	if src.addr == "" {
		return nil, usageErrorf("no Postgres: give --db host:port|URL or set DATABASE_URL")
	}
	cfg, err := parseDBAddr(src.addr)
	if err != nil {
		return nil, err
	}
	c := &dbConn{cfg: cfg, src: src, display: src.display(), timeout: timeout, userMode: cfg.ConnConfig.DefaultQueryExecMode}
	if !strings.Contains(src.addr, "default_query_exec_mode") {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	cfg.MaxConns = 4
	if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > timeout {
		cfg.ConnConfig.ConnectTimeout = timeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, c.failure(err)
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, c.failure(err)
	}
	c.pool = pool
	return c, nil
}

func (c *dbConn) Close() { c.pool.Close() }

// sqlDB is a database/sql handle on the pool, for goose; closing it leaves
// the pool open.
func (c *dbConn) sqlDB() *sql.DB { return stdlib.OpenDBFromPool(c.pool) }

// failure is err, from connecting, with its cause named: the network, the
// password, pg_hba.conf, the database name, the timeout.
func (c *dbConn) failure(err error) error {
	if e := pgFailure(c.src, c.cfg.ConnConfig.User, c.timeout, err); e != nil {
		return e
	}
	//lint:ignore ST1005 a name: fencectl prints it after its own "fencectl: " prefix
	return fmt.Errorf("Postgres at %s: %w", c.display, err)
}

// pgOp is what fencectl was doing when Postgres refused it: the grant
// that fixes a refusal depends on it.
type pgOp int

const (
	opRead    pgOp = iota // tokens, runs list, doctor, migrate status: SELECT
	opPrune               // keys prune, runs prune: SELECT and DELETE
	opMigrate             // migrate up and down: the schema's owner
)

// explain turns an error of a statement that reads the fencelock tables
// into the fix: a missing schema (installed with fencectl migrate up on
// this same address), a missing grant, a lost connection.
func (c *dbConn) explain(err error) error { return c.explainAs(opRead, err) }

// explainAs is explain for a statement made for op.
func (c *dbConn) explainAs(op pgOp, err error) error {
	var pgErr *pgconn.PgError
	var se *serverError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &se):
		return err
	case errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000"):
		return &schemaMissingError{src: c.src, dbname: c.cfg.ConnConfig.Database}
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		// The application role has EXECUTE on the functions only, and
		// fencectl reads (and prunes) the tables directly.
		return &serverError{server: "Postgres", src: c.src, user: c.cfg.ConnConfig.User, kind: kindPermission,
			fix: c.grantFix(op, err), err: pgErr}
	}
	if e := pgFailure(c.src, c.cfg.ConnConfig.User, c.timeout, err); e != nil {
		return e
	}
	return err
}

// grantFix is the fix for a refusal of what op needed: the GRANTs that
// allow it, one statement a line, with who runs them and the database to
// connect to (the schema and public are per database), or, for what only
// an owner can mend, the role to run migrate as.
func (c *dbConn) grantFix(op pgOp, err error) string {
	user := pgIdent(c.cfg.ConnConfig.User)
	dbname := c.cfg.ConnConfig.Database
	owner := c.schemaOwner()
	if op == opMigrate {
		return c.migrateFix(err, owner)
	}
	as := "run fencectl as the fencelock schema's owner"
	if owner != "" {
		as += " (role " + owner + ")"
	}
	as += ", or grant what it needs: "
	// Everything the command needs at once, so that one paste is enough
	// (a grant on the tables alone would next meet the schema's USAGE):
	// the application's grants, then what fencectl reads or deletes.
	grants := pgcore.AppGrants(c.cfg.ConnConfig.User, owner)[:2]
	if op == opPrune {
		grants = append(grants, "GRANT SELECT, DELETE ON fencelock.applied, fencelock.runs TO "+user)
	} else {
		grants = append(grants, "GRANT SELECT ON ALL TABLES IN SCHEMA fencelock TO "+user, "GRANT SELECT ON "+migrations.VersionTable+" TO "+user)
	}
	return as + runAs("that owner", owner, dbname, grants)
}

// migrateFix is the fix for a refusal of migrate up or down, as the
// library words it (pgcore.ExplainMigration, which migrations' errors
// carry), in fencectl's terms: what only an owner can mend says so and
// names that owner (the schema's, or the version table's that a migrate
// down left); a role that may not create the schema is given the grants
// an admin runs.
func (c *dbConn) migrateFix(err error, owner string) string {
	where := c.src.where()
	var me *pgcore.MigrationErr
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if !errors.As(pgcore.ExplainMigration(ctx, poolRows{c.pool}, "migrate", migrations.VersionTable, err), &me) {
		if owner == "" {
			return "run migrate as the role that is to own the fencelock schema (its user and password in the address (" + where + "))"
		}
		return fmt.Sprintf("run migrate as the owner of schema fencelock, role %s (its user and password in the address (%s))", owner, where)
	}
	switch me.Case {
	case pgcore.NeedsOwner:
		return fmt.Sprintf("only the owner of schema fencelock, role %s, may change it: run migrate as that role (its user and password in the address (%s))",
			pgIdent(me.Only), where)
	case pgcore.NeedsTableOwner:
		// The owner migrated down: its version table stays, empty of
		// applied migrations, and only it may write or drop it.
		return fmt.Sprintf("only role %s, which owns the version table %s (left by its migrate down), can mend this: run migrate as that role (its user and password in the address (%s)), or let this role migrate once that role has dropped the table, which records no applied migration: %s",
			pgIdent(me.Only), me.Table, where, runAs("that role", me.Fix.Role, me.Fix.Database, me.Fix.Stmts))
	case pgcore.NeedsCreate:
		return "run migrate as the role that is to own the fencelock schema, or let this one create it: " +
			runAs(me.Fix.Who, me.Fix.Role, me.Fix.Database, me.Fix.Stmts)
	}
	return runAs(me.Fix.Who, me.Fix.Role, me.Fix.Database, me.Fix.Stmts)
}

// poolRows reads one row through a pool (pgcore.RowQuerier).
type poolRows struct{ pool *pgxpool.Pool }

func (p poolRows) QueryRow(ctx context.Context, sql string, args []any, dest ...any) (bool, error) {
	err := p.pool.QueryRow(ctx, sql, args...).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// runAs is "as who, connected to database db (psql ...), run:" and the
// statements, one a line, each ending with ';', ready to paste into psql.
func runAs(who, role, db string, stmts []string) string {
	u := ""
	if role != "" {
		u = " -U " + pgcore.ShellQuote(role)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "as %s, connected to database %q (psql%s -d %s), run:", who, db, u, pgcore.ShellQuote(db))
	for _, s := range stmts {
		b.WriteString("\n  " + s + ";")
	}
	return b.String()
}

// schemaOwner is the role that owns schema fencelock, "" when there is
// none or it cannot be read (pg_namespace is readable by every role).
func (c *dbConn) schemaOwner() string {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	var owner string
	if err := c.pool.QueryRow(ctx, `SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'fencelock'`).Scan(&owner); err != nil {
		return ""
	}
	return owner
}
