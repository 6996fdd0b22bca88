package guardtest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/guard"
)

// Statements queued on fn's tx for the commit (Harness.OnCommit, which an
// outbox builds on) commit with fn's writes and only with them: not after
// fn fails, not after a refused claim, not when one of them fails; and a
// tx that is no longer an open guarded transaction refuses them.
func (s *suite[Tx]) commitQueue(t *testing.T) {
	if !s.hasCommitQueue(t) {
		return
	}
	ctx := ctxFor(t)
	store := s.db.NewStore(t)
	res, table := s.fresh(t)
	var fnCtx context.Context
	queue := func(tx Tx, writer string) error {
		return s.h.OnCommit(fnCtx, tx, "INSERT INTO "+table+" (sku, writer) VALUES ($1, $2)", "queued", writer)
	}
	queued := func(writer string) int64 {
		return s.count(t, "SELECT count(*) FROM "+table+" WHERE sku = 'queued' AND writer = $1", writer)
	}

	var kept Tx
	if _, err := guard.Exec(ctx, store, Lease{res, 1, "a"}, func(ctx context.Context, tx Tx) error {
		kept, fnCtx = tx, ctx
		if err := queue(tx, "a"); err != nil {
			return err
		}
		return s.insert(table, "a", 1, nil)(ctx, tx)
	}); err != nil {
		t.Fatalf("Exec with a queued statement: %v", err)
	}
	if q, n := queued("a"), s.rows(t, table, "a"); q != 1 || n != 2 {
		t.Errorf("queued rows %d, all rows %d; want 1 and 2", q, n)
	}
	if err := queue(kept, "late"); !errors.Is(err, s.h.ErrNotOpen) {
		t.Errorf("OnCommit after Exec ended: want %v, got %v", s.h.ErrNotOpen, err)
	}

	boom := errors.New("fn failed")
	if _, err := guard.Exec(ctx, store, Lease{res, 1, "a"}, func(ctx context.Context, tx Tx) error {
		fnCtx = ctx
		if err := queue(tx, "failed-fn"); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Errorf("fn's error: got %v", err)
	}
	if q := queued("failed-fn"); q != 0 {
		t.Errorf("a failed fn's queued statement committed (%d rows)", q)
	}

	_, err := guard.Exec(ctx, store, Lease{res, 1, "a"}, func(ctx context.Context, tx Tx) error {
		if err := s.insert(table, "bad-queue", 1, nil)(ctx, tx); err != nil {
			return err
		}
		return s.h.OnCommit(ctx, tx, "INSERT INTO guardtest_no_such_table VALUES ($1)", "x")
	})
	if err == nil || !strings.Contains(err.Error(), "queued for the commit failed") {
		t.Errorf("a failing queued statement: want an error that names it, got %v", err)
	}
	oneLine(t, err)
	if n := s.rows(t, table, "bad-queue"); n != 0 {
		t.Errorf("fn's writes committed although a queued statement failed (%d rows)", n)
	}

	// Overtaken while fn runs: the claim is refused, the queued write
	// goes with the rest.
	l := Lease{res, 2, "b"}
	_, err = guard.Exec(ctx, store, l, func(ctx context.Context, tx Tx) error {
		fnCtx = ctx
		if err := queue(tx, "overtaken"); err != nil {
			return err
		}
		_, err := guard.Exec(ctx, s.db.NewStore(t), Lease{res, 3, "c"}, s.insert(table, "c", 1, nil))
		return err
	})
	wantStale(t, err, l, 3)
	if q := queued("overtaken"); q != 0 {
		t.Errorf("an overtaken holder's queued statement committed (%d rows)", q)
	}
}

// hasCommitQueue says whether the harness gives a commit queue to check,
// and fails the test for a harness that asks for the check without one.
func (s *suite[Tx]) hasCommitQueue(t *testing.T) bool {
	switch {
	case s.h.OnCommit == nil && s.h.CommitQueue:
		t.Fatal("Harness.CommitQueue is deprecated and no longer enough: set Harness.OnCommit (and ErrNotOpen) to the store's way of queueing a statement for the commit")
	case s.h.OnCommit == nil:
		t.Log("Harness.OnCommit is nil: the store has no commit queue")
		return false
	case s.h.ErrNotOpen == nil:
		t.Fatal("Harness.ErrNotOpen is nil: set it to the error the store's OnCommit returns once Exec has ended")
	}
	return true
}
