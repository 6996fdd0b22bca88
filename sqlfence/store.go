package sqlfence

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/fencelock/fencelock/pgstore"
)

var (
	_ guard.Store[*sql.Tx]      = (*Store)(nil)
	_ guard.ErrorMapper         = (*Store)(nil)
	_ guard.ObservedStore       = (*Store)(nil)
	_ pgcore.BeginFunc[*sql.Tx] = (*Store)(nil).beginOp
	_ pgcore.Queuer             = (*txn)(nil)
)

// Store is the database/sql backend of guard: *Store implements
// guard.Store[*sql.Tx] over a *sql.DB of any Postgres driver. It is safe
// for concurrent use. Create it with New.
type Store struct {
	pgstore.Core // Advance, Prune, Observers, MapError: core's, as pgfence's

	db   *sql.DB
	core pgcore.Core
	// open is the check statement, with the timeouts.
	open string
	// openColumns is the number of columns openQuery returns.
	openColumns int
	// literal: send sqlfence's statements with literal values (lib/pq,
	// see literal.go).
	literal bool
	// nonce marks the transactions this Store opens (see txn.Commit).
	nonce  string
	serial atomic.Uint64
}

// New returns a Store over db, a *sql.DB opened with a Postgres driver
// (pgx's "pgx" from github.com/jackc/pgx/v5/stdlib, lib/pq's "postgres",
// or another that reports server errors with a SQLState() method). The
// fencelock schema must be installed (migrations.Up), at the version this
// fencelock needs or newer. New does not check it: the first call that
// needs it does, once per Store (one round trip), and until the schema is
// migrated every call fails with an error that matches
// guard.ErrSchemaMissing (guard.ErrSchemaOutdated for an older schema)
// and names the versions and the command that migrates it.
// opts are package pgstore's (pgstore.WithLockTimeout, …), except
// pgstore.WithoutPreparedStatements, which is pgfence's.
func New(db *sql.DB, opts ...pgstore.Option) (*Store, error) {
	if db == nil {
		return nil, errNilDB
	}
	settings, err := pgstore.Apply(opts...)
	if err != nil {
		return nil, err
	}
	if settings.Unprepared {
		return nil, fmt.Errorf("%w: sqlfence.New: pgstore.WithoutPreparedStatements is pgfence's: the database/sql driver decides how sqlfence's statements are sent (pgx's stdlib: default_query_exec_mode in the connection string); remove the option", guard.ErrInvalidOption)
	}
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	s := &Store{db: db, nonce: hex.EncodeToString(b[:])}
	s.Core, s.core.Settings = &s.core, settings
	s.core.Name, s.core.Driver = "sqlfence", driver{db}
	s.literal = literalDriver(db)
	s.open, s.openColumns = s.openQuery(), 3
	if s.core.LockTimeout > 0 {
		s.openColumns++
	}
	if s.core.IdleTimeout > 0 {
		s.openColumns++
	}
	return s, nil
}

// Begin implements guard.Store. Use it through guard.Exec. It records the
// token (fencelock.advance, committed on its own; skipped when this Store
// has already seen the token stored), then BEGINs a READ COMMITTED
// transaction and checks the token, the key and that the transaction may
// write (a plain statement that locks nothing and calls fencelock.open only
// to refuse), so a stale token, an applied key or a read-only database
// fails before fn runs. The transaction's Commit claims
// the fence and records the key (fencelock.close), then COMMITs.
func (s *Store) Begin(ctx context.Context, c guard.Claim) (guard.Txn[*sql.Tx], error) {
	return s.beginOp(ctx, c, pgcore.RunOp{})
}

// beginOp is Begin for a run's step or finish too.
func (s *Store) beginOp(ctx context.Context, c guard.Claim, op pgcore.RunOp) (guard.Txn[*sql.Tx], error) {
	t, err := s.begin(ctx, c, op)
	if err != nil {
		return nil, s.core.ExplainPermission(ctx, err)
	}
	return t, nil
}

// The statements, parameterized. database/sql gives fn a *sql.Tx only
// through BeginTx, which sends BEGIN on its own, and commits only through
// Tx.Commit, which sends COMMIT on its own: the check and the claim cannot
// ride in those round trips, so each is one statement of its own, right
// after BEGIN and right before COMMIT.
const (
	advanceSQL = "SELECT fencelock.advance($1, $2, $3)"
	// openSQL checks (pgcore.OpenCheck, the same check as pgfence's: a
	// plain statement, fencelock.open only when something is to refuse),
	// reads whether the transaction may write
	// (pgcore.ReadOnlySQL), and marks the transaction with the Store's
	// nonce for the commit; the timeouts, when set, ride along (set_config
	// local = SET LOCAL).
	openSQL = "SELECT " + pgcore.OpenCheck + ", " + pgcore.ReadOnlySQL + ", pg_catalog.set_config('sqlfence.tx', $7, true)"
	// closeSQL claims, records the key and the run, but only in the
	// transaction open marked: after a COMMIT or ROLLBACK sent by fn
	// through the Tx, the statement would run in a transaction of its own
	// (and commit a claim nobody checked); there the mark reads '' and
	// close does not run.
	closeSQL = "SELECT fencelock.close($1, $2, $3, $4, $5, $6, $7) WHERE pg_catalog.current_setting('sqlfence.tx', true) OPERATOR(pg_catalog.=) $8"
)

// openQuery is openSQL with the Store's timeouts (built once, by New).
func (s *Store) openQuery() string {
	q := openSQL
	if s.core.LockTimeout > 0 {
		q += ", pg_catalog.set_config('lock_timeout', '" + strconv.FormatInt(s.core.LockTimeout.Milliseconds(), 10) + "', true)"
	}
	if s.core.IdleTimeout > 0 {
		q += ", pg_catalog.set_config('idle_in_transaction_session_timeout', '" + strconv.FormatInt(s.core.IdleTimeout.Milliseconds(), 10) + "', true)"
	}
	return q
}

// begin opens a checked transaction. Why advance runs on its own before
// BEGIN, and why the claim waits for the commit, is the same as in
// pgfence: the token is recorded before fn reads anything (an older holder
// that read before it froze cannot commit over what this one reads), and
// the resource's fence lock (an advisory lock: exclusive to store a new
// token, shared to check one) is held only while advance or the commit
// runs (a holder frozen in the middle of fn holds up no one). Every commit
// checks its token under the fence lock in the committing transaction, so
// committed tokens per resource never decrease in commit order.
func (s *Store) begin(ctx context.Context, c guard.Claim, run pgcore.RunOp) (*txn, error) {
	if err := pgcore.CheckClaim(c); err != nil {
		return nil, err
	}
	if err := s.core.CheckSchema(ctx, "begin"); err != nil {
		return nil, err
	}
	if !s.core.Claims.Has(c.Resource, c.Token, c.Holder) {
		if _, err := s.exec(ctx, s.db, advanceSQL, c.Resource, c.Token, c.Holder); err != nil {
			return nil, mapError(s.core.ConnError("begin", err))
		}
		s.core.Claims.Add(c.Resource, c.Token, c.Holder)
	}

	// The transaction lives on a context of its own: database/sql rolls a
	// transaction back the moment its BeginTx context ends, and pgx's
	// driver sends COMMIT with that context. Exec cancels fn's context when
	// the lease is lost, but a commit already on its way must not be cut
	// (its outcome would become unknown), so the transaction is tied to
	// ctx only while it begins, and to Commit's and Rollback's contexts
	// while those run.
	txCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	tx, err := s.db.BeginTx(txCtx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		stop()
		cancel()
		return nil, s.beginError(ctx, err)
	}
	t := &txn{s: s, tx: tx, cancel: cancel, args: closeArgs(c, run)}
	t.queue.Claim = c
	t.args = append(t.args, s.nonce+"-"+strconv.FormatUint(s.serial.Add(1), 10))
	var readOnly string
	dest := []any{new(sql.NullString), &readOnly, new(string), new(string), new(string)}
	claim := string(pgcore.ClaimText(nil, []byte(c.Resource), strconv.AppendInt(nil, c.Token, 10), []byte(c.Holder)))
	err = s.queryRow(ctx, tx, s.open, c.Resource, c.Token, c.Holder,
		c.Key, run.OpenKey(), claim, t.args[7]).Scan(dest[:s.openColumns]...)
	if !stop() {
		// ctx ended while the transaction began: database/sql rolls it back.
		err = context.Cause(ctx)
	}
	if err == nil && readOnly != "" {
		err = pgcore.ReadOnlyError(readOnly)
	}
	if err != nil {
		t.abort(ctx)
		return nil, s.beginError(ctx, err)
	}
	return t, nil
}

// beginError maps err; an error caused by ctx ending says so.
func (s *Store) beginError(ctx context.Context, err error) error {
	if cerr := context.Cause(ctx); cerr != nil && !isPostgres(err) {
		return fmt.Errorf("sqlfence: begin: %w", cerr)
	}
	return mapError(s.core.ConnError("begin", err))
}

// closeArgs are the arguments $1..$7 of closeSQL.
func closeArgs(c guard.Claim, run pgcore.RunOp) []any {
	args := []any{c.Resource, c.Token, c.Holder, nullable(c.Key), nullable(run.Key), nil, run.Finish}
	if run.Key != "" && !run.Finish {
		args[5] = run.Cursor
	}
	return args
}

// nullable is s, or NULL for "".
func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// querier is a *sql.DB or a *sql.Tx.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// exec and queryRow send one of sqlfence's own statements, with its
// values bound or, for lib/pq, written in (literal.go).
func (s *Store) exec(ctx context.Context, q querier, query string, args ...any) (sql.Result, error) {
	if s.literal {
		return q.ExecContext(ctx, inline(query, args))
	}
	return q.ExecContext(ctx, query, args...)
}

func (s *Store) queryRow(ctx context.Context, q querier, query string, args ...any) *sql.Row {
	if s.literal {
		return q.QueryRowContext(ctx, inline(query, args))
	}
	return q.QueryRowContext(ctx, query, args...)
}
