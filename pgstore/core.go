package pgstore

import (
	"context"
	"time"

	"github.com/fencelock/fencelock/guard"
)

// Core is what every Postgres store does the same way: pgfence.Store and
// sqlfence.Store embed it, so its methods are theirs.
type Core interface {
	// Advance claims the fence for lease right away, in its own
	// transaction. Call it just after acquiring the lock: from then on a
	// previous holder that is paused (GC, SIGSTOP, partition) is rejected
	// even if it writes before this holder's first write. It returns a
	// *guard.StaleTokenError if the database has already seen a newer
	// token, guard.ErrReadOnly on a read-only database, and refuses a
	// lease that is lost, released or closed as guard.Exec does (a
	// *guard.LeaseLostError), sending nothing. ctx bounds the call,
	// including a wait for the fence row held by an open transaction.
	Advance(ctx context.Context, lease guard.Lease) error

	// Prune deletes applied idempotency keys and finished runs older than
	// olderThan, and returns how many rows it deleted. A batch retried
	// after its key was pruned is applied again: keep olderThan well above
	// the longest time a retry can come. The fence rows (tokens) are never
	// pruned: they are what rejects stale holders. olderThan must not be
	// negative.
	Prune(ctx context.Context, olderThan time.Duration) (int64, error)

	// Observers returns the observers set with WithObserver and WithLogger
	// (guard.ObservedStore: guard.Exec reports to them).
	Observers() []guard.Observer

	// MapError translates the errors fn returns (guard.ErrorMapper): a
	// fencelock SQLSTATE, such as a protect trigger's refusal, becomes the
	// guard error it stands for.
	MapError(err error) error
}

// Run is a resumable run: a long batch split into steps, each one fenced
// transaction that also advances the run's stored cursor. A new holder
// resumes from the cursor, a finished run is a no-op for every later
// holder, and a stale holder's step is rejected. A store's Run method makes
// one (bad input, such as an empty key or a bad lease, is reported by its
// methods); Tx is the store's transaction type.
type Run[Tx any] interface {
	// Resume reads where the run stands: the cursor of its last committed
	// step ("" before the first) and whether it is finished. It does not
	// claim.
	Resume(ctx context.Context) (cursor string, finished bool, err error)

	// Step runs fn in one fenced transaction (as guard.Exec does) that
	// also sets the run's cursor to newCursor (at most guard.MaxCursorLen
	// bytes). If the run is finished, fn does not run and Step returns
	// guard.ErrRunFinished; a stale lease gets a *guard.StaleTokenError.
	// fn may be nil to only move the cursor.
	Step(ctx context.Context, newCursor string, fn func(ctx context.Context, tx Tx) error) error

	// Finish marks the run finished in a fenced transaction: later Steps,
	// by any holder, are no-ops (guard.ErrRunFinished). Finishing a
	// finished run is a no-op; a stale lease gets a *guard.StaleTokenError.
	Finish(ctx context.Context) error
}
