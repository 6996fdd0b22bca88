package guard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fencelock/fencelock/internal/oneline"
)

// Lease is what Exec needs of a lock: the resource it guards, its fencing
// token, and who holds it. *fence.Lock satisfies it.
type Lease interface {
	Name() string
	Token() int64
	Holder() string
}

// Claim is what a store is asked to check when a transaction starts and to
// record when it commits.
type Claim struct {
	// Resource is the lease's name: one fence per resource.
	Resource string
	// Token is the lease's fencing token (> 0).
	Token int64
	// Holder identifies the lease holder; the same token is accepted again
	// only from the same holder.
	Holder string
	// Key is the idempotency key, or "" for none.
	Key string
}

// Store is a transactional store that can check fencing tokens. Begin
// records c's token for c.Resource (committed at once, so that an older
// holder can no longer commit) and starts a transaction, holding no lock
// past the call: it returns an error wrapping ErrStaleToken (a
// *StaleTokenError) or ErrAlreadyApplied, with nothing left open, when the
// store has already seen a higher token (or the same token from another
// holder) for c.Resource, or has recorded c.Key.
// The returned transaction's Commit claims the fence and records the key,
// under the fence's lock, and commits only if the claim is accepted: the
// check at Begin lets a stale holder fail before it writes, the claim at
// Commit is the guarantee.
//
// *pgfence.Store implements Store[pgx.Tx].
type Store[Tx any] interface {
	Begin(ctx context.Context, c Claim) (Txn[Tx], error)
}

// ErrorMapper is implemented by stores whose errors have typed
// equivalents (such as a refusal raised by the database while fn writes);
// Exec passes fn's error through it. *pgfence.Store implements it.
type ErrorMapper interface {
	MapError(err error) error
}

// Txn is an open, checked transaction of a Store.
type Txn[Tx any] interface {
	// Tx is the handle fn writes through. Its own commit and rollback
	// must refuse with ErrTxOwned (the Txn owns the transaction); it must
	// not be usable after Commit or Rollback.
	Tx() Tx
	// Commit claims the fence (and records the key) and commits; a
	// refused claim is an error wrapping ErrStaleToken or
	// ErrAlreadyApplied, with nothing committed. Any error means nothing
	// was committed, except two that say so: ErrUnknownOutcome (the
	// connection was lost, or ctx ended, while the commit was in flight)
	// and ErrTxEnded (fn ended the transaction itself; Commit then sends
	// nothing).
	Commit(ctx context.Context) error
	// Rollback rolls back; it is safe to call after Commit and twice. It
	// returns an error wrapping ErrTxEnded when fn had already ended the
	// transaction itself.
	Rollback(ctx context.Context) error
}

// Result describes a committed Exec.
type Result struct {
	// Resource, Token and Holder are the lease's, as claimed.
	Resource string
	Token    int64
	Holder   string
	// Key is the idempotency key recorded with the write ("" for none).
	Key string
}

// RollbackTimeout bounds the rollback Exec runs after an error, a panic or
// a cancelled context.
const RollbackTimeout = 10 * time.Second

// Exec runs fn in one transaction of store that commits only if lease's
// token is still the newest the store has seen for lease.Name() (see the
// package documentation for the steps). The transaction belongs to Exec:
// the tx fn receives refuses Commit and Rollback (ErrTxOwned); fn returns
// nil to commit, an error to roll back.
//
// ctx bounds the whole call. If the lease has a Done channel, fn's context
// is also cancelled when the lease is lost, so that a lost holder stops
// writing early; the store's check stays the guarantee. The commit runs
// with ctx itself, not with the lease's context: once it is sent, the
// store decides, and losing the lease meanwhile does not turn a commit
// into an unknown outcome.
//
// The result keeps one invariant: err == nil if and only if fn's writes
// are committed. Errors: ErrInvalidLease, ErrInvalidOption, ErrNilStore,
// ErrNilFunc for bad input (nothing is written); a *LeaseLostError
// (ErrLeaseLost and the lease's cause); a *StaleTokenError
// (ErrStaleToken); ErrAlreadyApplied; fn's own error; or the store's
// error. In every error case nothing of the transaction is committed,
// with two exceptions that the error names: ErrUnknownOutcome (the
// connection was lost, or ctx ended, while the commit was in flight: use
// WithKey, and a retry tells with ErrAlreadyApplied) and ErrTxEnded (fn
// sent its own COMMIT or ROLLBACK: its writes may have committed without
// the fence check). A panic in fn rolls back and is re-raised. Every
// message is one line.
func Exec[Tx any](ctx context.Context, store Store[Tx], lease Lease, fn func(ctx context.Context, tx Tx) error, opts ...Option) (res Result, err error) {
	if store == nil {
		return Result{}, ErrNilStore
	}
	if fn == nil {
		return Result{}, ErrNilFunc
	}
	c, err := NewClaim(lease)
	if err != nil {
		return Result{}, err
	}
	var cfg config
	for _, o := range opts {
		if o == nil {
			return Result{}, fmt.Errorf("%w: nil Option", ErrInvalidOption)
		}
		if err := o.apply(&cfg); err != nil {
			return Result{}, err
		}
	}
	c.Key = cfg.key
	if obs := execObservers(store, cfg.observers); obs != nil {
		start := time.Now()
		defer func(ctx context.Context) { report(ctx, obs, c, start, res, err) }(ctx)
	}
	defer func() { err = interrupted(err, c.Key) }()
	// The lease first: ctx may be the lease's own context (lock.Context()),
	// and its loss must be named as such.
	w := watch{lease: lease}
	if err := w.lost(nil); err != nil {
		return Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	if err := run(ctx, &w, store, c, fn); err != nil {
		return Result{}, err
	}
	return Result(c), nil
}

// run is Exec's transaction: begin, fn, commit, with every error named by
// w (a lost lease is the one cause it names, whichever step it ended).
func run[Tx any](parent context.Context, w *watch, store Store[Tx], c Claim, fn func(ctx context.Context, tx Tx) error) error {
	// fn's context ends with parent or with the lease, whichever first;
	// the commit runs with parent (see watch.commitContext).
	ctx, stop := w.start(parent)
	defer stop()
	txn, err := store.Begin(ctx, c)
	if err != nil {
		return w.named(ctx, err)
	}
	// ended is set once the transaction is committed or rolled back; the
	// deferred rollback is for a panic in fn.
	ended := false
	defer func() {
		if !ended {
			_ = rollback(ctx, txn)
		}
	}()
	// abort rolls back after err and reports both err and, if fn had
	// ended the transaction itself, ErrTxEnded: then writes may have
	// committed, and err alone would say they did not.
	abort := func(err error) error {
		ended = true
		if rerr := rollback(ctx, txn); errors.Is(rerr, ErrTxEnded) {
			return oneline.Join(rerr, err)
		}
		return err
	}
	if err := fn(withTxn(ctx, txn), txn.Tx()); err != nil {
		if m, ok := store.(ErrorMapper); ok {
			// e.g. a protect trigger's refusal inside fn becomes the
			// store's typed error.
			err = m.MapError(err)
		}
		return abort(w.named(ctx, err))
	}
	// Last fast-path check: a lease known to be lost does not commit.
	if err := w.lost(nil); err != nil {
		return abort(err)
	}
	if err := context.Cause(ctx); err != nil {
		return abort(w.named(ctx, err))
	}
	// From here the store decides: the lease's loss no longer interrupts
	// (see watch.commitContext). The lease may still be lost while the
	// commit runs: the error says so, the caller's next step depends on it.
	ended = true
	cctx, cancelCommit := w.commitContext(parent)
	defer cancelCommit()
	if err := txn.Commit(cctx); err != nil {
		return w.named(ctx, err)
	}
	return nil
}

// rollback rolls txn back even when ctx is cancelled, without hanging on
// a dead connection (the server rolls back on its own when the connection
// goes).
func rollback[Tx any](ctx context.Context, txn Txn[Tx]) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RollbackTimeout)
	defer cancel()
	return txn.Rollback(rctx)
}

// NewClaim validates a lease and turns it into a claim (Key empty). Stores
// that offer calls of their own on a lease (such as pgfence's Advance) use
// it so that every entry point rejects the same bad input.
func NewClaim(lease Lease) (Claim, error) {
	if lease == nil {
		return Claim{}, fmt.Errorf("%w: nil lease: pass the lock returned by Acquire", ErrInvalidLease)
	}
	c := Claim{Resource: lease.Name(), Token: lease.Token(), Holder: lease.Holder()}
	switch {
	case c.Resource == "":
		return Claim{}, fmt.Errorf("%w: empty resource name (Name() == \"\")", ErrInvalidLease)
	case c.Token <= 0:
		return Claim{}, fmt.Errorf("%w: token must be > 0, got %d (a lease from fence.Acquire always has one)", ErrInvalidLease, c.Token)
	case c.Holder == "":
		return Claim{}, fmt.Errorf("%w: empty holder (Holder() == \"\")", ErrInvalidLease)
	case strings.IndexByte(c.Resource, 0) >= 0 || strings.IndexByte(c.Holder, 0) >= 0:
		return Claim{}, fmt.Errorf("%w: resource or holder contains a NUL byte", ErrInvalidLease)
	}
	return c, nil
}
