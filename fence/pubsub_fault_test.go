package fence_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// splitPubSub is a client whose pub/sub connections go to the server
// through their own address (a proxy), while its commands go straight to
// it: a fault of the proxy hits the subscription alone.
type splitPubSub struct {
	*redis.Client
	ps *redis.Client
}

func (s splitPubSub) Subscribe(ctx context.Context, channels ...string) *redis.PubSub {
	return s.ps.Subscribe(ctx, channels...)
}

func (s splitPubSub) SSubscribe(ctx context.Context, channels ...string) *redis.PubSub {
	return s.ps.SSubscribe(ctx, channels...)
}

// The pub/sub connection alone fails while commands work: it is killed
// (CLIENT KILL TYPE pubsub) and its redials are refused (the proxy in
// front of the subscription is cut: it closes each), so a new waiter's
// subscription records the connection's error and is never confirmed. That is reported as a
// subscription matter, with the error, and not as Redis being
// unreachable; the waiters get their locks by their heartbeats.
func TestPubSubFaultIsNotAnOutage(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 30*time.Second)
	p, ps := proxied(t, r.Addr, redis.Options{MaxRetries: -1})
	var logs syncBuffer
	c := newClient(t, r, splitPubSub{Client: r.NewClient(nil), ps: ps},
		fence.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), fence.WithLiveness(time.Second))
	holder := newClient(t, r, nil)

	first, err := holder.Acquire(ctx, "ps1")
	require.NoError(t, err)
	got1 := acquireAsync(ctx, c, "ps1")
	waitSubscribers(t, r, "ps1", 1, "the waiter's subscription works before the fault")
	killed, err := r.Client().ClientKillByFilter(ctx, "TYPE", "pubsub").Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, killed)
	p.Cut()

	second, err := holder.Acquire(ctx, "ps2")
	require.NoError(t, err)
	got2 := acquireAsync(ctx, c, "ps2")
	waitQueued(t, r, "ps2", 1) // its first call was answered
	// The subscription gives up after a second without confirmation.
	assert.Eventually(t, func() bool { return strings.Contains(logs.String(), "fence: ") }, 10*time.Second, 5*time.Millisecond,
		"the failed subscription is reported")

	require.NoError(t, first.Release(ctx))
	require.NoError(t, second.Release(ctx))
	for _, got := range []<-chan acquireResult{got1, got2} {
		a := <-got
		require.NoError(t, a.err, "the waiter got the lock by its heartbeat")
		require.NoError(t, a.l.Release(ctx))
	}
	lines := fenceLines(logs.String())
	t.Logf("fence logged:\n%s", strings.Join(lines, "\n"))
	require.Len(t, lines, 1, "%s", logs.String())
	assert.Contains(t, lines[0], `level=WARN msg="fence: cannot subscribe to lock notifications; `)
	// Either name: the killed connection's resubscription of ps1 and the
	// new waiter's subscription of ps2 both meet the cut, and the first
	// to give up is the one reported (ps1 once in a fresh clone's run).
	assert.True(t, strings.Contains(lines[0], "name=ps1 ") || strings.Contains(lines[0], "name=ps2 "), "names a waiter's lock: %s", lines[0])
	assert.True(t, strings.HasSuffix(lines[0], " err=EOF"), "with the pub/sub connection's error (the cut proxy closes each redial)")
	assert.NotContains(t, logs.String(), "unreachable", "commands work: not an outage")
}
