package fence_test

import (
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// A process holds a lock with the defaults and is SIGKILLed while a
// process waits for it (this one, with the defaults too). The waiter says
// once, at Info on the client's logger and to its observers, who holds
// the lock (the other process, by host and pid) and until when, after
// LongWait; the lock passes to it when the dead holder's lease runs out,
// at most DefaultLease after the crash.
func TestCrashedHolderPassesAtLeaseEnd(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, time.Minute)
	child, token, holder := startHolderProcess(t, r, "")
	host, err := os.Hostname()
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(holder, fence.HostPart(host)+":"+strconv.Itoa(child.Process.Pid)+":"),
		"the holder id %q names the holder's host and pid %d", holder, child.Process.Pid)

	logs, rec := newLogWatch(), newRecorder()
	c := newClient(t, r, nil, fence.WithLogger(slog.New(slog.NewTextHandler(logs, nil))), fence.WithObserver(rec))
	got := make(chan *fence.Lock, 1)
	go func() {
		l, err := c.Acquire(ctx, "proc")
		assert.NoError(t, err)
		got <- l
	}()
	const said = `level=INFO msg="fence: still waiting for a lock held by another holder" name=proc waited=`
	line := logs.waitFor(t, said)
	assert.Contains(t, line, " holder="+holder+" token="+strconv.FormatInt(token, 10)+" until=")
	assert.Contains(t, line, " lease_left=")
	// The observer hears of it after the log line is written: wait for it.
	rec.waitCount(t, "longWait", 1)
	long := all[fence.LongWaitEvent](rec)
	require.Len(t, long, 1)
	assert.Equal(t, holder, long[0].Holder)
	assert.Equal(t, token, long[0].Token)
	assert.GreaterOrEqual(t, long[0].Waited, fence.LongWait)
	assert.False(t, long[0].Until.IsZero(), "until when the holder's lease runs")

	require.NoError(t, child.Process.Kill()) // crash: no release
	_ = child.Wait()
	killed := time.Now()
	pttl, err := r.Client().PTTL(ctx, lockKey(r, "proc")).Result()
	require.NoError(t, err)
	assert.LessOrEqual(t, pttl, fence.DefaultLease, "the crashed holder's lock lasts at most a lease")
	assert.LessOrEqual(t, pttl, 10*time.Second, "at the defaults, a crashed holder's lock passes within 10 s")
	select {
	case l := <-got:
		require.NotNil(t, l)
		t.Logf("the lock passed %v after the SIGKILL (lease left then: %v)", time.Since(killed).Round(time.Millisecond), pttl)
		assert.Greater(t, l.Token(), token)
		require.NoError(t, l.Release(ctx))
	case <-ctx.Done():
		t.Fatal("the waiter never got the crashed holder's lock")
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "still waiting"), "once per wait:\n%s", logs.String())
	assert.Len(t, all[fence.LongWaitEvent](rec), 1, "once per wait")
}
