package guardtest

import (
	"context"
	"slices"
	"testing"

	"github.com/fencelock/fencelock/guard"
)

// Harness is what the suite needs to drive one store implementation.
type Harness[Tx any] struct {
	// Open creates a fresh database with the store's schema installed,
	// dropped when t ends. The suite opens one for most checks and a
	// second one that it makes read-only.
	Open func(t testing.TB) Database[Tx]

	// Run opens the resumable run key of lease's resource on store (for
	// pgfence: store.(*pgfence.Store).Run(lease, key)).
	Run func(store guard.Store[Tx], lease guard.Lease, key string) Runner[Tx]

	// OnCommit, if set, queues a statement on tx, fn's transaction, to
	// be sent with its commit (ctx is the context fn received); the suite
	// then checks that queued statements commit with fn's writes and only
	// with them. A store without a commit queue leaves it nil.
	OnCommit func(ctx context.Context, tx Tx, sql string, args ...any) error

	// ErrNotOpen is what OnCommit's error matches for a transaction whose
	// Exec has ended (errors.Is); required with OnCommit.
	ErrNotOpen error

	// Facts reads what the store recorded and puts a database in the
	// states the contract covers, in the store's own terms: the suite
	// knows nothing of any store's schema. Required.
	Facts Facts[Tx]

	// Deprecated: set OnCommit and ErrNotOpen. CommitQueue alone no
	// longer runs the check: the suite fails, naming OnCommit.
	CommitQueue bool
}

// Facts is what the suite asks of a store's own records and settings,
// through db, the Database it is checking (its own connection, never the
// store's). Every field but Protect is required.
type Facts[Tx any] struct {
	// Token returns the newest token the store recorded for resource, 0
	// for none.
	Token func(ctx context.Context, db Database[Tx], resource string) (int64, error)
	// KeyApplied reports whether the store recorded key as applied for
	// resource.
	KeyApplied func(ctx context.Context, db Database[Tx], resource, key string) (bool, error)
	// Fenced counts the resources whose names start with prefix that the
	// store recorded a token for.
	Fenced func(ctx context.Context, db Database[Tx], prefix string) (int64, error)
	// MakeReadOnly makes db refuse writes in every session opened after
	// it, as a standby or a read-only default does.
	MakeReadOnly func(ctx context.Context, db Database[Tx]) error
	// Uninstall removes what the store needs from db, as in a database
	// never migrated.
	Uninstall func(ctx context.Context, db Database[Tx]) error
	// Protect makes table refuse writes from a transaction that neither
	// checked nor claimed a fence, as the store's guard.ErrNotClaimed
	// says; nil for a store that protects no tables (the check is then
	// skipped).
	Protect func(ctx context.Context, db Database[Tx], table string) error
}

// missing names the required Facts left nil.
func (f Facts[Tx]) missing() []string {
	var out []string
	for name, set := range map[string]bool{
		"Token": f.Token != nil, "KeyApplied": f.KeyApplied != nil, "Fenced": f.Fenced != nil,
		"MakeReadOnly": f.MakeReadOnly != nil, "Uninstall": f.Uninstall != nil,
	} {
		if !set {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// Database is one test database as the suite sees it.
type Database[Tx any] interface {
	// NewStore returns a new store over a new connection pool to the
	// database, as another process would have: its own connections and
	// caches. Connections opened after the database was made read-only
	// see it read-only.
	NewStore(t testing.TB) guard.Store[Tx]
	// Exec runs one statement outside any guarded transaction.
	Exec(ctx context.Context, sql string, args ...any) error
	// QueryInt runs a query that returns one row with one integer column.
	QueryInt(ctx context.Context, sql string, args ...any) (int64, error)
	// TxExec runs one statement in tx, fn's transaction handle.
	TxExec(ctx context.Context, tx Tx, sql string, args ...any) error
	// TxQueryInt runs a one-integer query in tx.
	TxQueryInt(ctx context.Context, tx Tx, sql string, args ...any) (int64, error)
	// TxCommit commits tx through the handle's own API (tx.Commit), as an
	// fn that does not know better would.
	TxCommit(ctx context.Context, tx Tx) error
}

// Runner is a resumable run as pgfence's and sqlfence's Run have it.
type Runner[Tx any] interface {
	Resume(ctx context.Context) (cursor string, finished bool, err error)
	Step(ctx context.Context, newCursor string, fn func(ctx context.Context, tx Tx) error) error
	Finish(ctx context.Context) error
}

// Advancer is implemented by stores that can claim a fence right after the
// lock is acquired (pgfence's and sqlfence's Advance); the suite checks it
// when the store has it.
type Advancer interface {
	Advance(ctx context.Context, lease guard.Lease) error
}

// Lease is a fixed lease: what a lock looks like to guard, and the view a
// paused process has of its lock (it has not noticed the expiry yet).
type Lease struct {
	Resource string
	Tok      int64
	Who      string
}

func (l Lease) Name() string   { return l.Resource }
func (l Lease) Token() int64   { return l.Tok }
func (l Lease) Holder() string { return l.Who }

// losable is a lease whose loss the test decides (Done closes).
type losable struct {
	Lease
	done chan struct{}
}

func (l *losable) Done() <-chan struct{} { return l.done }
func (l *losable) Err() error {
	select {
	case <-l.done:
		return errLost
	default:
		return nil
	}
}
