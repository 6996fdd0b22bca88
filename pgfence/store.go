package pgfence

import (
	"context"
	"errors"
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
// For those two the check rides in the same round trip as BEGIN and the
// claim in the same round trip as COMMIT; any other implementation gets a
// correct but slower path (the advance, BEGIN, the check, ..., the claim,
// COMMIT: three round trips more).
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
	// adv lets a transaction skip advance when this Store has already
	// seen its claim stored.
	adv advanced
}

// Option configures a Store.
type Option func(*Store) error

// WithLockTimeout bounds how long a guarded transaction waits for a lock:
// the claim at commit waiting for the fence row (held only by commits in
// flight, by Advance, and by transactions that wrote to a table protected
// with Protect, such as a previous holder frozen after such a write), and
// the writes of fn. Past d the wait fails, for the fence row with
// ErrFenceBusy, instead of lasting until the other transaction ends; the
// transaction is rolled back. It is set with SET LOCAL in the round trip
// of BEGIN. d must be at least a millisecond. Default: no limit
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
// round trip as BEGIN. A guarded transaction takes the fence row lock only
// in its commit, so a holder frozen in the middle of it (SIGSTOP, VM
// freeze, partition) blocks no one, except after writing to a table
// protected with Protect: the protect trigger locks the fence row until
// the transaction ends, and the next holder's claim waits for it. With
// this option the database rolls such a frozen transaction back after d
// (and frees its connection and row locks). Pick d above the longest pause
// between two statements of a healthy fn, e.g. the lock's lease. d must be
// at least a millisecond. Default: off.
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

// Begin implements guard.Store: in one round trip it records the token
// (fencelock.advance, committed on its own before BEGIN), starts a READ
// COMMITTED transaction and checks the token and the key (fencelock.open,
// no lock), so a stale token or an applied key fails before fn writes.
// The returned transaction's Commit claims the fence and records the key
// (fencelock.close) and commits, in one round trip. Use it through
// guard.Exec.
func (s *Store) Begin(ctx context.Context, c guard.Claim) (guard.Txn[pgx.Tx], error) {
	t, err := s.begin(ctx, c, runOp{})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// runOp is what a transaction does to a resumable run: none (key ""),
// move its cursor, or finish it.
type runOp struct {
	key    string
	cursor string
	finish bool
}

// begin opens a checked transaction: fencelock.open in the begin round
// trip, fencelock.close in the commit round trip (one call each, for the
// token, the key and the run).
//
// Why the claim waits for the commit: claim locks the fence row until the
// transaction ends. Taken at BEGIN, a holder frozen in the middle of its
// transaction (SIGSTOP, GC, VM freeze) would keep every later holder
// waiting, which is the failure this library exists for. Taken in the
// round trip that carries COMMIT (and by advance, in its own little
// transaction before BEGIN), the lock lasts only as long as those, and the
// invariant holds all the same: every commit checks its
// token under the fence row lock in the committing transaction, so
// committed tokens per resource never decrease in commit order.
func (s *Store) begin(ctx context.Context, c guard.Claim, run runOp) (*txn, error) {
	if err := checkClaim(c); err != nil {
		return nil, err
	}
	// advance runs and commits on its own before BEGIN (a COMMIT ends the
	// implicit transaction of a multi-statement query): the token is
	// recorded before fn reads anything, so an older holder that read
	// before it froze cannot commit over what this one reads. When the
	// token is already stored it only reads; when it is stale it fails
	// and Postgres skips the rest, BEGIN included. Once this Store has
	// seen the claim stored it sends no advance at all (see advanced).
	// The arguments: resource, token, holder, then key and run key only
	// when there are some (NULL is their default). open checks the run
	// only for a step: finishing a finished run is a no-op, not an error.
	args := claimArgs(guard.Claim{Resource: c.Resource, Token: c.Token, Holder: c.Holder})
	advance := ""
	if !s.adv.has(c.Resource, c.Token, c.Holder) {
		advance = "SELECT fencelock.advance(" + args + ")"
	}
	openArgs, closeArgs := args, args
	switch {
	case run.finish:
		if c.Key != "" {
			openArgs += "," + quoteLiteral(c.Key)
		}
		closeArgs += "," + literalOrNull(c.Key) + "," + quoteLiteral(run.key) + ",NULL,true"
	case run.key != "":
		openArgs += "," + literalOrNull(c.Key) + "," + quoteLiteral(run.key)
		closeArgs += "," + literalOrNull(c.Key) + "," + quoteLiteral(run.key) + "," + quoteLiteral(run.cursor)
	case c.Key != "":
		openArgs += "," + quoteLiteral(c.Key)
		closeArgs += "," + quoteLiteral(c.Key)
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
	b.WriteString(";SELECT fencelock.open(")
	b.WriteString(openArgs)
	b.WriteByte(')')
	claim := "SELECT fencelock.close(" + closeArgs + ")"
	cache := advance != "" && s.autocommits()
	t, err := s.beginWith(ctx, advance, b.String(), claim)
	if cache && (err == nil || errors.Is(err, guard.ErrAlreadyApplied) || errors.Is(err, ErrRunFinished)) {
		// advance committed: the begin went through, or failed on a check
		// that runs after it (FL001 may come from advance itself).
		s.adv.add(c.Resource, c.Token, c.Holder)
	}
	return t, err
}

// literalOrNull is s quoted, or NULL for "".
func literalOrNull(s string) string {
	if s == "" {
		return "NULL"
	}
	return quoteLiteral(s)
}

// claimArgs is the argument list of advance, open and close (resource,
// token, holder[, key]), as literals.
func claimArgs(c guard.Claim) string {
	var b strings.Builder
	b.WriteString(quoteLiteral(c.Resource))
	b.WriteByte(',')
	b.WriteString(strconv.FormatInt(c.Token, 10))
	b.WriteByte(',')
	b.WriteString(quoteLiteral(c.Holder))
	if c.Key != "" {
		b.WriteByte(',')
		b.WriteString(quoteLiteral(c.Key))
	}
	return b.String()
}

// beginWith runs advance (in its own transaction; none when advance is
// "") and the multi-statement begin query q; claim is the SQL the commit runs before COMMIT. For a pool
// or a conn, advance, COMMIT and q are pgx's BeginQuery (one
// simple-protocol round trip that records the token, opens the
// transaction and prechecks) and the commit is one more (claim and
// COMMIT), so the fence costs no round trip over a plain transaction. A refused precheck leaves
// the transaction open and aborted; it is rolled back here so the
// connection goes back clean.
func (s *Store) beginWith(ctx context.Context, advance, q, claim string) (*txn, error) {
	switch db := s.db.(type) {
	case *pgxpool.Pool:
		pc, err := db.Acquire(ctx)
		if err != nil {
			return nil, mapError(err)
		}
		return beginOnConn(ctx, pc.Conn(), withAdvance(advance, q), claim, pc.Release)
	case *pgx.Conn:
		return beginOnConn(ctx, db, withAdvance(advance, q), claim, func() {})
	default:
		// Unknown DB: the advance, BEGIN, then open; at commit close,
		// then COMMIT. Three round trips more, same semantics.
		if advance != "" {
			if _, err := s.db.Exec(ctx, advance); err != nil {
				return nil, mapError(err)
			}
		}
		tx, err := s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadWrite})
		if err != nil {
			return nil, mapError(err)
		}
		check := q[strings.IndexByte(q, ';')+1:]
		if _, err := tx.Exec(ctx, check); err != nil {
			_ = rollback(ctx, tx)
			return nil, mapError(err)
		}
		return &txn{tx: tx, claim: claim, release: func() {}}, nil
	}
}

// autocommits reports whether a statement s.db.Exec runs outside a
// transaction commits on its own: true for a pool, and for a conn with no
// transaction open. Only then does the advance cache trust that an
// advance is stored; a DB of another kind may run it inside a
// transaction of its own that is later rolled back.
func (s *Store) autocommits() bool {
	switch db := s.db.(type) {
	case *pgxpool.Pool:
		return true
	case *pgx.Conn:
		return db.PgConn().TxStatus() == 'I'
	}
	return false
}

// withAdvance prefixes the begin query q with advance, committed on its
// own.
func withAdvance(advance, q string) string {
	if advance == "" {
		return q
	}
	return advance + ";COMMIT;" + q
}

func beginOnConn(ctx context.Context, conn *pgx.Conn, q, claim string, release func()) (*txn, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: q})
	if err != nil {
		rollbackConn(ctx, conn)
		release()
		return nil, mapError(err)
	}
	return &txn{tx: tx, conn: conn, claim: claim, release: release}, nil
}

// rollbackConn ends whatever transaction is left open on conn after a
// failed statement, so the connection goes back to the pool idle; if that
// fails, it closes the connection (the pool drops a connection that is
// closed or not idle).
func rollbackConn(ctx context.Context, conn *pgx.Conn) {
	if conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if _, err := conn.Exec(rctx, "ROLLBACK"); err != nil {
		_ = conn.PgConn().Close(rctx)
	}
}

// cleanupTimeout bounds a rollback that runs after the caller's context
// ended.
const cleanupTimeout = 5 * time.Second

func rollback(ctx context.Context, tx pgx.Tx) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return tx.Rollback(rctx)
}

// txn is an open, checked transaction; it returns its connection to the
// pool once, after commit or rollback.
type txn struct {
	tx pgx.Tx
	// conn is the connection tx runs on, for the one-round-trip commit;
	// nil for a DB other than a pool or a conn.
	conn *pgx.Conn
	// claim is the SQL that claims the fence (and moves a run's cursor)
	// just before COMMIT.
	claim string
	// ended is set once Commit or Rollback has run: tx must not be used
	// again, because Commit ends the transaction behind pgx's back.
	ended   bool
	release func()
	once    sync.Once
}

func (t *txn) Tx() pgx.Tx { return t.tx }

// Commit claims the fence and commits. On a pool or a conn both go in one
// simple-protocol round trip: "SELECT fencelock.close(...); COMMIT". If the
// claim is refused, Postgres skips the rest of the string and the
// transaction is left aborted; it is rolled back (one more round trip, on
// this failure path only) and the refusal returned, mapped.
//
// The COMMIT goes through tx's connection, not through tx, so pgx's Tx
// value would still believe the transaction is open; closeTx closes it
// without a round trip, so that fn's tx, if kept past Exec, fails with
// pgx.ErrTxClosed instead of running on a connection back in the pool.
// The connection, idle after COMMIT or ROLLBACK, goes back to the pool.
func (t *txn) Commit(ctx context.Context) error {
	if t.ended {
		return pgx.ErrTxClosed
	}
	t.ended = true
	defer t.once.Do(t.release)
	if t.conn == nil {
		return t.commitGeneric(ctx)
	}
	defer t.closeTx()
	tag, err := t.conn.Exec(ctx, t.claim+";COMMIT")
	if err != nil {
		// Refused (FL001, FL003, FL004, lock timeout...): the transaction
		// is aborted, nothing was committed. Or ctx ended before the
		// query went out: nothing was sent. Or the connection broke while
		// the commit was in flight: pgconn has closed it, and whether the
		// server committed is unknown.
		rollbackConn(ctx, t.conn)
		return mapError(err)
	}
	if tag.String() != "COMMIT" {
		// "ROLLBACK": the transaction had failed before, nothing committed.
		rollbackConn(ctx, t.conn)
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// closeTx marks t.tx closed once the transaction was ended on its
// connection directly. pgx's Commit with a context that is already done
// sends nothing (pgconn checks the context before it writes) and marks the
// Tx closed; on an idle connection it leaves the connection alone. On a
// closed connection the Tx fails anyway.
func (t *txn) closeTx() {
	if t.conn.IsClosed() || t.conn.PgConn().TxStatus() != 'I' {
		return
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_ = t.tx.Commit(done)
}

func (t *txn) commitGeneric(ctx context.Context) error {
	if _, err := t.tx.Exec(ctx, t.claim); err != nil {
		_ = rollback(ctx, t.tx)
		return mapError(err)
	}
	err := t.tx.Commit(ctx)
	if err != nil {
		// A failed COMMIT may leave the transaction open (e.g. ctx ended
		// before it was sent); make sure it is gone.
		_ = rollback(ctx, t.tx)
	}
	return mapError(err)
}

func (t *txn) Rollback(ctx context.Context) error {
	if t.ended {
		return nil
	}
	t.ended = true
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
