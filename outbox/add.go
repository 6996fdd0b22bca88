package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fencelock/fencelock/internal/pgcore"
)

// The statements Add writes: a plain INSERT, each row carrying the
// transaction's claim (the outbox's trigger refuses any other, and the
// commit checks that claim under the fence lock), one row per effect up
// to maxValuesRows (a statement per row count, each prepared once per
// connection by pgfence), a JSON array for more (one statement however
// many). Each comes in the two forms of pgcore.Rows: live, for pgfence's
// commit, and dead with deadReason and RETURNING id, for sqlfence, whose
// commit makes the rows live once its check has passed. Every name is
// schema-qualified: the session's search_path cannot change what they run.
const (
	maxValuesRows = 8
	addColumns    = `INSERT INTO fencelock.outbox (resource, token, holder, destination, key, payload, headers, ordered`
	addJSON       = ` SELECT $1, $2, $3, e OPERATOR(pg_catalog.->>) 'd', e OPERATOR(pg_catalog.->>) 'k',` +
		` pg_catalog.decode(COALESCE(e OPERATOR(pg_catalog.->>) 'p', ''), 'base64'), e OPERATOR(pg_catalog.->) 'h',` +
		` COALESCE((e OPERATOR(pg_catalog.->>) 'o')::pg_catalog.bool, false)`
	addJSONFrom = ` FROM pg_catalog.jsonb_array_elements($4::pg_catalog.jsonb) e`

	// deadReason is the last_error of a row that sqlfence's commit did not
	// make live: what an operator reads in fencectl outbox list --dead.
	// (No quote or dollar sign: it is written into the statement.)
	deadReason = "not sent: recorded by a guarded transaction whose commit did not pass its fence check" +
		" (fn ended the transaction itself: a COMMIT sent as SQL, or Commit on its *sql.Tx)"
	deadValues  = `, pg_catalog.now(), '` + deadReason + `'`
	deadColumns = `, dead_at, last_error)`
)

// sqlAddJSON inserts the effects of a JSON array ($4), with the claim
// ($1-$3).
var sqlAddJSON = pgcore.Rows{
	Queued: addColumns + `)` + addJSON + addJSONFrom,
	Now:    addColumns + deadColumns + addJSON + deadValues + addJSONFrom + ` RETURNING id`,
}

// sqlAddValues[n] inserts n effects: the claim ($1-$3), then five
// parameters per effect.
var sqlAddValues = func() [maxValuesRows + 1]pgcore.Rows {
	var out [maxValuesRows + 1]pgcore.Rows
	for n := 1; n <= maxValuesRows; n++ {
		var live, dead strings.Builder
		live.WriteString(addColumns + `) VALUES `)
		dead.WriteString(addColumns + deadColumns + ` VALUES `)
		for i := range n {
			if i > 0 {
				live.WriteString(", ")
				dead.WriteString(", ")
			}
			p := 5*i + 4
			v := fmt.Sprintf("($1, $2, $3, $%d, $%d, $%d, $%d, $%d", p, p+1, p+2, p+3, p+4)
			live.WriteString(v + ")")
			dead.WriteString(v + deadValues + ")")
		}
		dead.WriteString(` RETURNING id`)
		out[n] = pgcore.Rows{Queued: live.String(), Now: dead.String()}
	}
	return out
}()

// Add records effects in tx, the transaction that guard.Exec (or a Run's
// Step) gives fn, of pgfence (a pgx.Tx, or a savepoint of it) or sqlfence
// (a *sql.Tx); ctx is the context fn received, or one derived from it
// (a *sql.Tx carries nothing of its own: its guarded transaction is found
// through that context, see guard.OpenTxn). Tx is the store's handle type,
// inferred from tx. The effects are written to fencelock.outbox in that transaction,
// go out only if it commits through the commit's check of its claim, and
// are delivered by a Relay once it has committed. If the transaction does
// not commit — fn returns an error, panics or its context ends, the token
// is stale at the commit, a retry under guard.WithKey finds the key
// applied — nothing is recorded and nothing is sent. When it commits, the
// relays of this process wake at once.
//
// With pgfence Add sends nothing itself: the effects ride the commit's
// round trip, and a savepoint of tx.Begin that is rolled back drops the
// effects added after it began (one that fn makes and rolls back with SQL
// does not: pgfence does not read fn's SQL). With sqlfence each Add is one
// statement, sent at once in fn's transaction (database/sql sends one
// statement at a time: pass all of a transaction's effects in one call),
// so any savepoint rolled back, with SQL too, undoes it; its rows are
// written dead and come alive in the commit's claim statement, once the
// check has passed, so a COMMIT that fn sends itself leaves them dead
// (with the reason, never sent).
//
// An effect Add refuses (ErrInvalidEffect: an empty destination or key,
// a payload over MaxPayload, headers that are not valid HTTP), a tx that
// is not an open guarded transaction or a *sql.Tx with a ctx that fn did
// not receive (ErrNotGuarded), or an ended ctx is
// an error, nothing of the call is sent or recorded, and the transaction
// is still fn's, which decides whether to return the error. With sqlfence
// an insert the database refuses is its error (the transaction is then
// aborted, as by any failed statement); a refused privilege (INSERT on
// fencelock.outbox revoked from the role) matches guard.ErrPermission and
// names the GRANT, as the commit's error does with pgfence.
func Add[Tx any](ctx context.Context, tx Tx, effects ...Effect) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outbox: add: %w", err)
	}
	q, err := pgcore.QueueOf(ctx, tx)
	if err != nil {
		return addError(err)
	}
	claim, err := q.ClaimOf()
	if err != nil {
		return addError(err)
	}
	rows, err := encode(claim, effects)
	if err != nil {
		return err
	}
	if err := q.Write(ctx, rows); err != nil {
		return addError(err)
	}
	// Registered after the statement: an Add that queued nothing wakes no
	// one.
	if err := q.AfterCommit(wakeAll); err != nil {
		return addError(err)
	}
	return nil
}

// Notify makes the commit of tx (with ctx, as for Add) also NOTIFY channel fencelock_outbox, so that
// relays of other processes started WithListen wake at once rather than
// at their next poll. Each transaction that notifies takes a lock shared
// by the whole database while it commits: keep it for effects that are
// rare and whose latency across processes matters. Behind a transaction
// pooler no relay can listen: polling is what delivers.
func Notify[Tx any](ctx context.Context, tx Tx) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outbox: notify: %w", err)
	}
	q, err := pgcore.QueueOf(ctx, tx)
	if err != nil {
		return addError(err)
	}
	if err := q.OnCommit(`SELECT pg_notify('fencelock_outbox', '')`); err != nil {
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
