package guardtest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/guard"
)

// The same refusal is the same guard error, whichever store returns it:
// errors.Is matches guard's one value (ErrNotClaimed, ErrSchemaMissing; the
// other refusals are checked where they arise: ErrStaleToken,
// ErrAlreadyApplied, ErrRunFinished, ErrReadOnly, ErrInvalidInput), so code
// that handles them does not depend on the backend. The refusal's cause is
// named once in the message.
func (s *suite[Tx]) sameErrors(t *testing.T) {
	ctx := ctxFor(t)
	t.Run("NotClaimed", func(t *testing.T) {
		if s.h.Facts.Protect == nil {
			t.Skip("the store protects no tables (Harness.Facts.Protect is nil)")
		}
		store := s.db.NewStore(t)
		m, ok := store.(guard.ErrorMapper)
		if !ok {
			t.Fatalf("%T does not implement guard.ErrorMapper: raw SQL's refusals cannot be told apart", store)
		}
		_, table := s.fresh(t)
		if err := s.h.Facts.Protect(ctx, s.db, table); err != nil {
			t.Fatalf("Facts.Protect(%s): %v", table, err)
		}
		err := s.db.Exec(ctx, "INSERT INTO "+table+" VALUES ('x', 'raw')")
		if err == nil {
			t.Fatal("a write to a protected table without a claim was accepted")
		}
		err = m.MapError(err)
		if !errors.Is(err, guard.ErrNotClaimed) {
			t.Errorf("write without a claim: want guard.ErrNotClaimed, got %v", err)
		}
		oneLine(t, err)
		// Through Exec the same write passes: Exec's transaction claims.
		res, _ := s.fresh(t)
		if _, err := guard.Exec(ctx, store, Lease{res, 1, "a"}, func(ctx context.Context, tx Tx) error {
			return s.db.TxExec(ctx, tx, "INSERT INTO "+table+" VALUES ('x', 'a')")
		}); err != nil {
			t.Errorf("write to a protected table through Exec: %v", err)
		}
	})
	t.Run("SchemaMissing", func(t *testing.T) {
		db := s.h.Open(t)
		if err := s.h.Facts.Uninstall(ctx, db); err != nil {
			t.Fatalf("Facts.Uninstall: %v", err)
		}
		store := db.NewStore(t)
		var ran bool
		_, err := guard.Exec(ctx, store, Lease{"nothing", 1, "a"}, func(context.Context, Tx) error {
			ran = true
			return nil
		})
		wantOnce(t, "Exec without the schema", err, guard.ErrSchemaMissing, "schema not installed")
		if ran {
			t.Error("fn ran without the schema")
		}
		if adv, ok := store.(Advancer); ok {
			wantOnce(t, "Advance without the schema", adv.Advance(ctx, Lease{"nothing", 2, "a"}), guard.ErrSchemaMissing, "schema not installed")
		}
		_, _, err = s.h.Run(store, Lease{"nothing", 3, "a"}, "run").Resume(ctx)
		wantOnce(t, "Resume without the schema", err, guard.ErrSchemaMissing, "schema not installed")
	})
}

// wantOnce checks that err matches want and names its cause (the words
// cause) exactly once, on one line.
func wantOnce(t testing.TB, what string, err, want error, cause string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: want %v, got %v", what, want, err)
		return
	}
	oneLine(t, err)
	if n := strings.Count(strings.ToLower(err.Error()), strings.ToLower(cause)); n != 1 {
		t.Errorf("%s: %q named %d times in %q, want once", what, cause, n, err.Error())
	}
}
