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
	display string // the address as given, password redacted
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

func openDB(ctx context.Context, addr string, timeout time.Duration) (*dbConn, error) {
	if addr == "" {
		return nil, usageErrorf("no Postgres: give --db host:port|URL or set DATABASE_URL")
	}
	cfg, err := parseDBAddr(addr)
	if err != nil {
		return nil, err
	}
	c := &dbConn{cfg: cfg, display: redactAddr(addr), userMode: cfg.ConnConfig.DefaultQueryExecMode}
	if !strings.Contains(addr, "default_query_exec_mode") {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	cfg.MaxConns = 4
	if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > timeout {
		cfg.ConnConfig.ConnectTimeout = timeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, &unreachableError{what: "Postgres", addr: c.display, err: err}
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, &unreachableError{what: "Postgres", addr: c.display, err: err}
	}
	c.pool = pool
	return c, nil
}

func (c *dbConn) Close() { c.pool.Close() }

// sqlDB is a database/sql handle on the pool, for goose; closing it leaves
// the pool open.
func (c *dbConn) sqlDB() *sql.DB { return stdlib.OpenDBFromPool(c.pool) }

// schemaError turns "relation fencelock.x does not exist" into the fix.
func schemaError(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000"):
		return errSchemaMissing
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		// The application role has EXECUTE on the functions only.
		return fmt.Errorf("%w: fencectl reads (and prunes) the fencelock tables directly: run it as the schema's owner, or GRANT SELECT (DELETE to prune) ON fencelock's tables to this role", err)
	}
	return err
}
