package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fencelock/fencelock/internal/pgcore"
)

// The statements Add queues for the commit: a plain INSERT, each row
// carrying the transaction's claim (the outbox's trigger refuses any
// other, and the commit checks that claim under the fence lock), one row
// per effect up to maxValuesRows (a statement per row count, each
// prepared once per connection by pgfence), a JSON array for more (one
// statement however many). Every name is schema-qualified: the session's
// search_path cannot change what they run.
const (
	maxValuesRows = 8
	addColumns    = `INSERT INTO fencelock.outbox (resource, token, holder, destination, key, payload, headers, ordered)`
	addJSON       = ` SELECT $1, $2, $3, e OPERATOR(pg_catalog.->>) 'd', e OPERATOR(pg_catalog.->>) 'k',` +
		` pg_catalog.decode(COALESCE(e OPERATOR(pg_catalog.->>) 'p', ''), 'base64'), e OPERATOR(pg_catalog.->) 'h',` +
		` COALESCE((e OPERATOR(pg_catalog.->>) 'o')::pg_catalog.bool, false)`
	addJSONFrom = ` FROM pg_catalog.jsonb_array_elements($4::pg_catalog.jsonb) e`
)

// sqlAddJSON inserts the effects of a JSON array ($4), with the claim
// ($1-$3).
const sqlAddJSON = addColumns + addJSON + addJSONFrom

// sqlAddValues[n] inserts n effects: the claim ($1-$3), then five
// parameters per effect.
var sqlAddValues = func() [maxValuesRows + 1]string {
	var out [maxValuesRows + 1]string
	for n := 1; n <= maxValuesRows; n++ {
		var b strings.Builder
		b.WriteString(addColumns + ` VALUES `)
		for i := range n {
			if i > 0 {
				b.WriteString(", ")
			}
			p := 5*i + 4
			fmt.Fprintf(&b, "($1, $2, $3, $%d, $%d, $%d, $%d, $%d)", p, p+1, p+2, p+3, p+4)
		}
		out[n] = b.String()
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
// Both stores record effects the same way: Add sends nothing; its rows
// are written, live, by the commit, in the committing transaction, after
// fn returned nil (pgfence: in the commit's round trip; sqlfence: one
// statement each, after the claim). So a transaction that fn ends itself
// (a COMMIT sent as SQL, Commit on its *sql.Tx) records nothing, and a
// savepoint rolled back drops the effects added after it only when the
// store sees it: a pgx savepoint of tx.Begin (pgfence) does, a savepoint
// made and rolled back in SQL (GORM's nested transactions) does not,
// since no store reads fn's SQL. Add effects once the work they follow
// is known to stay.
//
// An effect Add refuses (ErrInvalidEffect: an empty destination or key,
// a payload over MaxPayload, headers that are not valid HTTP), a tx that
// is not an open guarded transaction or a *sql.Tx with a ctx that fn did
// not receive (ErrNotGuarded), or an ended ctx is
// an error, nothing of the call is sent or recorded, and the transaction
// is still fn's, which decides whether to return the error. An insert the
// database refuses at the commit is the commit's error, and nothing
// commits; a refused privilege (INSERT on fencelock.outbox revoked from
// the role) matches guard.ErrPermission and names the GRANT.
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
	st, err := encode(claim, effects)
	if err != nil {
		return err
	}
	if err := q.OnCommit(st.SQL, st.Args...); err != nil {
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
