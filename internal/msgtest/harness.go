package msgtest

import (
	"context"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/fencelock/fencelock/pgstore"
)

// Harness is guard's store contract (guardtest) for a Postgres store of
// this module: open makes a database with the fencelock schema and a view
// of it; the runs, the commit queue and the schema's facts are the
// stores' shared ones.
func Harness[Tx any](open func(t testing.TB) guardtest.Database[Tx]) guardtest.Harness[Tx] {
	return guardtest.Harness[Tx]{
		Open: open,
		Run: func(s guard.Store[Tx], l guard.Lease, key string) guardtest.Runner[Tx] {
			return s.(interface {
				Run(guard.Lease, string) pgstore.Run[Tx]
			}).Run(l, key)
		},
		OnCommit:   pgcore.OnCommit[Tx],
		ErrNotOpen: pgcore.ErrNotGuardedTx,
		Facts:      Facts[Tx](),
	}
}

// Facts are guardtest's Facts of the fencelock schema.
func Facts[Tx any]() guardtest.Facts[Tx] {
	return guardtest.Facts[Tx]{
		Token: func(ctx context.Context, db guardtest.Database[Tx], resource string) (int64, error) {
			return db.QueryInt(ctx, "SELECT coalesce((SELECT token FROM fencelock.fence WHERE resource = $1), 0)", resource)
		},
		KeyApplied: func(ctx context.Context, db guardtest.Database[Tx], resource, key string) (bool, error) {
			n, err := db.QueryInt(ctx, "SELECT count(*) FROM fencelock.applied WHERE resource = $1 AND key = $2", resource, key)
			return n == 1, err
		},
		Fenced: func(ctx context.Context, db guardtest.Database[Tx], prefix string) (int64, error) {
			return db.QueryInt(ctx, "SELECT count(*) FROM fencelock.fence WHERE starts_with(resource, $1)", prefix)
		},
		MakeReadOnly: func(ctx context.Context, db guardtest.Database[Tx]) error {
			return db.Exec(ctx, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_read_only = on', current_database()); END $$`)
		},
		Uninstall: func(ctx context.Context, db guardtest.Database[Tx]) error {
			return db.Exec(ctx, "DROP SCHEMA fencelock CASCADE")
		},
		// pgfence's Protect, without a store: the trigger it installs.
		Protect: func(ctx context.Context, db guardtest.Database[Tx], table string) error {
			return db.Exec(ctx, "CREATE TRIGGER fencelock_protect BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON "+table+
				" FOR EACH STATEMENT EXECUTE FUNCTION fencelock.protect_guard()")
		},
	}
}
