package pgfence_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/jackc/pgx/v5"
)

func TestSmoke(t *testing.T) {
	db := newDB(t)
	s := newStore(t, db)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE stock (sku text, qty int)"); err != nil {
		t.Fatal(err)
	}
	a := &lease{name: "r", token: 5, holder: "a"}
	_, err := guard.Exec(ctx, s, a, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO stock VALUES ('x', 1)")
		return err
	}, guard.WithKey("k1"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = guard.Exec(ctx, s, a, func(ctx context.Context, tx pgx.Tx) error { return nil }, guard.WithKey("k1"))
	t.Logf("dup: %v", err)
	if !errors.Is(err, guard.ErrAlreadyApplied) {
		t.Fatal(err)
	}
	b := &lease{name: "r", token: 4, holder: "b"}
	_, err = guard.Exec(ctx, s, b, func(ctx context.Context, tx pgx.Tx) error { return nil })
	t.Logf("stale: %v", err)
	var se *guard.StaleTokenError
	if !errors.As(err, &se) {
		t.Fatal(err)
	}
	if err := s.Protect(ctx, "stock"); err != nil {
		t.Fatal(err)
	}
	_, err = db.Pool.Exec(ctx, "INSERT INTO stock VALUES ('y', 1)")
	t.Logf("raw: %v", err)
	_, err = guard.Exec(ctx, s, a, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO stock VALUES ('x', 1)")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
