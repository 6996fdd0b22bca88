package fence_test

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

type ctxKey struct{}

// lossOnly implements one event interface: the others are not required.
type lossOnly struct{ got chan fence.LossEvent }

func (o lossOnly) OnLoss(ctx context.Context, e fence.LossEvent) {
	if ctx.Value(ctxKey{}) != "trace-1" {
		e.Name = "ctx lost the acquiring call's values"
	}
	o.got <- e
}

func TestObserverEvents(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 20*time.Second)
	rec := newRecorder()
	loss := lossOnly{got: make(chan fence.LossEvent, 1)}
	c := newClient(t, r, nil, fence.WithObserver(rec), fence.WithObserver(loss))

	actx := context.WithValue(ctx, ctxKey{}, "trace-1")
	l, err := c.Acquire(actx, "ev", fence.WithLease(3*time.Second))
	require.NoError(t, err)
	assert.Equal(t, "trace-1", l.Context().Value(ctxKey{}), "the lock's context carries the acquiring call's values")

	// A contended TryAcquire is an event too.
	_, err = c.TryAcquire(ctx, "ev")
	require.ErrorIs(t, err, fence.ErrNotAcquired)
	acq := all[fence.AcquireEvent](rec)
	require.Len(t, acq, 2)
	assert.NoError(t, acq[0].Err)
	assert.Equal(t, l.Token(), acq[0].Token)
	assert.ErrorIs(t, acq[1].Err, fence.ErrNotAcquired)
	assert.Zero(t, acq[1].Token)
	assert.Greater(t, acq[1].Remaining, time.Second, "the holder's remaining lease")

	// Someone else takes the key: the loss says who.
	require.NoError(t, r.Client().SetArgs(ctx, lockKey(r, "ev"), "77:intruder", redis.SetArgs{KeepTTL: true}).Err())
	var e fence.LossEvent
	select {
	case e = <-loss.got:
	case <-ctx.Done():
		t.Fatal("no loss event")
	}
	assert.Equal(t, "ev", e.Name, "the loss event's ctx has the acquiring call's values")
	assert.Equal(t, l.Token(), e.Token)
	assert.Positive(t, e.Held)
	var lost *fence.LostError
	require.ErrorAs(t, e.Err, &lost)
	assert.ErrorIs(t, e.Err, fence.ErrLockLost)
	assert.Equal(t, fence.ReasonTaken, lost.Reason)
	assert.Equal(t, "intruder", lost.TakenBy)
	assert.EqualValues(t, 77, lost.TakenToken)
	assert.Equal(t, e.Err, l.Err(), "Lock.Err is the same cause")
	assert.Contains(t, l.Err().Error(), `holder "intruder" has it with token 77`)
	rec.waitCount(t, "lost", 1)
	assert.Positive(t, rec.count("renewed")+rec.count("renewalFailed")+1, "renewals observed")

	require.ErrorIs(t, l.Release(ctx), fence.ErrNotHeld)
	rec.waitCount(t, "released", 1)
}

// WithLogger writes one line per loss that says why, with durations as
// durations.
func TestLoggerSaysWhyLost(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 20*time.Second)
	var logs syncBuffer
	c := newClient(t, r, nil, fence.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	// The renewal (after lease/3) finds it taken long before the local
	// deadline, even on a loaded machine.
	l, err := c.Acquire(ctx, "log", fence.WithLease(3*time.Second))
	require.NoError(t, err)
	require.NoError(t, r.Client().SetArgs(ctx, lockKey(r, "log"), "5:someone-else", redis.SetArgs{KeepTTL: true}).Err())
	<-l.Done()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "lock lost") }, 5*time.Second, time.Millisecond)
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	require.Len(t, lines, 1, "one line per loss:\n%s", logs.String())
	line := lines[0]
	t.Log(line)
	assert.Contains(t, line, `msg="fence: lock lost"`)
	assert.Contains(t, line, "name=log")
	assert.Contains(t, line, "reason=taken")
	assert.Contains(t, line, "taken_by=someone-else")
	assert.Contains(t, line, "taken_token=5")
	assert.Regexp(t, regexp.MustCompile(`held=[0-9.]+m?s\b`), line)

	// A fixed lease that ran out says so.
	logs.mu.Lock()
	logs.b.Reset()
	logs.mu.Unlock()
	f, err := c.Acquire(ctx, "log2", fence.WithFixedLease(200*time.Millisecond))
	require.NoError(t, err)
	<-f.Done()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "reason=lease_ended") }, 5*time.Second, time.Millisecond)
}

// releaseOnly records release events.
type releaseOnly struct{ got chan fence.ReleaseEvent }

func (o releaseOnly) OnRelease(_ context.Context, e fence.ReleaseEvent) { o.got <- e }

// A release event says how long the release call took (a span covers it),
// by Lock.Release and by Client.Close alike.
func TestReleaseEventDuration(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 20*time.Second)
	rel := releaseOnly{got: make(chan fence.ReleaseEvent, 2)}
	c := newClient(t, r, nil, fence.WithObserver(rel))
	l, err := c.Acquire(ctx, "rel")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	e := <-rel.got
	assert.NoError(t, e.Err)
	assert.Positive(t, e.Duration, "the release's round trip")
	assert.LessOrEqual(t, e.Duration, e.Held)

	_, err = c.Acquire(ctx, "rel-close")
	require.NoError(t, err)
	require.NoError(t, c.Close(ctx))
	e = <-rel.got
	assert.Equal(t, "rel-close", e.Name)
	assert.NoError(t, e.Err)
	assert.Positive(t, e.Duration, "Close's round trip")
}
