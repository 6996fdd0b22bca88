package pgfence

import (
	"context"
	"strconv"
	"unsafe"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// querier is what the transaction fn receives delegates to: the
// connection the transaction runs on (*pgx.Conn), or, for a DB other than
// a pool or a conn, the pgx.Tx that DB returned.
type querier interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error)
	Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error)
}

var (
	_ pgx.Tx  = (*fnTx)(nil)
	_ pgx.Tx  = (*savepoint)(nil)
	_ querier = (*pgx.Conn)(nil)
	_ querier = (pgx.Tx)(nil)
)

// stmts sends fn's statements to q until it is closed; then each returns
// pgx.ErrTxClosed. fnTx and its savepoints share it.
type stmts struct {
	q      querier
	closed bool
}

func (s *stmts) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	if s.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return s.q.Exec(ctx, sql, arguments...)
}

func (s *stmts) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if s.closed {
		return errRows{}, pgx.ErrTxClosed
	}
	return s.q.Query(ctx, sql, args...)
}

func (s *stmts) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if s.closed {
		return errRow{}
	}
	return s.q.QueryRow(ctx, sql, args...)
}

func (s *stmts) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if s.closed {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return s.q.SendBatch(ctx, b)
}

func (s *stmts) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if s.closed {
		return 0, pgx.ErrTxClosed
	}
	return s.q.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

func (s *stmts) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if s.closed {
		return nil, pgx.ErrTxClosed
	}
	return s.q.Prepare(ctx, name, sql)
}

// fnTx is the pgx.Tx fn receives. Statements go straight to the
// connection; the transaction itself belongs to guard.Exec: Commit and
// Rollback return guard.ErrTxOwned and send nothing, so fn cannot commit
// without the fence check (a raw COMMIT sent through Exec is caught after
// fn: guard.ErrTxEnded). Begin makes a savepoint, as pgx's Tx does. Once
// Exec has committed or rolled back, every method returns pgx.ErrTxClosed:
// a tx kept past Exec cannot run on a connection back in the pool.
type fnTx struct {
	stmts
	conn *pgx.Conn
	// savepoints numbers the savepoints of Begin.
	savepoints int64
	// queue holds what pgcore.OnCommit queued for the commit.
	queue pgcore.CommitQueue
}

// CommitQueue implements pgcore.Queuer: statements queued with
// pgcore.OnCommit go out in the commit's round trip.
func (t *fnTx) CommitQueue() *pgcore.CommitQueue { return &t.queue }

// EncodeArgs implements pgcore.Encoder: a queued statement's arguments in
// text format, with types left to the server (pgx's QueryExecModeExec).
func (t *fnTx) EncodeArgs(args []any) (any, error) {
	var eqb pgx.ExtendedQueryBuilder
	if err := eqb.Build(t.conn.TypeMap(), nil, args); err != nil {
		return nil, err
	}
	return eqb.ParamValues, nil
}

// Begin starts a pseudo-nested transaction: a savepoint, whose Commit
// releases it and whose Rollback rolls back to it.
func (t *fnTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	t.savepoints++
	n := t.savepoints
	if _, err := t.q.Exec(ctx, "SAVEPOINT sp_"+strconv.FormatInt(n, 10)); err != nil {
		return nil, err
	}
	return &savepoint{stmts: stmts{q: t}, tx: t, n: n, mark: t.queue.Len()}, nil
}

// Commit returns guard.ErrTxOwned: return nil from fn to commit.
func (t *fnTx) Commit(context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	return guard.ErrTxOwned
}

// Rollback returns guard.ErrTxOwned: return an error from fn to roll back.
func (t *fnTx) Rollback(context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	return guard.ErrTxOwned
}

func (t *fnTx) LargeObjects() pgx.LargeObjects { return largeObjects(t) }

func (t *fnTx) Conn() *pgx.Conn { return t.conn }

// savepoint is a pseudo-nested transaction of fnTx.
type savepoint struct {
	stmts // q is the fnTx: closed when either is
	tx    *fnTx
	n     int64
	// mark is how many statements were queued for the commit when the
	// savepoint began: its rollback drops those queued since.
	mark int
}

// CommitQueue implements pgcore.Queuer: the transaction's queue, or nil
// once the savepoint is released or rolled back.
func (sp *savepoint) CommitQueue() *pgcore.CommitQueue {
	if sp.closed {
		return nil
	}
	return &sp.tx.queue
}

func (sp *savepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	if sp.closed {
		return nil, pgx.ErrTxClosed
	}
	return sp.tx.Begin(ctx)
}

// Commit releases the savepoint.
func (sp *savepoint) Commit(ctx context.Context) error {
	if sp.closed {
		return pgx.ErrTxClosed
	}
	_, err := sp.Exec(ctx, "RELEASE SAVEPOINT sp_"+strconv.FormatInt(sp.n, 10))
	sp.closed = true
	return err
}

// Rollback rolls back to the savepoint.
func (sp *savepoint) Rollback(ctx context.Context) error {
	if sp.closed {
		return pgx.ErrTxClosed
	}
	_, err := sp.Exec(ctx, "ROLLBACK TO SAVEPOINT sp_"+strconv.FormatInt(sp.n, 10))
	sp.closed = true
	if err == nil {
		sp.tx.queue.Truncate(sp.mark)
	}
	return err
}

func (sp *savepoint) LargeObjects() pgx.LargeObjects { return largeObjects(sp) }

func (sp *savepoint) Conn() *pgx.Conn { return sp.tx.Conn() }

// largeObjects returns pgx's large-object API bound to tx. pgx offers no
// constructor for a Tx it did not create; LargeObjects is a struct whose
// one field is that Tx, which the assertion below pins (it fails to
// compile if pgx adds a field), and TestLargeObjectsInFn uses it.
func largeObjects(tx pgx.Tx) pgx.LargeObjects {
	var lo pgx.LargeObjects
	*(*pgx.Tx)(unsafe.Pointer(&lo)) = tx
	return lo
}

var _ [unsafe.Sizeof(pgx.LargeObjects{}) - unsafe.Sizeof(pgx.Tx(nil))]struct{}
var _ [unsafe.Sizeof(pgx.Tx(nil)) - unsafe.Sizeof(pgx.LargeObjects{})]struct{}

// errRow and errRows are what a closed tx's QueryRow and Query return.
type errRow struct{}

func (errRow) Scan(...any) error { return pgx.ErrTxClosed }

type errRows struct {
	// pgx.Rows keeps errRows a pgx.Rows if pgx adds methods; every
	// method of today is defined below.
	pgx.Rows
}

func (errRows) Close()                                       {}
func (errRows) Err() error                                   { return pgx.ErrTxClosed }
func (errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (errRows) Next() bool                                   { return false }
func (errRows) Scan(...any) error                            { return pgx.ErrTxClosed }
func (errRows) Values() ([]any, error)                       { return nil, pgx.ErrTxClosed }
func (errRows) RawValues() [][]byte                          { return nil }
func (errRows) Conn() *pgx.Conn                              { return nil }
func (errRows) TypeMap() *pgtype.Map                         { return nil }
