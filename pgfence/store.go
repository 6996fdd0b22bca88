package pgfence

import (
	"context"
	"strconv"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/fencelock/fencelock/pgstore"
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

	_ guard.Store[pgx.Tx]      = (*Store)(nil)
	_ guard.ErrorMapper        = (*Store)(nil)
	_ guard.ObservedStore      = (*Store)(nil)
	_ pgcore.BeginFunc[pgx.Tx] = (*Store)(nil).beginOp
)

// Store is the Postgres backend of guard: *Store implements
// guard.Store[pgx.Tx]. It is safe for concurrent use when its DB is (a
// pool is). Create it with New.
type Store struct {
	// Core is what both Postgres stores do alike (package pgstore):
	// Advance, Prune, Observers and MapError are its methods. New sets it.
	pgstore.Core

	db DB
	// core holds the options, the claim cache, and runs, Advance and
	// Prune (internal/pgcore, shared with sqlfence).
	core pgcore.Core
	// openSQL is sqlOpen with the settings of the options, whose text
	// values follow open's parameters (nil when unset).
	openSQL         string
	lockTimeoutText []byte
	idleTimeoutText []byte
	// The statements of a guarded transaction (openSQL as stOpen), and
	// whether to prepare them on direct connections (see prepare.go).
	stAdvance, stBegin, stOpen, stOpenPlain, stLock, stCheck, stClose, stCommit sqlStmt
	prepare                                                                     bool
}

// New returns a Store over db. The fencelock schema must be installed
// (migrations.Up), at the version this fencelock needs or newer. New does
// not check it: the first call that needs it does, once per Store (one
// round trip), and until the schema is migrated every call fails with an
// error that matches guard.ErrSchemaMissing (guard.ErrSchemaOutdated for
// an older schema) and names the versions and the command that migrates
// it.
// opts are package pgstore's (pgstore.WithLockTimeout, …).
func New(db DB, opts ...pgstore.Option) (*Store, error) {
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
	settings, err := pgstore.Apply(opts...)
	if err != nil {
		return nil, err
	}
	s := &Store{db: db}
	s.Core, s.core.Settings = &s.core, settings
	s.core.Name, s.core.Driver, s.core.Autocommits, s.prepare = "pgfence", driver{db}, s.autocommits, !s.core.Unprepared
	s.core.Target = pgcore.PgxTarget(db)
	lockTimeout, idleTimeout := s.core.LockTimeout, s.core.IdleTimeout
	if lockTimeout > 0 {
		s.lockTimeoutText = strconv.AppendInt(nil, lockTimeout.Milliseconds(), 10)
	}
	if idleTimeout > 0 {
		s.idleTimeoutText = strconv.AppendInt(nil, idleTimeout.Milliseconds(), 10)
	}
	var params int
	s.openSQL, params = openSQL(sqlOpen, lockTimeout > 0, idleTimeout > 0)
	openPlain, _ := openSQL(sqlOpenPlain, lockTimeout > 0, idleTimeout > 0)
	s.stOpenPlain = newSQLStmt("open", openPlain, openOIDs[:params])
	s.stAdvance = newSQLStmt("advance", sqlAdvance, advanceOIDs)
	s.stBegin = newSQLStmt("begin", sqlBegin, nil)
	s.stOpen = newSQLStmt("open", s.openSQL, openOIDs[:params])
	s.stLock = newSQLStmt("lock", sqlLock, lockOIDs)
	s.stCheck = newSQLStmt("close", sqlCheck, checkOIDs)
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
	return s.beginOp(ctx, c, pgcore.RunOp{})
}

// beginOp is Begin for a run's step or finish too.
func (s *Store) beginOp(ctx context.Context, c guard.Claim, op pgcore.RunOp) (guard.Txn[pgx.Tx], error) {
	t, err := s.begin(ctx, c, op)
	if err != nil {
		return nil, s.core.ExplainPermission(ctx, err)
	}
	return t, nil
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
