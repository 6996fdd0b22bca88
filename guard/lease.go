package guard

import (
	"context"
	"errors"
	"time"
)

// CommitTimeout bounds a commit that is already on its way when the lease
// is lost and the lease's loss cancels ctx (ctx derived from the lease's
// own context, as with Exec(lock.Context(), ...)).
const CommitTimeout = 30 * time.Second

// What Exec may learn of a lease beyond Lease: whether it is lost (Done),
// why (Err, or the cause of Context), and a context that ends with it.
type (
	doner     interface{ Done() <-chan struct{} }
	errer     interface{ Err() error }
	contexter interface {
		doner
		Context() context.Context
	}
)

// watch is Exec's one view of a lease's loss: the one watcher that ends
// fn's context when the lease is lost, and the one place that names the
// loss (a *LeaseLostError with the lease's own cause) in whatever error
// it ended.
type watch struct {
	lease Lease
}

// start returns fn's context: parent, also cancelled with a
// *LeaseLostError as its cause once the lease is lost. A lease with a
// context (*fence.Lock) is watched by a callback on it, any other lease
// with a Done channel by a goroutine; stop ends the watch.
func (w *watch) start(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	lostNow := func() { cancel(&LeaseLostError{Cause: leaseCause(w.lease)}) }
	var unwatch func() bool
	switch l := w.lease.(type) {
	case contexter:
		unwatch = context.AfterFunc(l.Context(), lostNow)
	case doner:
		quit, exited := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(exited)
			select {
			case <-l.Done():
				lostNow()
			case <-quit:
			}
		}()
		unwatch = func() bool { close(quit); <-exited; return true }
	default:
		unwatch = func() bool { return true }
	}
	return ctx, func() { unwatch(); cancel(nil) }
}

// lost returns nil while the lease holds (or cannot tell: it has no Done
// method), else a *LeaseLostError with the lease's cause and err (what the
// loss ended, or nil).
func (w *watch) lost(err error) error {
	d, ok := w.lease.(doner)
	if !ok {
		return nil
	}
	select {
	case <-d.Done():
	default:
		return nil
	}
	if errors.As(err, new(*LeaseLostError)) {
		return err
	}
	return &LeaseLostError{Cause: leaseCause(w.lease), Err: err}
}

// named is err, named as the lease's loss when the lease is lost, or when
// the loss cancelled ctx (fn's context: the driver then reports a bare
// "context canceled", the lease knows why).
func (w *watch) named(ctx context.Context, err error) error {
	if lerr := w.lost(err); lerr != nil {
		return lerr
	}
	var cause *LeaseLostError
	if !errors.As(context.Cause(ctx), &cause) || errors.As(err, new(*LeaseLostError)) {
		return err
	}
	return &LeaseLostError{Cause: cause.Cause, Err: err}
}

// commitContext is the context of the commit: parent, except that a
// cancellation of parent caused by the lease's loss does not interrupt
// it (that would cut a COMMIT in flight and make its outcome unknown; the
// store decides). Such a commit is bounded by parent's deadline, if any,
// and CommitTimeout from the loss.
func (w *watch) commitContext(parent context.Context) (context.Context, context.CancelFunc) {
	if _, ok := w.lease.(doner); !ok {
		return parent, func() {}
	}
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	cancelDl := context.CancelFunc(func() {})
	if dl, ok := parent.Deadline(); ok {
		ctx, cancelDl = context.WithDeadline(ctx, dl)
	}
	stop := context.AfterFunc(parent, func() {
		if !errors.Is(parent.Err(), context.Canceled) || w.lost(nil) == nil {
			cancel(context.Cause(parent))
			return
		}
		// The lease's loss: the commit goes on, for CommitTimeout at most.
		// The timer stops when the commit's context ends, even if that
		// came first.
		t := time.AfterFunc(CommitTimeout, func() { cancel(context.DeadlineExceeded) })
		context.AfterFunc(ctx, func() { t.Stop() })
	})
	return ctx, func() {
		stop()
		cancel(nil)
		cancelDl()
	}
}

// LeaseLost returns nil while lease holds (or cannot tell: it has no
// Done method), else a *LeaseLostError with the lease's cause and err
// (what the loss ended, or nil). Stores' calls of their own on a lease
// (such as Advance) use it to refuse a lost, released or closed lease as
// Exec refuses it.
func LeaseLost(lease Lease, err error) error { return (&watch{lease: lease}).lost(err) }

// leaseCause is the lost lease's own reason: the cause of its context, or
// its Err().
func leaseCause(lease Lease) error {
	if c, ok := lease.(contexter); ok {
		if cause := context.Cause(c.Context()); cause != nil {
			return cause
		}
	}
	if e, ok := lease.(errer); ok {
		return e.Err()
	}
	return nil
}
