package pgfence

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/fencelock/fencelock/guard"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is what Store needs from Postgres. *pgxpool.Pool and *pgx.Conn satisfy
// it (a *pgx.Conn must not be used by two goroutines at once, as always).
// For those two the claim rides in the same round trip as BEGIN; any other
// implementation gets a correct but slower path (BEGIN, then the claim).
type DB interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

var (
	_ DB = (*pgxpool.Pool)(nil)
	_ DB = (*pgx.Conn)(nil)

	_ guard.Store[pgx.Tx] = (*Store)(nil)
	_ guard.ErrorMapper   = (*Store)(nil)
)

// Store is the Postgres backend of guard: *Store implements
// guard.Store[pgx.Tx]. It is safe for concurrent use when its DB is (a
// pool is). Create it with New.
type Store struct {
	db          DB
	lockTimeout time.Duration
	idleTimeout time.Duration
}

// Option configures a Store.
type Option func(*Store) error

// WithLockTimeout bounds how long a claim waits for the fence row while
// another transaction holds it (for instance a previous holder paused in
// the middle of its transaction): past d the claim fails with
// ErrFenceBusy instead of waiting until that transaction ends. It is set
// with SET LOCAL in the same round trip as BEGIN, so it also applies to the
// writes of fn. d must be at least a millisecond. Default: no limit
// (Postgres's lock_timeout setting applies).
func WithLockTimeout(d time.Duration) Option {
	return func(s *Store) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: WithLockTimeout(%v): must be at least 1ms", ErrInvalidOption, d)
		}
		s.lockTimeout = d
		return nil
	}
}

// WithIdleTimeout makes Postgres end a guarded transaction's session when
// the transaction sits idle (no statement from the client) for longer than
// d: set idle_in_transaction_session_timeout with SET LOCAL, in the same
// round trip as BEGIN. A holder frozen in the middle of its transaction
// (SIGSTOP, VM freeze, partition) holds the fence row, and every later
// holder's claim waits for it; with this option the database rolls the
// frozen transaction back after d and the next holder proceeds. Pick d
// above the longest pause between two statements of a healthy fn, e.g. the
// lock's lease. d must be at least a millisecond. Default: off.
func WithIdleTimeout(d time.Duration) Option {
	return func(s *Store) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: WithIdleTimeout(%v): must be at least 1ms", ErrInvalidOption, d)
		}
		s.idleTimeout = d
		return nil
	}
}

// New returns a Store over db. The fencelock schema must be installed
// (migrations.Up); New does not check it, the first call that needs it
// returns ErrSchemaMissing.
func New(db DB, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, ErrNilDB
	}
	// A typed nil pointer in the interface is as unusable as nil.
	switch d := db.(type) {
	case *pgxpool.Pool:
		if d == nil {
			return nil, ErrNilDB
		}
	case *pgx.Conn:
		if d == nil {
			return nil, ErrNilDB
		}
	}
	s := &Store{db: db}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil Option", ErrInvalidOption)
		}
		if err := o(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Begin implements guard.Store: it starts a READ COMMITTED transaction,
// claims the fence for c.Resource and records c.Key, in one round trip.
// Use it through guard.Exec.
func (s *Store) Begin(ctx context.Context, c guard.Claim) (guard.Txn[pgx.Tx], error) {
	t, err := s.begin(ctx, c, "")
	if err != nil {
		return nil, err
	}
	return t, nil
}

// begin opens a claimed transaction; extra is more SQL (already quoted) to
// run in the same round trip, after the claim.
func (s *Store) begin(ctx context.Context, c guard.Claim, extra string) (*txn, error) {
	if err := checkClaim(c); err != nil {
		return nil, err
	}
	var b strings.Builder
	b.WriteString("BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE")
	if s.lockTimeout > 0 {
		b.WriteString(";SET LOCAL lock_timeout = ")
		b.WriteString(strconv.FormatInt(s.lockTimeout.Milliseconds(), 10))
	}
	if s.idleTimeout > 0 {
		b.WriteString(";SET LOCAL idle_in_transaction_session_timeout = ")
		b.WriteString(strconv.FormatInt(s.idleTimeout.Milliseconds(), 10))
	}
	b.WriteString(";SELECT fencelock.claim(")
	b.WriteString(quoteLiteral(c.Resource))
	b.WriteByte(',')
	b.WriteString(strconv.FormatInt(c.Token, 10))
	b.WriteByte(',')
	b.WriteString(quoteLiteral(c.Holder))
	if c.Key != "" {
		b.WriteByte(',')
		b.WriteString(quoteLiteral(c.Key))
	}
	b.WriteByte(')')
	if extra != "" {
		b.WriteByte(';')
		b.WriteString(extra)
	}
	return s.beginWith(ctx, b.String())
}

// beginWith runs the multi-statement begin query. For a pool or a conn the
// whole string is pgx's BeginQuery: one simple-protocol round trip that
// opens the transaction and claims, so the claim costs no round trip over
// a plain transaction. A refused claim leaves the transaction open and
// aborted; it is rolled back here so the connection goes back clean.
func (s *Store) beginWith(ctx context.Context, q string) (*txn, error) {
	switch db := s.db.(type) {
	case *pgxpool.Pool:
		pc, err := db.Acquire(ctx)
		if err != nil {
			return nil, mapError(err)
		}
		t, err := beginOnConn(ctx, pc.Conn(), q, pc.Release)
		return t, err
	case *pgx.Conn:
		return beginOnConn(ctx, db, q, func() {})
	default:
		// Unknown DB: BEGIN, then the claim; two round trips.
		tx, err := s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadWrite})
		if err != nil {
			return nil, mapError(err)
		}
		claim := q[strings.IndexByte(q, ';')+1:]
		if _, err := tx.Exec(ctx, claim); err != nil {
			_ = rollback(ctx, tx)
			return nil, mapError(err)
		}
		return &txn{tx: tx, release: func() {}}, nil
	}
}

func beginOnConn(ctx context.Context, conn *pgx.Conn, q string, release func()) (*txn, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: q})
	if err != nil {
		if !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			if _, rerr := conn.Exec(rctx, "ROLLBACK"); rerr != nil {
				// The pool destroys a connection that is not idle.
				_ = conn.PgConn().Close(rctx)
			}
			cancel()
		}
		release()
		return nil, mapError(err)
	}
	return &txn{tx: tx, release: release}, nil
}

// cleanupTimeout bounds a rollback that runs after the caller's context
// ended.
const cleanupTimeout = 5 * time.Second

func rollback(ctx context.Context, tx pgx.Tx) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return tx.Rollback(rctx)
}

// txn is an open, claimed transaction; it returns its connection to the
// pool once, after commit or rollback.
type txn struct {
	tx      pgx.Tx
	release func()
	once    sync.Once
}

func (t *txn) Tx() pgx.Tx { return t.tx }

func (t *txn) Commit(ctx context.Context) error {
	err := t.tx.Commit(ctx)
	if err != nil {
		// A failed COMMIT may leave the transaction open (e.g. ctx ended
		// before it was sent); make sure it is gone before the connection
		// goes back.
		_ = rollback(ctx, t.tx)
	}
	t.once.Do(t.release)
	return mapError(err)
}

func (t *txn) Rollback(ctx context.Context) error {
	err := t.tx.Rollback(ctx)
	t.once.Do(t.release)
	if err == pgx.ErrTxClosed {
		return nil
	}
	return mapError(err)
}

// checkClaim rejects what guard.NewClaim rejects, for callers that build a
// Claim by hand, and strings Postgres cannot store as text.
func checkClaim(c guard.Claim) error {
	switch {
	case c.Resource == "":
		return fmt.Errorf("%w: empty resource name", guard.ErrInvalidLease)
	case c.Token <= 0:
		return fmt.Errorf("%w: token must be > 0, got %d", guard.ErrInvalidLease, c.Token)
	case c.Holder == "":
		return fmt.Errorf("%w: empty holder", guard.ErrInvalidLease)
	}
	for _, f := range []struct{ what, s string }{{"resource", c.Resource}, {"holder", c.Holder}, {"idempotency key", c.Key}} {
		if err := checkText(f.what, f.s); err != nil {
			return err
		}
	}
	return nil
}

// checkText rejects strings that Postgres text cannot hold.
func checkText(what, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("%w: %s contains a NUL byte", ErrInvalidInput, what)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidInput, what)
	}
	return nil
}

// quoteLiteral quotes s as an escape-string literal (E'...'), which means
// the same whatever standard_conforming_strings says. s has no NUL byte
// (checkText).
func quoteLiteral(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 4)
	b.WriteString("E'")
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\'':
			b.WriteString("''")
		case '\\':
			b.WriteString(`\\`)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return b.String()
}
