package pgcore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/fencelock/fencelock/guard"
)

// ErrNotGuardedTx is OnCommit's error for a tx that is not an open guarded
// transaction. It carries no package prefix: the caller's layer adds its
// own.
var ErrNotGuardedTx = errors.New("not an open guarded transaction: pass the tx that guard.Exec (or a Run's Step) gave fn, while fn runs")

// Queued is a statement queued for a guarded transaction's commit.
type Queued struct {
	SQL  string
	Args []any
	// Encoded is what the store's Encode made of Args (pgfence: the
	// parameters in text format), nil without one.
	Encoded any
}

// CommitQueue holds the statements queued on one guarded transaction
// until its commit takes them. Its zero value is an open, empty queue.
type CommitQueue struct {
	// Encoder, if set, turns a statement's arguments into what the
	// store's commit sends, when the statement is queued, so that an
	// argument the driver cannot encode is an error there and then.
	Encoder Encoder
	// Claim is the transaction's claim, which its commit checks (the
	// store sets it when the transaction begins); ClaimOf returns it.
	Claim guard.Claim

	mu     sync.Mutex
	stmts  []Queued
	after  []func()
	closed bool
}

// Take closes q and returns what was queued; later adds fail with
// ErrNotGuardedTx.
func (q *CommitQueue) Take() []Queued {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	out := q.stmts
	q.stmts = nil
	return out
}

// Committed runs the functions AfterCommit registered, once; a store
// calls it when its COMMIT has succeeded, and only then.
func (q *CommitQueue) Committed() {
	q.mu.Lock()
	fs := q.after
	q.after = nil
	q.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// Len is how many statements are queued (a savepoint's mark).
func (q *CommitQueue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.stmts)
}

// Truncate drops what was queued after mark (a savepoint rolled back).
func (q *CommitQueue) Truncate(mark int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if mark < len(q.stmts) {
		clear(q.stmts[mark:])
		q.stmts = q.stmts[:mark]
	}
}

func (q *CommitQueue) add(st Queued) error {
	if q.Encoder != nil {
		enc, err := q.Encoder.EncodeArgs(st.Args)
		if err != nil {
			return fmt.Errorf("%w: a statement queued for the commit: %w", guard.ErrInvalidInput, err)
		}
		st.Encoded = enc
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return fmt.Errorf("%w (its Exec has ended)", ErrNotGuardedTx)
	}
	q.stmts = append(q.stmts, st)
	return nil
}

// Encoder encodes a queued statement's arguments.
type Encoder interface {
	EncodeArgs(args []any) (any, error)
}

// Queuer is a transaction handle or a guard.Txn that carries its queue:
// pgfence's pgx.Tx and its savepoints carry it in the handle fn writes
// through; sqlfence's Txn carries it, and fn's *sql.Tx is found through
// the context guard.Exec gave fn (guard.OpenTxn).
type Queuer interface {
	CommitQueue() *CommitQueue
}

// QueueOf is the commit queue of tx, the handle guard.Exec (or a Run's
// Step) gave fn, or a pgfence savepoint of it; ctx is the context that
// fn received (or one derived from it). A pgx.Tx of pgfence carries its
// queue; a *sql.Tx is matched against the open transaction that ctx
// carries, whatever the static type it is passed as (sqlc's DBTX, GORM's
// ConnPool, any). Anything else is an error wrapping ErrNotGuardedTx that
// says which of these it met.
func QueueOf[Tx any](ctx context.Context, tx Tx) (*CommitQueue, error) {
	if v := reflect.ValueOf(tx); !v.IsValid() || v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, fmt.Errorf("%w (tx is nil)", ErrNotGuardedTx)
	}
	if h, ok := any(tx).(Queuer); ok {
		if q := h.CommitQueue(); q != nil {
			return q, nil
		}
		return nil, fmt.Errorf("%w (got a %T whose savepoint has ended)", ErrNotGuardedTx, tx)
	}
	if st, ok := any(tx).(*sql.Tx); ok {
		return queueOfSQL(ctx, st)
	}
	txn, ok := guard.OpenTxn[Tx](ctx)
	if !ok {
		return nil, fmt.Errorf("%w (got a %T: pass the transaction fn received as the store gave it, a pgx.Tx of pgfence or the *sql.Tx of sqlfence (with sqlx, its Tx field), with the ctx fn received)", ErrNotGuardedTx, tx)
	}
	return queueOfTxn(txn, any(tx))
}

// queueOfSQL is the queue of a *sql.Tx, found through the open
// transaction of type *sql.Tx that ctx carries.
func queueOfSQL(ctx context.Context, tx *sql.Tx) (*CommitQueue, error) {
	txn, ok := guard.OpenTxn[*sql.Tx](ctx)
	if !ok {
		return nil, fmt.Errorf("%w (ctx carries no guarded transaction of a *sql.Tx: pass the ctx fn received, or one derived from it)", ErrNotGuardedTx)
	}
	return queueOfTxn(txn, any(tx))
}

// queueOfTxn is the queue of txn, the open transaction ctx carries, when
// tx is its handle.
func queueOfTxn[Tx any](txn guard.Txn[Tx], tx any) (*CommitQueue, error) {
	h, ok := txn.(Queuer)
	if !ok {
		return nil, fmt.Errorf("%w (the store of ctx's guard.Exec gives a %T, which has no commit queue: effects need pgfence or sqlfence, and a store that wraps one must hand on its Txn's CommitQueue method)", ErrNotGuardedTx, txn)
	}
	if !reflect.TypeOf(tx).Comparable() || any(txn.Tx()) != tx {
		return nil, fmt.Errorf("%w (got a %T that is not the transaction of ctx's guard.Exec: pass the one fn received, with the ctx fn received)", ErrNotGuardedTx, tx)
	}
	return h.CommitQueue(), nil
}

// OnCommit queues sql, with args, on q, to be sent with the transaction's
// commit, after fn returned nil, in the committing transaction: if a
// queued statement fails, nothing of the transaction commits (the
// commit's error says which statement); if fn fails, the claim is refused
// or the lease was lost before the commit, they are never sent, or rolled
// back with the rest.
//
// pgfence sends them in the commit's own round trip, pipelined ahead of
// fencelock.close and COMMIT: they cost no round trip. sqlfence sends each
// as a statement of its own between the claim and COMMIT (database/sql
// runs one statement per round trip, and only after the claim is the
// transaction known to be still the one guard opened): one round trip
// each. A pgfence savepoint rolled back drops what was queued through it
// or after it.
//
// Arguments are what the store's driver takes as query arguments; with
// pgfence they are encoded when queued (an argument pgx cannot encode is
// an error wrapping guard.ErrInvalidInput), and sent in text format with
// types left to the server, as pgx's QueryExecModeExec does. A queue whose
// Exec has ended refuses with ErrNotGuardedTx; nothing is queued.
func (q *CommitQueue) OnCommit(sql string, args ...any) error {
	if strings.TrimSpace(sql) == "" {
		return fmt.Errorf("%w: empty statement queued for the commit", guard.ErrInvalidInput)
	}
	return q.add(Queued{SQL: sql, Args: args})
}

// AfterCommit registers f to run once q's transaction has committed: in
// the goroutine that committed, before Exec returns; never if the
// transaction did not commit. (package outbox wakes the process's relays
// with it.) A queue whose Exec has ended refuses with ErrNotGuardedTx.
func (q *CommitQueue) AfterCommit(f func()) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return fmt.Errorf("%w (its Exec has ended)", ErrNotGuardedTx)
	}
	q.after = append(q.after, f)
	return nil
}

// ClaimOf returns the claim of q's transaction: the resource, token and
// holder its commit checks (a statement queued on it may carry them, as
// package outbox's rows do). A queue whose Exec has ended refuses with
// ErrNotGuardedTx.
func (q *CommitQueue) ClaimOf() (guard.Claim, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return guard.Claim{}, fmt.Errorf("%w (its Exec has ended)", ErrNotGuardedTx)
	}
	return q.Claim, nil
}

// OnCommit queues sql on the commit queue of tx (QueueOf), as
// CommitQueue.OnCommit does.
func OnCommit[Tx any](ctx context.Context, tx Tx, sql string, args ...any) error {
	q, err := QueueOf(ctx, tx)
	if err != nil {
		return err
	}
	return q.OnCommit(sql, args...)
}
