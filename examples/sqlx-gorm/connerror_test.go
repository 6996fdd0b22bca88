package inventory_test

import (
	"errors"
	"testing"

	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/testenv"
	"github.com/lib/pq"
)

// A connection lib/pq cannot make (a wrong password, a dead port, a
// missing database, a role over its connection limit) fails every
// sqlfence call that connects with one line, as over pgx's driver:
// sqlfence's prefix and the step, the server's answer (no server beyond
// what it names, or the dial's address: lib/pq's errors do not say where
// they came from), and the fix; errors.As still finds lib/pq's *pq.Error.
func TestConnRefusedMessagesLibPQ(t *testing.T) {
	var refusals []msgtest.Refusal
	for _, r := range msgtest.Refusals(t, testenv.NewDB(t), "disable") {
		refusals = append(refusals, r.Unaddressed())
	}
	msgtest.WalkSQLRefusals(t, "postgres", refusals, func(t *testing.T, r msgtest.Refusal, err error) {
		var pqErr *pq.Error
		if got := errors.As(err, &pqErr); got != (r.Code != "") || got && string(pqErr.Code) != r.Code {
			t.Errorf("errors.As(*pq.Error) = %v (%v), want SQLSTATE %q", got, pqErr, r.Code)
		}
	})
}
