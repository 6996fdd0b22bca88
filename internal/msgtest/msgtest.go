// Package msgtest checks error messages the way an operator reads them:
// one line, each cause named once, one prefix per layer. The stores'
// tests walk their failure paths with it, and share their other helpers
// here (NewStore, NewAppRole).
package msgtest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/pgstore"
)

// Layers are the package prefixes a fencelock message may carry, each at
// most once.
var Layers = []string{"fence: ", "guard: ", "pgfence: ", "sqlfence: "}

// Check fails t unless err matches want, is one line, names cause (a
// phrase of the message) exactly once, and carries no layer prefix twice.
func Check(t testing.TB, what string, err, want error, cause string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: want an error matching %q, got %v", what, want, err)
		return
	}
	msg := err.Error()
	t.Logf("%s: %s", what, msg)
	if strings.ContainsAny(msg, "\r\n") {
		t.Errorf("%s: the message spans lines: %q", what, msg)
	}
	if n := strings.Count(msg, cause); n != 1 {
		t.Errorf("%s: %q is named %d times in %q, want once", what, cause, n, msg)
	}
	for _, p := range Layers {
		if n := countLayer(msg, p); n > 1 {
			t.Errorf("%s: prefix %q appears %d times in %q", what, p, n, msg)
		}
	}
}

// countLayer counts the layer prefix p in msg where it starts a word:
// "fence: " inside "sqlfence: " is sqlfence's layer, not fence's.
func countLayer(msg, p string) int {
	n := 0
	for i := 0; ; {
		j := strings.Index(msg[i:], p)
		if j < 0 {
			return n
		}
		if k := i + j; k == 0 || !isLetter(msg[k-1]) {
			n++
		}
		i += j + len(p)
	}
}

func isLetter(b byte) bool { return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' }

// Target is what Walk drives: a store of this module and its own calls.
type Target[Tx any] struct {
	Store   guard.Store[Tx]
	Advance func(ctx context.Context, lease guard.Lease) error
	Prune   func(ctx context.Context, olderThan time.Duration) (int64, error)
	// Step runs a run's step with no fn.
	Step func(ctx context.Context, lease guard.Lease, runKey, cursor string) error
	// Finish finishes a run, and Resume reads it (WalkRefused only).
	Finish func(ctx context.Context, lease guard.Lease, runKey string) error
	Resume func(ctx context.Context, lease guard.Lease, runKey string) (cursor string, finished bool, err error)
	// Write writes one row in tx.
	Write func(ctx context.Context, tx Tx) error
	// BadOption builds a store with WithLockTimeout(0).
	BadOption func() error
}

// Walk walks the common failure paths as a user meets them, with real
// fence locks from locks: a lease lost in Exec (before it, while fn runs,
// under the lock's own context), in Advance, in a run's step and in
// fence's Do, a stale
// token, an applied key, bad input; and checks each message with Check.
func Walk[Tx any](t *testing.T, ctx context.Context, locks *fence.Client, tg Target[Tx]) {
	t.Helper()
	waitFn := func(ctx context.Context, tx Tx) error {
		<-ctx.Done()
		return tg.Write(ctx, tx)
	}
	const lost = "its fixed lease ran out"
	for _, viaLock := range []bool{false, true} {
		l, err := locks.Acquire(ctx, "msg", fence.WithFixedLease(fence.MinLease))
		if err != nil {
			t.Fatal(err)
		}
		execCtx := ctx
		if viaLock {
			execCtx = l.Context()
		}
		_, err = guard.Exec(execCtx, tg.Store, l, waitFn)
		Check(t, "lost while fn runs", err, fence.ErrLockLost, lost)
		_, err = guard.Exec(execCtx, tg.Store, l, tg.Write)
		Check(t, "lost before Exec", err, guard.ErrLeaseLost, lost)
		Check(t, "Advance of a lost lock", tg.Advance(ctx, l), guard.ErrLeaseLost, lost)
		Check(t, "run step of a lost lock", tg.Step(execCtx, l, "run", "1"), guard.ErrLeaseLost, lost)
	}

	err := locks.Do(ctx, "msg-do", func(ctx context.Context, l *fence.Lock) error {
		_, err := guard.Exec(l.Context(), tg.Store, l, waitFn)
		return err
	}, fence.WithFixedLease(fence.MinLease))
	Check(t, "lost in fence's Do", err, guard.ErrLeaseLost, lost)

	a, b := guardtest.Lease{Resource: "msg-stale", Tok: 5, Who: "a"}, guardtest.Lease{Resource: "msg-stale", Tok: 4, Who: "b"}
	if _, err := guard.Exec(ctx, tg.Store, a, tg.Write); err != nil {
		t.Fatal(err)
	}
	_, err = guard.Exec(ctx, tg.Store, b, tg.Write)
	Check(t, "stale token", err, guard.ErrStaleToken, "stale fencing token")
	Check(t, "Advance of a stale token", tg.Advance(ctx, b), guard.ErrStaleToken, "stale fencing token")
	if _, err := guard.Exec(ctx, tg.Store, a, tg.Write, guard.WithKey("k")); err != nil {
		t.Fatal(err)
	}
	_, err = guard.Exec(ctx, tg.Store, a, tg.Write, guard.WithKey("k"))
	Check(t, "applied key", err, guard.ErrAlreadyApplied, "already applied")

	_, err = guard.Exec(ctx, tg.Store, a, tg.Write, guard.WithKey(strings.Repeat("k", guard.MaxKeyLen+1)))
	Check(t, "oversized key", err, guard.ErrInvalidInput, "at most 1024")
	_, err = guard.Exec(ctx, tg.Store, guardtest.Lease{Resource: "msg-stale", Tok: 5, Who: "a\xff"}, tg.Write)
	Check(t, "invalid UTF-8", err, guard.ErrInvalidInput, "not valid UTF-8")
	Check(t, "empty run key", tg.Step(ctx, a, "", "1"), guard.ErrInvalidInput, "empty run key")
	_, err = tg.Prune(ctx, -1)
	Check(t, "negative prune age", err, guard.ErrInvalidInput, "negative age")
	Check(t, "bad option", tg.BadOption(), guard.ErrInvalidOption, "at least 1ms")
}

// Runs are the calls a store's resumable run has (pgfence.Run,
// sqlfence.Run).
type Runs[Tx any] interface {
	Step(ctx context.Context, newCursor string, fn func(ctx context.Context, tx Tx) error) error
	Finish(ctx context.Context) error
	Resume(ctx context.Context) (cursor string, finished bool, err error)
}

// Store is what the stores of this module have besides guard.Store.
type Store[Tx any, R Runs[Tx]] interface {
	guard.Store[Tx]
	Advance(ctx context.Context, lease guard.Lease) error
	Prune(ctx context.Context, olderThan time.Duration) (int64, error)
	Run(lease guard.Lease, runKey string) R
}

// StoreTarget is s as a Target, without Write and BadOption.
func StoreTarget[Tx any, R Runs[Tx], S Store[Tx, R]](s S) Target[Tx] {
	return Target[Tx]{
		Store:   s,
		Advance: s.Advance,
		Prune:   s.Prune,
		Step: func(ctx context.Context, l guard.Lease, key, cursor string) error {
			return s.Run(l, key).Step(ctx, cursor, nil)
		},
		Finish: func(ctx context.Context, l guard.Lease, key string) error { return s.Run(l, key).Finish(ctx) },
		Resume: func(ctx context.Context, l guard.Lease, key string) (string, bool, error) {
			return s.Run(l, key).Resume(ctx)
		},
	}
}

// NewStore returns newStore(db, opts...) (pgfence.New, sqlfence.New), or
// fails t with its error.
func NewStore[DB, S any](t testing.TB, newStore func(DB, ...pgstore.Option) (S, error), db DB, opts ...pgstore.Option) S {
	t.Helper()
	s, err := newStore(db, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}
