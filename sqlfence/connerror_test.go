package sqlfence_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/fencelock/fencelock/testenv"
)

// A connection database/sql cannot make through pgx's driver (a wrong
// password, a dead port, a missing database, a role over its connection
// limit) fails every call that connects with one line: sqlfence's prefix
// and the step, the server's answer (not pgx's attempt per sslmode),
// where it connected, and the fix; errors.As still finds pgx's errors.
// (lib/pq: examples/sqlx-gorm, whose module has it.)
func TestConnRefusedMessages(t *testing.T) {
	msgtest.WalkSQLRefusals(t, "pgx", msgtest.Refusals(t, testenv.NewDB(t), "prefer"), func(t *testing.T, r msgtest.Refusal, err error) {
		r.CheckPgxChain(t, err)
	})
}

// The password changes while a Store runs: its schema is checked and its
// claim seen stored, so each call's own connection (BeginTx, Advance's and
// Prune's statement) is what the server refuses, and the message is the
// same as at the first call.
func TestConnRefusedAfterPasswordChange(t *testing.T) {
	tdb, _ := newDB(t)
	user, url := tdb.NewPasswordUser(t, "old-password")
	_, err := tdb.Pool.Exec(testCtx(t), "GRANT USAGE ON SCHEMA fencelock TO "+user+"; GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO "+user)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	db := openDB(t, "pgx", url)
	db.SetMaxIdleConns(0) // every call connects
	s := newStore(t, db)
	noop := func(context.Context, *sql.Tx) error { return nil }
	if _, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "rotate", Tok: 1, Who: "a"}, noop); err != nil {
		t.Fatal(err)
	}
	if _, err := tdb.Pool.Exec(ctx, "ALTER ROLE "+user+" PASSWORD 'new-password'"); err != nil {
		t.Fatal(err)
	}
	r := msgtest.WrongPassword(tdb.Server.Addr, user, tdb.Name)
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "rotate", Tok: 1, Who: "a"}, noop)
	msgtest.CheckRefusal(t, "Exec", err, "sqlfence: begin: ", r)
	msgtest.WalkRefused(t, ctx, msgtest.StoreTarget[*sql.Tx, sqlfence.Run](s), "sqlfence", r)
}
