package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencelock/fencelock/internal/pgcore"
)

// sqlAdd records a JSON array of effects (see effect.go's row) for the
// transaction's claim.
const sqlAdd = `SELECT fencelock.outbox_add($1::jsonb)`

// Add records effects in tx, the transaction that guard.Exec (or a Run's
// Step) gives fn, of pgfence (a pgx.Tx, or a savepoint of it) or sqlfence
// (a *sql.Tx): they are written to fencelock.outbox with the transaction's
// commit, in the same transaction, and delivered by a Relay once it has
// committed. If the transaction does not commit — fn returns an error,
// panics or its context ends, the token is stale at the commit, a retry
// under guard.WithKey finds the key applied — nothing is recorded and
// nothing is sent. When it commits, the relays of this process wake at
// once.
//
// Add sends nothing itself: with pgfence the effects ride the commit's
// round trip; with sqlfence each Add costs one round trip at the commit
// (database/sql sends one statement at a time), so pass all of a
// transaction's effects in one call. A pgfence savepoint rolled back drops
// the effects added through it.
//
// An effect Add refuses (ErrInvalidEffect: an empty destination or key,
// a payload over MaxPayload, headers that are not valid HTTP), a tx that
// is not an open guarded transaction (ErrNotGuarded) or an ended ctx is
// an error, and nothing of the call is recorded; the transaction is
// still fn's, which decides whether to return the error.
func Add(ctx context.Context, tx any, effects ...Effect) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outbox: add: %w", err)
	}
	arg, err := encode(effects)
	if err != nil {
		return err
	}
	if err := pgcore.OnCommit(tx, sqlAdd, arg); err != nil {
		return addError(err)
	}
	// Registered after the statement: an Add that queued nothing wakes no
	// one.
	if err := pgcore.AfterCommit(tx, wakeAll); err != nil {
		return addError(err)
	}
	return nil
}

// Notify makes tx's commit also NOTIFY channel fencelock_outbox, so that
// relays of other processes started WithListen wake at once rather than
// at their next poll. Each transaction that notifies takes a lock shared
// by the whole database while it commits: keep it for effects that are
// rare and whose latency across processes matters. Behind a transaction
// pooler no relay can listen: polling is what delivers.
func Notify(ctx context.Context, tx any) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outbox: notify: %w", err)
	}
	if err := pgcore.OnCommit(tx, `SELECT pg_notify('fencelock_outbox', '')`); err != nil {
		return addError(err)
	}
	return nil
}

func addError(err error) error {
	if errors.Is(err, pgcore.ErrNotGuardedTx) {
		return &notGuardedError{err}
	}
	return fmt.Errorf("outbox: add: %w", err)
}
