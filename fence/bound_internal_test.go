package fence

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/testenv"
)

type ctxKey struct{}

// A release's context keeps the caller's values, drops its cancellation,
// and ends within releaseTimeout to releaseTimeout+boundStep; the releases
// of one boundStep share one deadline (no timer each), the next step's get
// a new one.
func TestReleaseBound(t *testing.T) {
	b := &sharedBound{d: releaseTimeout, step: boundStep}
	caller, cancel := context.WithCancelCause(context.WithValue(context.Background(), ctxKey{}, "trace"))
	now := time.Now()
	ctx := b.detach(caller, now)
	after := time.Now()
	cancel(context.Canceled)

	assert.Equal(t, "trace", ctx.Value(ctxKey{}), "the caller's values reach go-redis's hooks")
	assert.NoError(t, ctx.Err(), "the caller's cancellation does not end a release")
	assert.NoError(t, context.Cause(ctx), "nor does its cause show through")
	select {
	case <-ctx.Done():
		t.Fatal("done with the caller")
	default:
	}
	dl, ok := ctx.Deadline()
	require.True(t, ok, "a release is bounded")
	assert.False(t, dl.Before(now.Add(releaseTimeout)), "at least releaseTimeout: %v", dl.Sub(now))
	assert.False(t, dl.After(after.Add(releaseTimeout+boundStep)), "at most releaseTimeout+boundStep: %v", dl.Sub(now))

	same := b.detach(context.Background(), now.Add(boundStep/2))
	assert.Equal(t, ctx.Done(), same.Done(), "releases within a step share one bound")
	next := b.detach(context.Background(), now.Add(boundStep))
	assert.NotEqual(t, ctx.Done(), next.Done(), "a step later, a new bound")
	dl2, _ := next.Deadline()
	assert.False(t, dl2.Before(now.Add(boundStep+releaseTimeout)), "the new bound gives releaseTimeout from its step: %v", dl2.Sub(now))
}

// A shared bound ends the releases that took it at its deadline, with
// context.DeadlineExceeded.
func TestReleaseBoundEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	b := &sharedBound{d: releaseTimeout, step: boundStep}
	b.cur.Store(&boundEpoch{ctx: ctx, cancel: cancel, until: time.Now().Add(time.Hour)})
	d := b.detach(context.Background(), time.Now())
	select {
	case <-d.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the bound's deadline did not end the release's context")
	}
	assert.ErrorIs(t, d.Err(), context.DeadlineExceeded)
	assert.ErrorIs(t, context.Cause(d), context.DeadlineExceeded)
}

// A context derived from a release's (go-redis derives one to dial) ends
// with the shared bound, and stays independent of the caller.
func TestReleaseBoundDerived(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	b := &sharedBound{d: releaseTimeout, step: boundStep}
	b.cur.Store(&boundEpoch{ctx: ctx, cancel: cancel, until: time.Now().Add(time.Hour)})
	caller, stop := context.WithCancel(context.Background())
	child, childCancel := context.WithTimeout(b.detach(caller, time.Now()), time.Hour)
	defer childCancel()
	stop()
	// The bound may already have ended on a slow machine: the caller's
	// cancellation must not show either way.
	assert.NotErrorIs(t, child.Err(), context.Canceled, "the caller's cancellation does not reach it")
	select {
	case <-child.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the shared bound's end did not end the derived context")
	}
	assert.ErrorIs(t, context.Cause(child), context.DeadlineExceeded, "ended by the bound, not by the caller")
}

// The first attempt of an Acquire whose ctx has no cancellation takes its
// end from the client's shared bound: exactly the wait limit on what
// reads the deadline, the epoch's Done shared by the calls of one step,
// and the wait limit's cause once the deadline has passed. A ctx that
// can be cancelled, a wait limit other than the client's, or one too
// short to share (under 64 × minBoundStep) gets a context of its own; a
// ctx deadline without WithWaitLimit is the bound itself.
func TestAttemptBound(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	c := newTestClient(t, r)
	bg := context.WithValue(context.Background(), ctxKey{}, "trace")
	start := time.Now()

	ctx, cancel, shared := c.attemptContext(bg, &c.cfg, start)
	defer cancel()
	require.True(t, shared, "no cancellation, the client's limit: the shared bound")
	dl, ok := ctx.Deadline()
	require.True(t, ok)
	assert.Equal(t, start.Add(DefaultWaitLimit), dl, "the wait limit exactly")
	assert.Equal(t, "trace", ctx.Value(ctxKey{}))
	assert.NoError(t, ctx.Err())
	bdl, _ := ctx.(detached).bound.Deadline()
	assert.False(t, bdl.Before(dl), "Done closes no earlier than the deadline")
	assert.False(t, bdl.After(dl.Add(c.waitBound.step)), "nor more than a step later")
	again, _, _ := c.attemptContext(bg, &c.cfg, start.Add(c.waitBound.step/2))
	assert.Equal(t, ctx.Done(), again.Done(), "the calls of one step share one Done")

	// Past the deadline, before the epoch's end: ended, with the wait
	// limit's cause.
	past := c.waitBound.until(bg, start, start.Add(-time.Millisecond))
	assert.True(t, ctxEnded(past))
	err := notAcquiredCtx(past, "x")
	assert.ErrorIs(t, err, ErrNotAcquired)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "wait limit 1m0s reached")

	cancellable, stop := context.WithCancel(bg)
	defer stop()
	ctx, cancel, shared = c.attemptContext(cancellable, &c.cfg, start)
	defer cancel()
	assert.False(t, shared, "a ctx that can be cancelled: a context of its own")
	dl, _ = ctx.Deadline()
	assert.Equal(t, start.Add(DefaultWaitLimit), dl)

	cfg, err := c.lockConfig("x", []LockOption{WithWaitLimit(5 * time.Second)})
	require.NoError(t, err)
	_, cancel, shared = c.attemptContext(bg, &cfg, start)
	defer cancel()
	assert.False(t, shared, "another wait limit than the client's")

	withDeadline, stop2 := context.WithTimeout(bg, time.Second)
	defer stop2()
	ctx, cancel, shared = c.attemptContext(withDeadline, &c.cfg, start)
	defer cancel()
	assert.False(t, shared)
	assert.Equal(t, withDeadline, ctx, "ctx's deadline bounds it, without WithWaitLimit")

	short := newTestClient(t, r, WithWaitLimit(600*time.Millisecond))
	_, cancel, shared = short.attemptContext(bg, &short.cfg, start)
	defer cancel()
	assert.False(t, shared, "a step under minBoundStep: a context of its own")
	limited := newTestClient(t, r, WithWaitLimit(time.Second))
	ctx, cancel, shared = limited.attemptContext(bg, &limited.cfg, start)
	defer cancel()
	assert.True(t, shared, "the client's own WithWaitLimit")
	dl, _ = ctx.Deadline()
	assert.Equal(t, start.Add(time.Second), dl)
}
