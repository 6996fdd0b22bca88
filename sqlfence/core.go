package sqlfence

// What the Store takes from the Postgres core it shares with pgfence
// (internal/pgcore): options, Advance, Prune, resumable runs.

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
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
// the resource's fence lock at commit (held only by commits in flight, by
// Advance, and by transactions that wrote to a table protected with
// pgfence's Protect) and the writes of fn. Past d the wait fails, for the
// fence lock with
// guard.ErrFenceBusy, and the transaction is rolled back. It is set for
// the transaction only (lock_timeout, set_config local) in the statement
// that checks the claim at begin, so it costs no round trip. d must be at
// least a millisecond. Default: Postgres's lock_timeout setting.
func WithLockTimeout(d time.Duration) Option { return option(pgcore.WithLockTimeout(d)) }

// WithIdleTimeout makes Postgres end a guarded transaction's session when
// it sits idle (no statement from the client) for longer than d
// (idle_in_transaction_session_timeout, for the transaction only): a
// holder frozen after writing to a protected table then stops delaying the
// next holder after d. Pick d above the longest pause between two
// statements of a healthy fn, e.g. the lock's lease. d must be at least a
// millisecond. Default: off.
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
type Run struct{ r pgcore.Run[*sql.Tx] }

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
func (r *Run) Step(ctx context.Context, newCursor string, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return r.r.Step(ctx, newCursor, fn)
}

// Finish marks the run finished in a fenced transaction: later Steps, by
// any holder, are no-ops (guard.ErrRunFinished). Finishing a finished run
// is a no-op; a stale lease gets a *guard.StaleTokenError.
func (r *Run) Finish(ctx context.Context) error { return r.r.Finish(ctx) }

// driver runs the core's statements on db, each on its own.
type driver struct{ db *sql.DB }

func (d driver) Exec(ctx context.Context, q string, args ...any) error {
	_, err := d.db.ExecContext(ctx, q, args...)
	return err
}

func (d driver) QueryRow(ctx context.Context, q string, args []any, dest ...any) (bool, error) {
	err := d.db.QueryRowContext(ctx, q, args...).Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}
