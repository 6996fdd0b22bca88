package fence

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type ctxKey struct{}

// A release's context keeps the caller's values, drops its cancellation,
// and ends within releaseTimeout to releaseTimeout+boundStep; the releases
// of one boundStep share one deadline (no timer each), the next step's get
// a new one.
func TestReleaseBound(t *testing.T) {
	var b releaseBound
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
	var b releaseBound
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
	var b releaseBound
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
