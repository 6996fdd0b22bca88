package sqlfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
)

// txn is an open, checked transaction.
type txn struct {
	s  *Store
	tx *sql.Tx
	// cancel ends the transaction's own context (see Store.begin).
	cancel context.CancelFunc
	// args are closeSQL's arguments, the transaction's mark last.
	args  []any
	ended bool
	// queue holds what was queued for the commit; package outbox finds it
	// through the context guard.Exec gives fn (guard.OpenTxn).
	queue pgcore.CommitQueue
}

// CommitQueue implements pgcore.Queuer.
func (t *txn) CommitQueue() *pgcore.CommitQueue { return &t.queue }

// end marks the transaction ended: nothing more can be queued on it.
func (t *txn) end() []pgcore.Queued {
	t.ended = true
	return t.queue.Take()
}

func (t *txn) Tx() *sql.Tx { return t.tx }

// Commit claims the fence, records the key and the run (fencelock.close),
// runs the statements queued with pgcore.OnCommit (one round trip each:
// database/sql sends one statement at a time) and commits: two statements
// more than fn's, as database/sql sends COMMIT on its own.
//
// fn gets a plain *sql.Tx, whose Commit and Rollback no store can
// intercept; what fn did is found out here instead, and reported, never
// papered over:
//   - fn called Commit or Rollback on the *sql.Tx: close fails with
//     sql.ErrTxDone; the error wraps guard.ErrTxEnded (fn's writes may
//     have committed without the fence check);
//   - fn sent COMMIT or ROLLBACK as SQL through it: the transaction's mark
//     is gone, close does not run, the error wraps guard.ErrTxEnded too.
//
// Either way nothing queued is sent: the effects fn added (package
// outbox) are not recorded.
//
// A refused claim rolls back (FL001: a *guard.StaleTokenError; FL003:
// guard.ErrAlreadyApplied). An error from COMMIT itself that carries no
// SQLSTATE (the connection broke, ctx ended while it was in flight) wraps
// guard.ErrUnknownOutcome: the server may have committed.
func (t *txn) Commit(ctx context.Context) error {
	err := t.commit(ctx)
	if err == nil {
		t.queue.Committed()
	}
	return t.s.core.ExplainPermission(ctx, err)
}

func (t *txn) commit(ctx context.Context) error {
	if t.ended {
		return sql.ErrTxDone
	}
	queued := t.end()
	defer t.cancel()
	var prev sql.NullInt64
	err := t.s.queryRow(ctx, t.tx, closeSQL, t.args...).Scan(&prev)
	switch {
	case err == nil:
	case errors.Is(err, sql.ErrTxDone):
		return fmt.Errorf("%w: fn called Commit or Rollback on the *sql.Tx it was given; return an error from fn to roll back instead", guard.ErrTxEnded)
	case errors.Is(err, sql.ErrNoRows):
		t.rollback(ctx)
		return fmt.Errorf("%w: fn sent COMMIT or ROLLBACK through the *sql.Tx; return an error from fn to roll back instead", guard.ErrTxEnded)
	default:
		// Refused (FL001, FL003, FL004, lock timeout, an aborted
		// transaction...) or ctx ended: COMMIT was not sent, nothing was
		// committed.
		t.rollback(ctx)
		return mapError(err)
	}
	// The claim ran in the transaction open marked, so the queued
	// statements do too (after it, not before: a statement sent after a
	// raw COMMIT of fn would run in a transaction of its own).
	for i, q := range queued {
		if _, err := t.tx.ExecContext(ctx, q.SQL, q.Args...); err != nil {
			t.rollback(ctx)
			return fmt.Errorf("sqlfence: statement %d of %d queued for the commit failed, nothing was committed: %w", i+1, len(queued), mapError(err))
		}
	}
	// ctx ended after the claim: roll back rather than race database/sql,
	// which may or may not send COMMIT once the transaction's context is
	// cancelled. Nothing was committed, and Exec says so.
	if ctx.Err() != nil {
		t.rollback(ctx)
		return fmt.Errorf("sqlfence: commit not sent, nothing was committed: %w", context.Cause(ctx))
	}
	// database/sql's Commit takes no context; the driver sends COMMIT with
	// the transaction's, tied to ctx for the duration.
	stop := context.AfterFunc(ctx, t.cancel)
	err = t.tx.Commit()
	stop()
	if err == nil {
		return nil
	}
	if isPostgres(err) {
		// The server answered: it refused (a deferred constraint, a
		// serialization failure...) and rolled back.
		return mapError(err)
	}
	return fmt.Errorf("%w: COMMIT was sent, its answer was lost: %w", guard.ErrUnknownOutcome, err)
}

// Rollback rolls back; it is a no-op after Commit or Rollback, and after
// fn ended the transaction itself.
func (t *txn) Rollback(ctx context.Context) error {
	if t.ended {
		return nil
	}
	t.end()
	defer t.cancel()
	stop := context.AfterFunc(ctx, t.cancel)
	defer stop()
	err := t.tx.Rollback()
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return mapError(err)
}

// abort ends a transaction that failed to begin, and releases it.
func (t *txn) abort(ctx context.Context) {
	t.end()
	defer t.cancel()
	t.rollback(ctx)
}

// rollback ends the transaction after a failed statement; the context is
// ctx's, bounded, so a rollback runs even when ctx has ended.
func (t *txn) rollback(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), guard.RollbackTimeout)
	defer cancel()
	stop := context.AfterFunc(rctx, t.cancel)
	defer stop()
	_ = t.tx.Rollback()
}

// isPostgres reports whether err carries an answer of the server.
func isPostgres(err error) bool {
	_, ok := pgcore.From(err)
	return ok
}
