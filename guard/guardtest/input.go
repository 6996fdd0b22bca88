package guardtest

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fencelock/fencelock/guard"
)

// A database that does not accept writes (made so by Facts.MakeReadOnly,
// as a standby or a read-only default is) gets guard.ErrReadOnly, runs no
// fn and writes nothing; the store does not override the setting.
func (s *suite[Tx]) readOnly(t *testing.T) {
	db := s.h.Open(t)
	ctx := ctxFor(t)
	if err := db.Exec(ctx, "CREATE TABLE guardtest_ro (sku text, writer text)"); err != nil {
		t.Fatal(err)
	}
	// A token stored before, so that a store which skips advance for a
	// stored token still meets the read-only transaction.
	if _, err := guard.Exec(ctx, db.NewStore(t), Lease{"ro", 1, "a"}, func(ctx context.Context, tx Tx) error {
		return db.TxExec(ctx, tx, "INSERT INTO guardtest_ro VALUES ('x', 'a')")
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.h.Facts.MakeReadOnly(ctx, db); err != nil {
		t.Fatalf("Facts.MakeReadOnly: %v", err)
	}
	store := db.NewStore(t) // new connections: read-only
	for _, l := range []Lease{{"ro", 1, "a"}, {"ro", 2, "b"}} {
		var ran atomic.Int64
		_, err := guard.Exec(ctx, store, l, func(ctx context.Context, tx Tx) error {
			ran.Add(1)
			return db.TxExec(ctx, tx, "INSERT INTO guardtest_ro VALUES ('x', 'b')")
		}, guard.WithKey("k"))
		if !errors.Is(err, guard.ErrReadOnly) {
			t.Errorf("lease %+v on a read-only database: want guard.ErrReadOnly, got %v", l, err)
		}
		oneLine(t, err)
		if ran.Load() != 0 {
			t.Errorf("lease %+v: fn ran on a read-only database", l)
		}
	}
	if adv, ok := store.(Advancer); ok {
		if err := adv.Advance(ctx, Lease{"ro", 3, "c"}); !errors.Is(err, guard.ErrReadOnly) {
			t.Errorf("Advance on a read-only database: want guard.ErrReadOnly, got %v", err)
		}
	}
	if n, err := db.QueryInt(ctx, "SELECT count(*) FROM guardtest_ro"); err != nil || n != 1 {
		t.Errorf("rows = %d (%v), want the 1 from before", n, err)
	}
	if n, err := s.h.Facts.Token(ctx, db, "ro"); err != nil || n != 1 {
		t.Errorf("stored token = %d (%v), want 1", n, err)
	}
}

// Bad input is a clear one-line error before anything is written, through
// Exec and through the store's Begin called directly.
func (s *suite[Tx]) badInput(t *testing.T) {
	res, table := s.fresh(t)
	ctx := ctxFor(t)
	store := s.db.NewStore(t)
	var ran atomic.Int64
	fn := s.insert(table, "a", 1, &ran)
	long := strings.Repeat("x", 3000) // past guard.MaxResourceLen

	for _, tc := range []struct {
		name string
		run  func() error
		want error
	}{
		{"nil lease", func() error { _, err := guard.Exec(ctx, store, nil, fn); return err }, guard.ErrInvalidLease},
		{"empty resource", func() error { _, err := guard.Exec(ctx, store, Lease{"", 1, "a"}, fn); return err }, guard.ErrInvalidLease},
		{"zero token", func() error { _, err := guard.Exec(ctx, store, Lease{res, 0, "a"}, fn); return err }, guard.ErrInvalidLease},
		{"negative token", func() error { _, err := guard.Exec(ctx, store, Lease{res, -5, "a"}, fn); return err }, guard.ErrInvalidLease},
		{"empty holder", func() error { _, err := guard.Exec(ctx, store, Lease{res, 1, ""}, fn); return err }, guard.ErrInvalidLease},
		{"NUL in resource", func() error { _, err := guard.Exec(ctx, store, Lease{res + "\x00", 1, "a"}, fn); return err }, guard.ErrInvalidLease},
		{"invalid UTF-8 holder", func() error { _, err := guard.Exec(ctx, store, Lease{res, 1, "a\xff"}, fn); return err }, guard.ErrInvalidInput},
		{"oversized resource", func() error { _, err := guard.Exec(ctx, store, Lease{res + long, 1, "a"}, fn); return err }, guard.ErrInvalidInput},
		{"oversized holder", func() error { _, err := guard.Exec(ctx, store, Lease{res, 1, long + long}, fn); return err }, guard.ErrInvalidInput},
		{"empty key", func() error { _, err := guard.Exec(ctx, store, Lease{res, 1, "a"}, fn, guard.WithKey("")); return err }, guard.ErrInvalidOption},
		{"oversized key", func() error {
			_, err := guard.Exec(ctx, store, Lease{res, 1, "a"}, fn, guard.WithKey(long))
			return err
		}, guard.ErrInvalidInput},
		{"nil fn", func() error { _, err := guard.Exec(ctx, store, Lease{res, 1, "a"}, nil); return err }, guard.ErrNilFunc},
		{"nil store", func() error { _, err := guard.Exec[Tx](ctx, nil, Lease{res, 1, "a"}, fn); return err }, guard.ErrNilStore},
		{"Begin: empty resource", func() error { return begin(ctx, store, guard.Claim{Token: 1, Holder: "a"}) }, guard.ErrInvalidLease},
		{"Begin: zero token", func() error { return begin(ctx, store, guard.Claim{Resource: res, Holder: "a"}) }, guard.ErrInvalidLease},
		{"Begin: empty holder", func() error { return begin(ctx, store, guard.Claim{Resource: res, Token: 1}) }, guard.ErrInvalidLease},
		{"Begin: invalid UTF-8 key", func() error {
			return begin(ctx, store, guard.Claim{Resource: res, Token: 1, Holder: "a", Key: "k\xc3"})
		}, guard.ErrInvalidInput},
		{"Begin: oversized key", func() error { return begin(ctx, store, guard.Claim{Resource: res, Token: 1, Holder: "a", Key: long}) }, guard.ErrInvalidOption},
		{"Begin: oversized resource", func() error { return begin(ctx, store, guard.Claim{Resource: long, Token: 1, Holder: "a"}) }, guard.ErrInvalidLease},
	} {
		err := tc.run()
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want an error wrapping %v", tc.name, err, tc.want)
		}
		oneLine(t, err)
		if len(err.Error()) > 1000 {
			t.Errorf("%s: a %d-byte error message (it quotes the input?)", tc.name, len(err.Error()))
		}
	}
	if ran.Load() != 0 {
		t.Errorf("fn ran %d times on bad input", ran.Load())
	}
	if n := s.count(t, "SELECT count(*) FROM "+table); n != 0 {
		t.Errorf("%d rows written on bad input", n)
	}
	if n, err := s.h.Facts.Fenced(ctx, s.db, res); err != nil || n != 0 {
		t.Errorf("%d tokens recorded on bad input (%v)", n, err)
	}
	if tok := s.stored(t, long); tok != 0 {
		t.Errorf("token %d recorded for an oversized resource", tok)
	}
}

// begin calls the store's Begin directly, as a caller that builds its own
// Claim would, and rolls back whatever it opened.
func begin[Tx any](ctx context.Context, store guard.Store[Tx], c guard.Claim) error {
	txn, err := store.Begin(ctx, c)
	if err == nil {
		_ = txn.Rollback(ctx)
	}
	return err
}
