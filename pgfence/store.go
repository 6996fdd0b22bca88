package pgfence

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is what Store needs from Postgres. *pgxpool.Pool and *pgx.Conn satisfy
// it (a *pgx.Conn must not be used by two goroutines at once, as always).
// For those two the begin and the commit are one round trip each (pgx
// pipelines); any other implementation gets a correct but slower path
// (the advance, BEGIN, the check, ..., the claim, COMMIT: three round
// trips more).
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
	_ guard.Store[pgx.Tx] = runStore{}
	_ guard.ErrorMapper   = runStore{}
)

// Store is the Postgres backend of guard: *Store implements
// guard.Store[pgx.Tx]. It is safe for concurrent use when its DB is (a
// pool is). Create it with New.
type Store struct {
	db          DB
	lockTimeout time.Duration
	idleTimeout time.Duration
	// openSQL is sqlOpen with the settings of the options, whose text
	// values follow open's parameters (nil when unset).
	openSQL         string
	lockTimeoutText []byte
	idleTimeoutText []byte
	// The statements of a guarded transaction (openSQL as stOpen), and
	// whether to prepare them on direct connections (see prepare.go).
	stAdvance, stBegin, stOpen, stClose, stCommit sqlStmt
	prepare                                       bool
	// adv lets a transaction skip advance when this Store has already
	// seen its claim stored.
	adv pgcore.Cache
	// observers are reported every Exec through the Store (WithObserver).
	observers []guard.Observer
}

// New returns a Store over db. The fencelock schema must be installed
// (migrations.Up); New does not check it, the first call that needs it
// returns guard.ErrSchemaMissing.
func New(db DB, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, errNilDB
	}
	// A typed nil pointer in the interface is as unusable as nil.
	switch d := db.(type) {
	case *pgxpool.Pool:
		if d == nil {
			return nil, errNilDB
		}
	case *pgx.Conn:
		if d == nil {
			return nil, errNilDB
		}
	}
	s := &Store{db: db, prepare: true}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil Option", guard.ErrInvalidOption)
		}
		if err := o(s); err != nil {
			return nil, err
		}
	}
	if s.lockTimeout > 0 {
		s.lockTimeoutText = strconv.AppendInt(nil, s.lockTimeout.Milliseconds(), 10)
	}
	if s.idleTimeout > 0 {
		s.idleTimeoutText = strconv.AppendInt(nil, s.idleTimeout.Milliseconds(), 10)
	}
	var params int
	s.openSQL, params = openSQL(s.lockTimeout > 0, s.idleTimeout > 0)
	s.stAdvance = newSQLStmt("advance", sqlAdvance, advanceOIDs)
	s.stBegin = newSQLStmt("begin", sqlBegin, nil)
	s.stOpen = newSQLStmt("open", s.openSQL, openOIDs[:params])
	s.stClose = newSQLStmt("close", sqlClose, closeOIDs)
	s.stCommit = newSQLStmt("commit", sqlCommit, nil)
	return s, nil
}

// Begin implements guard.Store: in one round trip it records the token
// (fencelock.advance, committed on its own before BEGIN), starts a READ
// COMMITTED transaction and checks the token and the key (fencelock.open,
// no lock), so a stale token, an applied key or a read-only database
// fails before fn writes. The returned transaction's Commit claims the
// fence and records the key (fencelock.close) and commits, in one round
// trip. Use it through guard.Exec.
func (s *Store) Begin(ctx context.Context, c guard.Claim) (guard.Txn[pgx.Tx], error) {
	t, err := s.begin(ctx, c, runOp{})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// MapError is MapError as a method, so that guard.Exec translates the
// errors fn returns (guard.ErrorMapper).
func (s *Store) MapError(err error) error { return mapError(err) }

// runOp is what a transaction does to a resumable run: none (key ""),
// move its cursor, or finish it.
type runOp struct {
	key    string
	cursor string
	finish bool
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
