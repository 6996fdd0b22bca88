package pgfence_test

import (
	"context"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A connection the pool cannot make (a wrong password, a dead port, a
// missing database, a role over its connection limit) fails every call
// that connects with one line: pgfence's prefix and the step, the server's
// answer (not pgx's attempt per sslmode, the refused TLS first), where it
// connected, and the fix; errors.As still finds pgx's errors. The pool
// and a DB that is neither a pool nor a conn (the generic path) say the
// same.
func TestConnRefusedMessages(t *testing.T) {
	db := testenv.NewDB(t)
	ctx := testCtx(t)
	for _, r := range msgtest.Refusals(t, db, "prefer") {
		t.Run(r.Name, func(t *testing.T) {
			pool, err := pgxpool.New(ctx, r.URL)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			for name, s := range map[string]*pgfence.Store{"pool": newStore(t, pool), "generic": newStore(t, wrappedDB{pool})} {
				t.Run(name, func(t *testing.T) {
					msgtest.WalkRefused(t, ctx, msgtest.StoreTarget[pgx.Tx, pgfence.Run](s), "pgfence", r)
					msgtest.CheckRefusal(t, "Protect", s.Protect(ctx, "stock"), "pgfence: protect: ", r)
					msgtest.CheckRefusal(t, "Protect for a resource", s.Protect(ctx, "stock", pgfence.ForResource("r")), "pgfence: protect: ", r)
					msgtest.CheckRefusal(t, "Unprotect", s.Unprotect(ctx, "stock"), "pgfence: unprotect: ", r)

					_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(context.Context, pgx.Tx) error { return nil })
					r.CheckPgxChain(t, err)
				})
			}
		})
	}
}

// The password changes while a Store runs: its schema is checked and its
// claim seen stored, so each call's own connection is what the server
// refuses (the pool's Acquire at begin, Advance's and Prune's statement,
// Protect's), and the message is the same as at the first call; so are
// the advance and the BeginTx of a DB that is neither a pool nor a conn
// (split: its advance goes to a pool that still has its connection).
func TestConnRefusedAfterPasswordChange(t *testing.T) {
	db := newDB(t)
	user, url := db.NewPasswordUser(t, "old-password")
	mustExec(t, db.Pool, "GRANT USAGE ON SCHEMA fencelock TO "+user)
	mustExec(t, db.Pool, "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO "+user)
	ctx := testCtx(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	noop := func(context.Context, pgx.Tx) error { return nil }
	stores := map[string]*pgfence.Store{
		"pool":    newStore(t, pool),
		"generic": newStore(t, wrappedDB{pool}),
		"split":   newStore(t, splitDB{wrappedDB{db.Pool}, pool}),
	}
	for name, s := range stores {
		if _, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "rotate-" + name, Tok: 1, Who: "a"}, noop); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	mustExec(t, db.Pool, "ALTER ROLE "+user+" PASSWORD 'new-password'")
	pool.Reset()
	r := msgtest.WrongPassword(db.Server.Addr, user, db.Name)
	for name, s := range stores {
		_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "rotate-" + name, Tok: 1, Who: "a"}, noop)
		msgtest.CheckRefusal(t, name+": Exec", err, "pgfence: begin: ", r)
	}
	s := stores["pool"]
	msgtest.WalkRefused(t, ctx, msgtest.StoreTarget[pgx.Tx, pgfence.Run](s), "pgfence", r)
	msgtest.CheckRefusal(t, "Protect", s.Protect(ctx, "stock"), "pgfence: protect: ", r)
	msgtest.CheckRefusal(t, "Protect for a resource", s.Protect(ctx, "stock", pgfence.ForResource("r")), "pgfence: protect: ", r)
	msgtest.CheckRefusal(t, "Unprotect", s.Unprotect(ctx, "stock"), "pgfence: unprotect: ", r)
}

// splitDB runs Exec and QueryRow on one pool and begins its transactions
// on another.
type splitDB struct {
	wrappedDB
	begin *pgxpool.Pool
}

func (d splitDB) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	return d.begin.BeginTx(ctx, o)
}
