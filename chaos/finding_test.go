// Interleavings the chaos suite produces by chance, replayed
// deterministically: a lost update in a read-modify-write whose holder is
// overtaken between its read and its write. They pin that a guarded
// transaction records its token at begin, before fn reads, so an older
// holder cannot commit over what a newer one has read. They run in
// `make test`.
package chaos

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
)

// A holder frozen between the read and the write of a read-modify-write
// (SIGSTOP, GC pause, VM freeze) loses its lease; a new holder takes the
// lock and reads; the old holder thaws and commits before the new one
// does. The old holder's write must be rejected: its lease is gone and a
// newer token is at work. A store that claimed the token only at commit
// would not have seen the newer token yet, accept the old write, and let
// the new holder commit an increment computed from a value that was
// overwritten: one update lost, with guard on.
//
// The old holder's lease is handed to guard without its Done channel: a
// frozen process cannot run its client-side check before it thaws, and
// when it does, that check races the commit (the package doc of guard says
// the store's check is the guarantee). The chaos suite produces the same
// interleaving for real under `sigstop` (SIGCONT while the next holder is
// between its read and its write).
func TestFindingReadModifyWriteLostUpdate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fc, store, db, _ := findingSetup(ctx, t)

	// Old holder: a short fixed lease, frozen after its read.
	old, err := fc.Acquire(ctx, "stock", fence.WithFixedLease(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	oldRead, oldGo, oldDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := guard.Exec(ctx, store, bareLease{name: old.Name(), holder: old.Holder(), token: old.Token()}, incr(oldRead, oldGo))
		oldDone <- err
	}()
	<-oldRead

	// The lease runs out; the next holder takes the lock and reads.
	next, err := fc.Acquire(ctx, "stock", fence.WithLease(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(context.WithoutCancel(ctx))
	if next.Token() <= old.Token() {
		t.Fatalf("next token %d not above old %d", next.Token(), old.Token())
	}
	nextRead, nextGo, nextDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := guard.Exec(ctx, store, next, incr(nextRead, nextGo))
		nextDone <- err
	}()
	select {
	case <-nextRead:
	case <-time.After(2 * time.Second):
		// A store that claims at begin makes the next holder wait for the
		// old transaction here; let the old one go on, it must then fail
		// or be ordered first.
	}

	// The old holder thaws and commits while the next one is mid-way.
	close(oldGo)
	oldErr := <-oldDone
	close(nextGo)
	nextErr := <-nextDone

	var v int
	if err := db.Pool.QueryRow(ctx, `SELECT value FROM reg WHERE id = 1`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	committed := 0
	for _, err := range []error{oldErr, nextErr} {
		if err == nil {
			committed++
		}
	}
	t.Logf("old holder (token %d, lease expired): %v; next holder (token %d): %v; register %d", old.Token(), oldErr, next.Token(), nextErr, v)
	if v != committed {
		t.Errorf("lost update with guard on: %d increments committed, register holds %d", committed, v)
	}
	if oldErr == nil && nextErr == nil {
		t.Errorf("a write from a holder whose lease had expired committed while a newer holder (token %d) was at work", next.Token())
	}
}

func findingSetup(ctx context.Context, t *testing.T) (*fence.Client, *pgfence.Store, *testenv.DB, *testenv.Redis) {
	t.Helper()
	r := testenv.NewRedisServer(t)
	db := testenv.NewDB(t)
	sqlDB, err := sql.Open("pgx", db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	if err := migrations.Up(ctx, sqlDB); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE reg (id int PRIMARY KEY, value int NOT NULL); INSERT INTO reg VALUES (1, 0)`); err != nil {
		t.Fatal(err)
	}
	store, err := pgfence.New(db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	fc, err := fence.New(r.Client())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fc.Close(context.Background()) })
	return fc, store, db, r
}

// incr is a read-modify-write of the register that signals after its read
// and waits for proceed before its write.
func incr(read chan<- struct{}, proceed <-chan struct{}) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		var v int
		if err := tx.QueryRow(ctx, `SELECT value FROM reg WHERE id = 1`).Scan(&v); err != nil {
			return err
		}
		close(read)
		<-proceed
		_, err := tx.Exec(ctx, `UPDATE reg SET value = $1 WHERE id = 1`, v+1)
		return err
	}
}

// Redis loses its data (FLUSHALL; a restart without persistence or a
// failover acts the same) while holder A is between the read and the write
// of a read-modify-write. B acquires at once (the lock key is gone) and
// reads; A, whose watchdog has not renewed yet and so does not know, writes
// and commits; B commits. B's begin recorded its newer token, so the two
// commits cannot both go through on the same read: the register holds
// exactly the increments that committed. (A store that claimed only at
// commit would let both pass its token check and lose one.) No process is
// paused and both pass their *fence.Lock to guard.Exec, as applications
// do.
func TestFindingReadModifyWriteLostUpdateAfterRedisDataLoss(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fc, store, db, r := findingSetup(ctx, t)

	a, err := fc.Acquire(ctx, "stock", fence.WithLease(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	aRead, aGo, aDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := guard.Exec(ctx, store, a, incr(aRead, aGo))
		aDone <- err
	}()
	<-aRead

	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := fc.Acquire(ctx, "stock", fence.WithLease(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(context.WithoutCancel(ctx))
	bRead, bGo, bDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := guard.Exec(ctx, store, b, incr(bRead, bGo))
		bDone <- err
	}()
	select {
	case <-bRead:
	case <-time.After(2 * time.Second): // a store that claims at begin may make B wait here
	}
	close(aGo)
	aErr := <-aDone
	close(bGo)
	bErr := <-bDone
	_ = a.Release(context.WithoutCancel(ctx))

	var v int
	if err := db.Pool.QueryRow(ctx, `SELECT value FROM reg WHERE id = 1`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	committed := 0
	for _, err := range []error{aErr, bErr} {
		if err == nil {
			committed++
		}
	}
	t.Logf("A (token %d): %v; B (token %d): %v; register %d", a.Token(), aErr, b.Token(), bErr, v)
	if v != committed {
		t.Errorf("lost update with guard on after Redis lost its data: %d increments committed, register holds %d", committed, v)
	}
}
