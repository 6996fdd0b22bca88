package guardtest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/fencelock/fencelock/guard"
)

// A committed Exec leaves fn's rows, the token and the key in the
// database, and says what it claimed.
func (s *suite[Tx]) commits(t *testing.T) {
	res, table := s.fresh(t)
	ctx := ctxFor(t)
	store := s.db.NewStore(t)
	l := Lease{res, 7, "a"}
	r, err := guard.Exec(ctx, store, l, s.insert(table, "a", 3, nil), guard.WithKey("batch-1"))
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if want := (guard.Result{Resource: res, Token: 7, Holder: "a", Key: "batch-1"}); r != want {
		t.Errorf("Result = %+v, want %+v", r, want)
	}
	if n := s.rows(t, table, "a"); n != 3 {
		t.Errorf("rows committed = %d, want 3", n)
	}
	if tok := s.stored(t, res); tok != 7 {
		t.Errorf("stored token = %d, want 7", tok)
	}
	if !s.keyRecorded(t, res, "batch-1") {
		t.Error("key batch-1 not recorded")
	}
	// A higher token from another holder is accepted and stored; the same
	// token from the same holder again too.
	for range 2 {
		if _, err := guard.Exec(ctx, store, Lease{res, 9, "b"}, s.insert(table, "b", 1, nil)); err != nil {
			t.Fatalf("Exec token 9: %v", err)
		}
	}
	if tok := s.stored(t, res); tok != 9 {
		t.Errorf("stored token = %d, want 9", tok)
	}
	if n := s.rows(t, table, "b"); n != 2 {
		t.Errorf("rows of b = %d, want 2", n)
	}
}

// A lower token than the stored one is refused before fn runs, by a store
// of another process as by the one that stored it, and writes nothing.
func (s *suite[Tx]) staleRejected(t *testing.T) {
	res, table := s.fresh(t)
	ctx := ctxFor(t)
	newer, older := s.db.NewStore(t), s.db.NewStore(t)
	// The older holder has written before (its store remembers its token
	// as stored), then the newer one took over.
	if _, err := guard.Exec(ctx, older, Lease{res, 9, "a"}, s.insert(table, "a", 1, nil)); err != nil {
		t.Fatalf("Exec token 9: %v", err)
	}
	if _, err := guard.Exec(ctx, newer, Lease{res, 10, "b"}, s.insert(table, "b", 2, nil)); err != nil {
		t.Fatalf("Exec token 10: %v", err)
	}
	for _, store := range []guard.Store[Tx]{older, newer, s.db.NewStore(t)} {
		var ran atomic.Int64
		l := Lease{res, 9, "a"}
		_, err := guard.Exec(ctx, store, l, s.insert(table, "a", 5, &ran))
		wantStale(t, err, l, 10)
		if ran.Load() != 0 {
			t.Error("fn ran for a stale token")
		}
	}
	if n := s.rows(t, table, "a"); n != 1 {
		t.Errorf("rows of the stale holder = %d, want only its 1 from before", n)
	}
	if tok := s.stored(t, res); tok != 10 {
		t.Errorf("stored token = %d, want 10", tok)
	}
}

// A holder overtaken while fn runs (a newer holder claims and commits in
// the middle) is refused at commit: none of its writes stay.
func (s *suite[Tx]) overtaken(t *testing.T) {
	res, table := s.fresh(t)
	ctx := ctxFor(t)
	a, b := s.db.NewStore(t), s.db.NewStore(t)
	l := Lease{res, 11, "a"}
	_, err := guard.Exec(ctx, a, l, func(ctx context.Context, tx Tx) error {
		if err := s.insert(table, "a", 3, nil)(ctx, tx); err != nil {
			return err
		}
		// The paused holder's lease expired; the next one writes.
		_, err := guard.Exec(ctx, b, Lease{res, 12, "b"}, s.insert(table, "b", 1, nil))
		return err
	})
	wantStale(t, err, l, 12)
	if n := s.rows(t, table, "a"); n != 0 {
		t.Errorf("the overtaken holder committed %d rows", n)
	}
	if n := s.rows(t, table, "b"); n != 1 {
		t.Errorf("the newer holder's rows = %d, want 1", n)
	}
}

// The same token from another holder is refused (two lock servers, or a
// counter lost and replayed); from the same holder it is accepted again.
func (s *suite[Tx]) equalToken(t *testing.T) {
	res, table := s.fresh(t)
	ctx := ctxFor(t)
	store := s.db.NewStore(t)
	if _, err := guard.Exec(ctx, store, Lease{res, 10, "b"}, s.insert(table, "b", 1, nil)); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int64
	l := Lease{res, 10, "x"}
	_, err := guard.Exec(ctx, s.db.NewStore(t), l, s.insert(table, "x", 1, &ran))
	wantStale(t, err, l, 10)
	if ran.Load() != 0 || s.rows(t, table, "x") != 0 {
		t.Error("the other holder's fn ran or wrote")
	}
	if _, err := guard.Exec(ctx, s.db.NewStore(t), Lease{res, 10, "b"}, s.insert(table, "b", 1, nil)); err != nil {
		t.Errorf("same token, same holder, another store: %v", err)
	}
	if n := s.rows(t, table, "b"); n != 2 {
		t.Errorf("rows of b = %d, want 2", n)
	}
}

// A key is applied once per resource, by any holder: a repeat does not run
// fn, writes nothing, and does not consume the key when it fails.
func (s *suite[Tx]) keyDedupe(t *testing.T) {
	res, table := s.fresh(t)
	ctx := ctxFor(t)
	store := s.db.NewStore(t)
	var ran atomic.Int64
	if _, err := guard.Exec(ctx, store, Lease{res, 1, "a"}, s.insert(table, "a", 2, &ran), guard.WithKey("k1")); err != nil {
		t.Fatal(err)
	}
	for _, l := range []Lease{{res, 1, "a"}, {res, 2, "b"}} {
		_, err := guard.Exec(ctx, s.db.NewStore(t), l, s.insert(table, l.Who, 2, &ran), guard.WithKey("k1"))
		if !errors.Is(err, guard.ErrAlreadyApplied) {
			t.Fatalf("repeat of k1 by %+v: want guard.ErrAlreadyApplied, got %v", l, err)
		}
		oneLine(t, err)
	}
	if ran.Load() != 1 {
		t.Errorf("fn ran %d times, want 1", ran.Load())
	}
	// A failed transaction does not consume its key.
	boom := errors.New("boom")
	if _, err := guard.Exec(ctx, store, Lease{res, 2, "b"}, func(ctx context.Context, tx Tx) error {
		_ = s.insert(table, "b", 1, nil)(ctx, tx)
		return boom
	}, guard.WithKey("k2")); !errors.Is(err, boom) {
		t.Fatalf("want fn's error, got %v", err)
	}
	if s.keyRecorded(t, res, "k2") {
		t.Error("a rolled-back transaction recorded its key")
	}
	if _, err := guard.Exec(ctx, store, Lease{res, 2, "b"}, s.insert(table, "b", 1, nil), guard.WithKey("k2")); err != nil {
		t.Fatalf("k2 after a failure: %v", err)
	}
	// Keys are per resource.
	other, otherTable := s.fresh(t)
	if _, err := guard.Exec(ctx, store, Lease{other, 1, "a"}, s.insert(otherTable, "a", 1, nil), guard.WithKey("k1")); err != nil {
		t.Fatalf("k1 on another resource: %v", err)
	}
	if n := s.count(t, "SELECT count(*) FROM "+table); n != 3 {
		t.Errorf("rows = %d, want 3 (k1 once, k2 once)", n)
	}
}

// Two transactions with the same key in flight at once: both pass the
// check at begin, the second to commit is refused and writes nothing.
func (s *suite[Tx]) keyDedupeConcurrent(t *testing.T) {
	res, table := s.fresh(t)
	ctx := ctxFor(t)
	a, b := s.db.NewStore(t), s.db.NewStore(t)
	_, err := guard.Exec(ctx, a, Lease{res, 3, "a"}, func(ctx context.Context, tx Tx) error {
		if err := s.insert(table, "a", 2, nil)(ctx, tx); err != nil {
			return err
		}
		_, err := guard.Exec(ctx, b, Lease{res, 3, "a"}, s.insert(table, "a2", 2, nil), guard.WithKey("k"))
		return err
	}, guard.WithKey("k"))
	if !errors.Is(err, guard.ErrAlreadyApplied) {
		t.Fatalf("want guard.ErrAlreadyApplied for the later commit, got %v", err)
	}
	if n := s.rows(t, table, "a"); n != 0 {
		t.Errorf("the refused transaction committed %d rows", n)
	}
	if n := s.rows(t, table, "a2"); n != 2 {
		t.Errorf("the first commit's rows = %d, want 2", n)
	}
}

// Advance stores the token at once: an older holder that has not written
// yet is refused from then on, and an older Advance is refused.
func (s *suite[Tx]) advance(t *testing.T) {
	store := s.db.NewStore(t)
	adv, ok := store.(Advancer)
	if !ok {
		t.Log("store has no Advance: nothing to check")
		return
	}
	res, table := s.fresh(t)
	ctx := ctxFor(t)
	older := s.db.NewStore(t)
	if _, err := guard.Exec(ctx, older, Lease{res, 19, "a"}, s.insert(table, "a", 1, nil)); err != nil {
		t.Fatal(err)
	}
	if err := adv.Advance(ctx, Lease{res, 20, "b"}); err != nil {
		t.Fatalf("Advance: %v", err)
	}
	if tok := s.stored(t, res); tok != 20 {
		t.Errorf("stored token after Advance = %d, want 20", tok)
	}
	l := Lease{res, 19, "a"}
	_, err := guard.Exec(ctx, older, l, s.insert(table, "a", 1, nil))
	wantStale(t, err, l, 20)
	err = adv.Advance(ctx, l)
	wantStale(t, err, l, 20)
	if err := adv.Advance(ctx, Lease{res, 20, "b"}); err != nil {
		t.Errorf("Advance again by the holder: %v", err)
	}
	if n := s.rows(t, table, "a"); n != 1 {
		t.Errorf("rows of a = %d, want 1", n)
	}

	// A lost lease is refused as Exec refuses it, and stores nothing.
	lost := &losable{Lease: Lease{res, 21, "c"}, done: make(chan struct{})}
	close(lost.done)
	advErr := adv.Advance(ctx, lost)
	_, execErr := guard.Exec(ctx, store, lost, s.insert(table, "c", 1, nil))
	for what, err := range map[string]error{"Advance": advErr, "Exec": execErr} {
		var ll *guard.LeaseLostError
		if !errors.As(err, &ll) || !errors.Is(err, guard.ErrLeaseLost) || !errors.Is(err, errLost) {
			t.Errorf("%s with a lost lease: want a *guard.LeaseLostError with the lease's cause, got %v", what, err)
		}
	}
	if advErr != nil && execErr != nil && advErr.Error() != execErr.Error() {
		t.Errorf("Advance and Exec refuse a lost lease differently: %q, %q", advErr, execErr)
	}
	if tok := s.stored(t, res); tok != 20 {
		t.Errorf("stored token after a lost lease's Advance = %d, want 20", tok)
	}
}

// A resumable run: steps move the cursor with their writes, a new holder
// resumes where the last commit left it, the old holder's step is refused,
// a finished run runs no more steps.
func (s *suite[Tx]) resumableRun(t *testing.T) {
	res, table := s.fresh(t)
	ctx := ctxFor(t)
	store := s.db.NewStore(t)
	la := Lease{res, 5, "a"}
	run := s.h.Run(store, la, "batch")
	cur, fin, err := run.Resume(ctx)
	if err != nil || cur != "" || fin {
		t.Fatalf("Resume of a new run = %q, %v, %v; want \"\", false, nil", cur, fin, err)
	}
	for _, c := range []string{"10", "20"} {
		if err := run.Step(ctx, c, s.insert(table, "a", 1, nil)); err != nil {
			t.Fatalf("Step %s: %v", c, err)
		}
	}
	// A failed step leaves the cursor and writes nothing.
	boom := errors.New("boom")
	if err := run.Step(ctx, "30", func(ctx context.Context, tx Tx) error {
		_ = s.insert(table, "a", 1, nil)(ctx, tx)
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("want fn's error, got %v", err)
	}
	// The next holder resumes from 20.
	lb := Lease{res, 6, "b"}
	runB := s.h.Run(s.db.NewStore(t), lb, "batch")
	cur, fin, err = runB.Resume(ctx)
	if err != nil || cur != "20" || fin {
		t.Fatalf("Resume = %q, %v, %v; want \"20\", false, nil", cur, fin, err)
	}
	if err := runB.Step(ctx, "30", s.insert(table, "b", 1, nil)); err != nil {
		t.Fatal(err)
	}
	// The old holder's step is refused.
	var ran atomic.Int64
	err = run.Step(ctx, "40", s.insert(table, "a", 1, &ran))
	wantStale(t, err, la, 6)
	if ran.Load() != 0 {
		t.Error("a stale step ran fn")
	}
	if err := runB.Finish(ctx); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	if err := runB.Finish(ctx); err != nil {
		t.Errorf("Finish of a finished run: %v", err)
	}
	err = s.h.Run(s.db.NewStore(t), Lease{res, 7, "c"}, "batch").Step(ctx, "50", s.insert(table, "c", 1, &ran))
	if !errors.Is(err, guard.ErrRunFinished) || !errors.Is(err, guard.ErrAlreadyApplied) {
		t.Fatalf("step of a finished run: want guard.ErrRunFinished, matching guard.ErrAlreadyApplied, got %v", err)
	}
	oneLine(t, err)
	if ran.Load() != 0 {
		t.Error("a step of a finished run ran fn")
	}
	cur, fin, err = runB.Resume(ctx)
	if err != nil || cur != "30" || !fin {
		t.Errorf("Resume of the finished run = %q, %v, %v; want \"30\", true, nil", cur, fin, err)
	}
	if a, b := s.rows(t, table, "a"), s.rows(t, table, "b"); a != 2 || b != 1 {
		t.Errorf("rows a=%d b=%d, want 2 and 1", a, b)
	}
}

// A newer holder's transaction that has begun (and read) refuses an older
// holder's commit at once, before the newer one writes or commits: the
// token is recorded when the transaction begins, so a read-modify-write
// cannot lose an update to a holder that was already overtaken.
func (s *suite[Tx]) newerBeginRefusesOlder(t *testing.T) {
	res, table := s.fresh(t)
	ctx := ctxFor(t)
	s.exec(t, "INSERT INTO "+table+" VALUES ('counter', '0')")
	older, newer := s.db.NewStore(t), s.db.NewStore(t)
	bump := func(ctx context.Context, tx Tx) error {
		return s.db.TxExec(ctx, tx, "UPDATE "+table+" SET writer = CAST(CAST(writer AS bigint) + 1 AS text) WHERE sku = 'counter'")
	}
	if _, err := guard.Exec(ctx, older, Lease{res, 1, "a"}, bump); err != nil {
		t.Fatal(err)
	}
	read, olderDone := make(chan struct{}), make(chan struct{})
	newerErr := make(chan error, 1)
	go func() {
		_, err := guard.Exec(ctx, newer, Lease{res, 2, "b"}, func(ctx context.Context, tx Tx) error {
			v, err := s.db.TxQueryInt(ctx, tx, "SELECT CAST(writer AS bigint) FROM "+table+" WHERE sku = 'counter'")
			close(read)
			if err != nil {
				return err
			}
			<-olderDone
			return s.db.TxExec(ctx, tx, "UPDATE "+table+" SET writer = $1 WHERE sku = 'counter'", fmt.Sprint(v+1))
		})
		newerErr <- err
	}()
	<-read
	l := Lease{res, 1, "a"}
	_, err := guard.Exec(ctx, older, l, bump)
	close(olderDone)
	if err := <-newerErr; err != nil {
		t.Fatalf("the newer holder: %v", err)
	}
	wantStale(t, err, l, 2)
	if n := s.count(t, "SELECT CAST(writer AS bigint) FROM "+table+" WHERE sku = 'counter'"); n != 2 {
		t.Errorf("counter = %d, want 2 (an update was lost)", n)
	}
}
