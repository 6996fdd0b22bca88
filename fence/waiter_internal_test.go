package fence

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/testenv"
)

// The wait ends at the earlier of ctx's end and the wait limit; the
// default limit applies only when ctx has no deadline. The default is
// shortened here to a stand-in of 300 ms (DefaultWaitLimit is a minute).
func TestWaitLimitAgainstDeadline(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	c, err := New(r.Client(), WithPrefix(r.Prefix+"fence:"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	const short, long = 300 * time.Millisecond, 1500 * time.Millisecond
	c.cfg.waitLimit = short // the default, not set by WithWaitLimit
	c.cfg.finish()

	bg := context.Background()
	held, err := c.TryAcquire(bg, "w")
	require.NoError(t, err)
	defer held.Release(bg)

	wait := func(ctx context.Context, opts ...LockOption) (time.Duration, error) {
		start := time.Now()
		l, err := c.Acquire(ctx, "w", opts...)
		require.Nil(t, l)
		require.ErrorIs(t, err, ErrNotAcquired)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		return time.Since(start), err
	}
	withTimeout := func(d time.Duration) context.Context {
		ctx, cancel := context.WithTimeout(bg, d)
		t.Cleanup(cancel)
		return ctx
	}

	// No deadline: the default limit ends the wait.
	took, err := wait(bg)
	assert.GreaterOrEqual(t, took, short)
	assert.Contains(t, err.Error(), "wait limit")

	// A deadline beyond the default: the deadline alone decides.
	took, err = wait(withTimeout(long))
	assert.GreaterOrEqual(t, took, long-10*time.Millisecond, "the default limit cut a wait the caller's deadline allowed")
	assert.NotContains(t, err.Error(), "wait limit")

	// WithWaitLimit shorter than the deadline: the limit decides.
	took, err = wait(withTimeout(20*time.Second), WithWaitLimit(short))
	assert.GreaterOrEqual(t, took, short)
	assert.Less(t, took, 10*time.Second)
	assert.Contains(t, err.Error(), "wait limit")

	// WithWaitLimit longer than the deadline: the deadline decides.
	took, err = wait(withTimeout(short), WithWaitLimit(20*time.Second))
	assert.GreaterOrEqual(t, took, short-10*time.Millisecond)
	assert.Less(t, took, 10*time.Second)
	assert.NotContains(t, err.Error(), "wait limit")
}
