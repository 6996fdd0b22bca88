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
	return fmt.Errorf("Postgres at %s: %w", c.display, err)
}

// explain turns an error of a statement on the fencelock tables into the
// fix: a missing schema (installed with fencectl migrate up on this same
// address), a missing grant, a lost connection.
func (c *dbConn) explain(err error) error {
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
		// The application role has EXECUTE on the functions only.
		return &serverError{server: "Postgres", src: c.src, user: c.cfg.ConnConfig.User, kind: kindPermission,
			err: fmt.Errorf("%w (fencectl reads, and prunes, the fencelock tables directly)", pgErr)}
	}
	if e := pgFailure(c.src, c.cfg.ConnConfig.User, c.timeout, err); e != nil {
		return e
	}
	return err
}
