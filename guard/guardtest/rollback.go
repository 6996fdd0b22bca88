package guardtest

import (
	"context"
	"errors"
	"testing"

	"github.com/fencelock/fencelock/guard"
)

// fn's error rolls everything back (rows and key) and comes back as is.
func (s *suite[Tx]) rollbackOnError(t *testing.T) {
	res, table := s.fresh(t)
	ctx := ctxFor(t)
	boom := errors.New("boom")
	_, err := guard.Exec(ctx, s.db.NewStore(t), Lease{res, 1, "a"}, func(ctx context.Context, tx Tx) error {
		if err := s.insert(table, "a", 3, nil)(ctx, tx); err != nil {
			return err
		}
		return boom
	}, guard.WithKey("k"))
	if !errors.Is(err, boom) {
		t.Fatalf("want fn's error, got %v", err)
	}
	if n := s.rows(t, table, "a"); n != 0 {
		t.Errorf("%d rows committed after fn's error", n)
	}
	if s.keyRecorded(t, res, "k") {
		t.Error("key recorded after fn's error")
	}
	// A failed statement inside fn (the transaction is aborted) whose
	// error fn swallows: nothing commits, Exec reports an error.
	_, err = guard.Exec(ctx, s.db.NewStore(t), Lease{res, 1, "a"}, func(ctx context.Context, tx Tx) error {
		if err := s.insert(table, "a", 1, nil)(ctx, tx); err != nil {
			return err
		}
		_ = s.db.TxExec(ctx, tx, "INSERT INTO guardtest_no_such_table VALUES (1)")
		return nil
	})
	if err == nil {
		t.Fatal("Exec committed a transaction whose statement failed")
	}
	oneLine(t, err)
	if n := s.rows(t, table, "a"); n != 0 {
		t.Errorf("%d rows committed from an aborted transaction", n)
	}
}

// A panic in fn rolls back and is raised again.
func (s *suite[Tx]) rollbackOnPanic(t *testing.T) {
	res, table := s.fresh(t)
	ctx := ctxFor(t)
	store := s.db.NewStore(t)
	func() {
		defer func() {
			if r := recover(); r != "fn panics" {
				t.Errorf("recovered %v, want fn's panic", r)
			}
		}()
		_, _ = guard.Exec(ctx, store, Lease{res, 1, "a"}, func(ctx context.Context, tx Tx) error {
			if err := s.insert(table, "a", 2, nil)(ctx, tx); err != nil {
				return err
			}
			panic("fn panics")
		}, guard.WithKey("k"))
	}()
	if n := s.rows(t, table, "a"); n != 0 {
		t.Errorf("%d rows committed after a panic", n)
	}
	// The store still works, and the key was not consumed.
	if _, err := guard.Exec(ctx, store, Lease{res, 1, "a"}, s.insert(table, "a", 1, nil), guard.WithKey("k")); err != nil {
		t.Fatalf("Exec after a panic: %v", err)
	}
}

// ctx cancelled while fn runs: nothing commits, the error says why.
func (s *suite[Tx]) rollbackOnCancel(t *testing.T) {
	res, table := s.fresh(t)
	ctx, cancel := context.WithCancel(ctxFor(t))
	defer cancel()
	_, err := guard.Exec(ctx, s.db.NewStore(t), Lease{res, 1, "a"}, func(fctx context.Context, tx Tx) error {
		if err := s.insert(table, "a", 2, nil)(fctx, tx); err != nil {
			return err
		}
		cancel()
		<-fctx.Done()
		return nil // fn ignores the cancellation: Exec must not commit
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("want an error wrapping context.Canceled, got %v", err)
	}
	oneLine(t, err)
	if n := s.rows(t, table, "a"); n != 0 {
		t.Errorf("%d rows committed after ctx was cancelled", n)
	}
}

// The lease lost while fn runs: fn's context ends, nothing commits, the
// error is guard.ErrLeaseLost.
func (s *suite[Tx]) rollbackOnLeaseLoss(t *testing.T) {
	res, table := s.fresh(t)
	ctx := ctxFor(t)
	l := &losable{Lease: Lease{res, 1, "a"}, done: make(chan struct{})}
	_, err := guard.Exec(ctx, s.db.NewStore(t), l, func(fctx context.Context, tx Tx) error {
		if err := s.insert(table, "a", 2, nil)(fctx, tx); err != nil {
			return err
		}
		close(l.done)
		<-fctx.Done()
		return nil
	})
	if !errors.Is(err, guard.ErrLeaseLost) {
		t.Fatalf("want guard.ErrLeaseLost, got %v", err)
	}
	oneLine(t, err)
	if n := s.rows(t, table, "a"); n != 0 {
		t.Errorf("%d rows committed after the lease was lost", n)
	}
}
