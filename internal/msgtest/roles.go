package msgtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/testenv"
)

// WalkMissingGrants checks, for each of the grants docs/operations.md
// gives an application role that the role can lack alone (USAGE on the
// schema, EXECUTE on its functions), that a role without it is refused by
// guard.Exec, Advance and Prune with one message: the store's name, the
// role, what it lacks, and the statements the schema's owner runs in the
// database it names, with the server's 42501 still in the chain. Run as
// printed (by db's user, the owner, in that database), the statements fix
// the role, and the three calls then succeed. open makes the store name
// over db's database as the role whose URL it gets.
func WalkMissingGrants[Tx any, R Runs[Tx], S Store[Tx, R]](t *testing.T, db *testenv.DB, name string, open func(t *testing.T, roleURL string) S) {
	for _, tc := range []struct {
		name  string
		skip  int
		lacks string
	}{
		{"no USAGE", 0, "USAGE on schema fencelock"},
		{"no EXECUTE", 1, "EXECUTE on function fencelock."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			role, roleURL := NewAppRole(t, db, tc.skip)
			app := open(t, roleURL)
			var owner, dbname string
			if err := db.Pool.QueryRow(ctx, "SELECT current_user, current_database()").Scan(&owner, &dbname); err != nil {
				t.Fatal(err)
			}
			a := guardtest.Lease{Resource: "perm", Tok: 7, Who: "a"}
			noop := func(context.Context, Tx) error { return nil }
			_, execErr := guard.Exec(ctx, app, a, noop)
			advErr := app.Advance(ctx, a)
			_, pruneErr := app.Prune(ctx, 0)
			for what, err := range map[string]error{"Exec": execErr, "Advance": advErr, "Prune": pruneErr} {
				Check(t, what, err, guard.ErrPermission, "lacks")
				wantIn(t, what, err, fmt.Sprintf("%s: role %q lacks %s", name, role, tc.lacks))
				wantIn(t, what, err, fmt.Sprintf(", so nothing was written: as the schema's owner (role %q), run in database %q: psql -U ", owner, dbname))
				var state interface{ SQLState() string }
				if !errors.As(err, &state) || state.SQLState() != "42501" {
					t.Errorf("%s: the server's 42501 is not in the chain: %v", what, err)
				}
			}
			fix := ParsePsql(t, execErr.Error())
			if fix.User != owner || fix.Database != dbname {
				t.Errorf("the fix runs as %q in %q, want %q in %q", fix.User, fix.Database, owner, dbname)
			}
			for _, stmt := range fix.SQL { // the owner's session, in that database
				if _, err := db.Pool.Exec(ctx, stmt); err != nil {
					t.Fatalf("the fix's %s: %v", stmt, err)
				}
			}
			if _, err := guard.Exec(ctx, app, a, noop); err != nil {
				t.Fatalf("Exec after the fix %s: %v", fix, err)
			}
			if err := app.Advance(ctx, a); err != nil {
				t.Fatalf("Advance after the fix: %v", err)
			}
			if _, err := app.Prune(ctx, 0); err != nil {
				t.Fatalf("Prune after the fix: %v", err)
			}
		})
	}
}

func wantIn(t *testing.T, what string, err error, want string) {
	t.Helper()
	if msg := err.Error(); !strings.Contains(msg, want) {
		t.Errorf("%s: the message lacks %q:\n%s", what, want, msg)
	}
}
