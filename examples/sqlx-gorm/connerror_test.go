package inventory_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/lib/pq"
)

// A connection lib/pq cannot make (a wrong password, a dead port, a
// missing database, a role over its connection limit) fails every
// sqlfence call that connects with one line, as over pgx's driver:
// sqlfence's prefix and the step, the server's answer, where it connected
// (read from the connection string, since lib/pq's errors do not say),
// and the fix; errors.As still finds lib/pq's *pq.Error.
func TestConnRefusedMessagesLibPQ(t *testing.T) {
	db := testenv.NewDB(t)
	ctx := testCtx(t)
	for _, r := range msgtest.Refusals(t, db, "disable") {
		r := r.Unaddressed()
		t.Run(r.Name, func(t *testing.T) {
			s, err := sqlfence.New(openDB(t, "postgres", r.URL))
			if err != nil {
				t.Fatal(err)
			}
			msgtest.WalkRefused(t, ctx, msgtest.StoreTarget[*sql.Tx, *sqlfence.Run](s), "sqlfence", r)

			_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(context.Context, *sql.Tx) error { return nil })
			var pqErr *pq.Error
			if got := errors.As(err, &pqErr); got != (r.Code != "") || got && string(pqErr.Code) != r.Code {
				t.Errorf("errors.As(*pq.Error) = %v (%v), want SQLSTATE %q", got, pqErr, r.Code)
			}
		})
	}
}
