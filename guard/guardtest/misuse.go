package guardtest

import (
	"context"
	"errors"
	"testing"

	"github.com/fencelock/fencelock/guard"
)

// The promise under misuse: err == nil exactly when fn's writes are
// visible, and an Exec whose transaction fn ended itself never says
// "nothing was written". A store either refuses fn's commit without
// touching the transaction (guard.ErrTxOwned, as pgfence's own pgx.Tx
// does) and then commits as usual, or cannot stop it (a *sql.Tx) and then
// reports guard.ErrTxEnded.

// fn commits through its transaction handle's own API.
func (s *suite[Tx]) misuseTxCommit(t *testing.T) {
	res, table := s.fresh(t)
	ctx := ctxFor(t)
	store := s.db.NewStore(t)
	var commitErr error
	_, err := guard.Exec(ctx, store, Lease{res, 1, "a"}, func(ctx context.Context, tx Tx) error {
		if err := s.insert(table, "a", 2, nil)(ctx, tx); err != nil {
			return err
		}
		commitErr = s.db.TxCommit(ctx, tx)
		return nil
	}, guard.WithKey("k"))
	rows := s.rows(t, table, "a")
	switch {
	case commitErr != nil:
		if !errors.Is(commitErr, guard.ErrTxOwned) {
			t.Fatalf("fn's Commit failed with %v, want guard.ErrTxOwned", commitErr)
		}
		oneLine(t, commitErr)
		// Refused without touching the transaction: Exec commits it.
		if err != nil || rows != 2 || !s.keyRecorded(t, res, "k") {
			t.Errorf("after a refused fn commit: err %v, rows %d, key recorded %v; want nil, 2, true", err, rows, s.keyRecorded(t, res, "k"))
		}
	default:
		// fn's commit went through: Exec must say so.
		if !errors.Is(err, guard.ErrTxEnded) {
			t.Fatalf("fn committed its transaction itself (rows visible: %d): want guard.ErrTxEnded, got %v", rows, err)
		}
		oneLine(t, err)
		if errors.Is(err, guard.ErrStaleToken) || errors.Is(err, guard.ErrAlreadyApplied) {
			t.Errorf("a refusal that claims nothing was written, for a committed transaction: %v", err)
		}
	}
	s.stillWorks(t, store, res, table)
}

// fn sends COMMIT or ROLLBACK as SQL through its transaction, with or
// without a newer holder committing in between. If the statement went
// through, the transaction Exec opened is gone (its writes committed
// without the fence check at commit, or rolled back): Exec must say so
// with guard.ErrTxEnded, never succeed and never report a plain refusal.
// A store that refuses the statement keeps its transaction and goes on as
// usual.
func (s *suite[Tx]) misuseRawCommit(t *testing.T) {
	for _, stmt := range []string{"COMMIT", "ROLLBACK"} {
		for _, overtaken := range []bool{false, true} {
			name := stmt
			if overtaken {
				name += "/overtaken"
			}
			t.Run(name, func(t *testing.T) {
				res, table := s.fresh(t)
				ctx := ctxFor(t)
				store, newer := s.db.NewStore(t), s.db.NewStore(t)
				l := Lease{res, 1, "a"}
				var stmtErr error
				_, err := guard.Exec(ctx, store, l, func(ctx context.Context, tx Tx) error {
					if err := s.insert(table, "a", 2, nil)(ctx, tx); err != nil {
						return err
					}
					if overtaken {
						if _, err := guard.Exec(ctx, newer, Lease{res, 2, "b"}, s.insert(table, "b", 1, nil)); err != nil {
							return err
						}
					}
					stmtErr = s.db.TxExec(ctx, tx, stmt)
					return nil
				}, guard.WithKey("k"))
				rows := s.rows(t, table, "a")
				switch {
				case stmtErr == nil:
					if !errors.Is(err, guard.ErrTxEnded) || errors.Is(err, guard.ErrStaleToken) {
						t.Fatalf("fn's %s went through (rows visible: %d): want guard.ErrTxEnded and no refusal, got %v", stmt, rows, err)
					}
					oneLine(t, err)
					if s.keyRecorded(t, res, "k") {
						t.Error("the key was recorded without the fence check")
					}
				case overtaken:
					wantStale(t, err, l, 2)
					if rows != 0 {
						t.Errorf("the overtaken holder committed %d rows", rows)
					}
				default:
					if err != nil || rows != 2 || !s.keyRecorded(t, res, "k") {
						t.Errorf("the store refused fn's %s (%v), then: err %v, rows %d; want nil, 2, key recorded", stmt, stmtErr, err, rows)
					}
				}
				if !overtaken {
					s.stillWorks(t, store, res, table)
				}
			})
		}
	}
}

// fn commits through its handle after a newer holder took over: Exec must
// not report the usual stale refusal ("nothing was written") when fn's
// commit went through.
func (s *suite[Tx]) misuseCommitOvertaken(t *testing.T) {
	res, table := s.fresh(t)
	ctx := ctxFor(t)
	store, newer := s.db.NewStore(t), s.db.NewStore(t)
	l := Lease{res, 1, "a"}
	var commitErr error
	_, err := guard.Exec(ctx, store, l, func(ctx context.Context, tx Tx) error {
		if err := s.insert(table, "a", 2, nil)(ctx, tx); err != nil {
			return err
		}
		if _, err := guard.Exec(ctx, newer, Lease{res, 2, "b"}, s.insert(table, "b", 1, nil)); err != nil {
			return err
		}
		commitErr = s.db.TxCommit(ctx, tx)
		return nil
	})
	rows := s.rows(t, table, "a")
	if commitErr != nil {
		if !errors.Is(commitErr, guard.ErrTxOwned) {
			t.Fatalf("fn's Commit failed with %v, want guard.ErrTxOwned", commitErr)
		}
		wantStale(t, err, l, 2)
		if rows != 0 {
			t.Errorf("the overtaken holder committed %d rows", rows)
		}
	} else if !errors.Is(err, guard.ErrTxEnded) || errors.Is(err, guard.ErrStaleToken) {
		t.Fatalf("fn committed its overtaken transaction itself (%d rows visible): want guard.ErrTxEnded and no stale refusal, got %v", rows, err)
	}
}

// stillWorks checks that the store's connections came back usable.
func (s *suite[Tx]) stillWorks(t *testing.T, store guard.Store[Tx], res, table string) {
	t.Helper()
	before := s.rows(t, table, "after")
	if _, err := guard.Exec(ctxFor(t), store, Lease{res, 3, "after"}, s.insert(table, "after", 1, nil)); err != nil {
		t.Fatalf("the store does not work after the misuse: %v", err)
	}
	if n := s.rows(t, table, "after"); n != before+1 {
		t.Errorf("rows after = %d, want %d", n, before+1)
	}
}
