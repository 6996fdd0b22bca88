package pgfence

// What the Store takes from the Postgres core it shares with sqlfence
// (internal/pgcore): options, Advance, Prune, resumable runs.

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/jackc/pgx/v5"
)

// Option configures a Store; the With… functions of this package make
// them. New applies them in order and returns the first one's error, which
// matches guard.ErrInvalidOption.
type Option interface {
	apply(*pgcore.Settings) error
}

// option is an Option over the settings of the Postgres core.
type option func(*pgcore.Settings) error

func (o option) apply(s *pgcore.Settings) error { return o(s) }

// WithLockTimeout bounds how long a guarded transaction waits for a lock:
// the claim at commit waiting for the resource's fence lock (held only by
// commits in flight, by Advance, and by transactions that wrote to a table
// protected with Protect, such as a previous holder frozen after such a
// write), and the writes of fn. Past d the wait fails, for the fence lock with
// guard.ErrFenceBusy, instead of lasting until the other transaction ends;
// the transaction is rolled back. It is set for the transaction only
// (set_config(..., true)) in the round trip of BEGIN. d must be at least a
// millisecond. Default: no limit (Postgres's lock_timeout setting
// applies).
func WithLockTimeout(d time.Duration) Option { return option(pgcore.WithLockTimeout(d)) }

// WithIdleTimeout makes Postgres end a guarded transaction's session when
// the transaction sits idle (no statement from the client) for longer than
// d: idle_in_transaction_session_timeout, set for the transaction only in
// the round trip of BEGIN. A guarded transaction takes the fence lock
// only in its commit, so a holder frozen in the middle of it (SIGSTOP, VM
// freeze, partition) blocks no one, except after writing to a table
// protected with Protect: the protect trigger holds the fence lock until
// the transaction ends, and the next holder's claim waits for it. With
// this option the database rolls such a frozen transaction back after d
// (and frees its connection and row locks). Pick d above the longest pause
// between two statements of a healthy fn, e.g. the lock's lease. d must be
// at least a millisecond. Default: off.
func WithIdleTimeout(d time.Duration) Option { return option(pgcore.WithIdleTimeout(d)) }

// WithObserver adds o to the Store's observers: every guard.Exec through
// the Store, and every Run.Step and Run.Finish, reports to it, and every
// Advance to those that are guard.AdvanceObservers (see guard.Observer; a
// metrics adapter, say). Set it once here rather than
// per call with guard.WithObserver; each call of the option adds one. o
// must implement at least one of guard's observer interfaces.
func WithObserver(o guard.Observer) Option { return option(pgcore.WithObserver(o)) }

// WithLogger logs every guarded write through the Store to l, one line
// each (guard.NewLogObserver: committed at Debug, rejected and failed at
// Warn, unknown outcomes at Error). Default: no logging.
func WithLogger(l *slog.Logger) Option { return option(pgcore.WithLogger(l)) }

// WithoutPreparedStatements makes the Store send its own statements
// unnamed (parsed and planned in every transaction) on every connection.
// By default it prepares them once per connection when the connection goes
// straight to Postgres, which it tells by comparing the backend's
// pg_backend_pid() with the process id of the connection's cancel key (a
// transaction pooler such as PgBouncer hands out a key of its own), and
// sends them unnamed otherwise. Use this option behind a pooler that
// passes the server's cancel key through unchanged while it moves
// transactions between server connections. Parsing and planning them in
// every transaction costs the server more CPU per guarded transaction.
func WithoutPreparedStatements() Option { return option(pgcore.Unprepared()) }

// Advance claims the fence for lease right away, in its own transaction.
// Call it just after acquiring the lock: from then on a previous holder
// that is paused (GC, SIGSTOP, partition) is rejected even if it writes
// before this holder's first write. It returns a *guard.StaleTokenError if
// the database has already seen a newer token, guard.ErrReadOnly on a
// read-only database, and refuses a lease that is lost, released or
// closed as guard.Exec does (a *guard.LeaseLostError), sending nothing.
// ctx bounds the call, including a wait for the fence row held by an open
// transaction.
func (s *Store) Advance(ctx context.Context, lease guard.Lease) error {
	return s.core.Advance(ctx, lease)
}

// Prune deletes applied idempotency keys and finished runs older than
// olderThan, and returns how many rows it deleted. A batch retried after
// its key was pruned is applied again: keep olderThan well above the
// longest time a retry can come. The fence rows (tokens) are never pruned:
// they are what rejects stale holders. olderThan must not be negative.
func (s *Store) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	return s.core.Prune(ctx, olderThan)
}

// Observers returns the observers set with WithObserver and WithLogger
// (guard.ObservedStore: guard.Exec reports to them).
func (s *Store) Observers() []guard.Observer { return s.core.Observers() }

// MapError is MapError as a method, so that guard.Exec translates the
// errors fn returns (guard.ErrorMapper).
func (s *Store) MapError(err error) error { return pgcore.Map(err) }

// Run is a resumable run: a long batch split into steps, each one fenced
// transaction that also advances the run's stored cursor. A new holder
// resumes from the cursor, a finished run is a no-op for every later
// holder, and a stale holder's step is rejected. Create it with Store.Run.
type Run struct{ r pgcore.Run[pgx.Tx] }

// Run returns the resumable run runKey of lease's resource. Bad input (an
// empty key, a bad lease) is reported by the Run's methods.
func (s *Store) Run(lease guard.Lease, runKey string) *Run {
	return &Run{pgcore.NewRun(&s.core, s.beginOp, lease, runKey)}
}

// Resume reads where the run stands: the cursor of its last committed step
// ("" before the first) and whether it is finished. It does not claim.
func (r *Run) Resume(ctx context.Context) (cursor string, finished bool, err error) {
	return r.r.Resume(ctx)
}

// Step runs fn in one fenced transaction (as guard.Exec does) that also
// sets the run's cursor to newCursor (at most guard.MaxCursorLen bytes).
// If the run is finished, fn does not run and Step returns
// guard.ErrRunFinished; a stale lease gets a *guard.StaleTokenError. fn may
// be nil to only move the cursor.
func (r *Run) Step(ctx context.Context, newCursor string, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return r.r.Step(ctx, newCursor, fn)
}

// Finish marks the run finished in a fenced transaction: later Steps, by
// any holder, are no-ops (guard.ErrRunFinished). Finishing a finished run
// is a no-op; a stale lease gets a *guard.StaleTokenError.
func (r *Run) Finish(ctx context.Context) error { return r.r.Finish(ctx) }

// driver runs the core's statements on db, each on its own, unnamed
// (they are not on the hot path).
type driver struct{ db DB }

func (d driver) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := d.db.Exec(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...)
	return err
}

func (d driver) QueryRow(ctx context.Context, sql string, args []any, dest ...any) (bool, error) {
	err := d.db.QueryRow(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}
