package fence

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/testenv"
)

// A subscription that recorded its connection's failure while it waited
// for its confirmation forgets that failure once the connection works
// again: the connection is cut (each redial closed by the proxy) while a
// channel is subscribed, then restored. While cut, subscribe reports the
// connection's error; once a redial works, nothing records it any more,
// so a confirmation that is late cannot be reported as the old failure.
func TestPubSubHealClearsConnectionError(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := testenv.NewProxy(r.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	c, err := New(redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1}), WithPrefix("heal:"))
	require.NoError(t, err)
	defer c.Close(context.Background())
	n, ch := c.notify, "heal:{x}:ch"
	p.Cut()
	n.mu.Lock()
	n.chans.m[ch] = &psChannel{confirmed: make(chan struct{})}
	n.mu.Unlock()
	err = n.subscribe(ctx, ch)
	require.True(t, errors.Is(err, io.EOF), "while cut, the connection's error: %v", err)

	recorded := func() (broken bool, err error) {
		n.mu.Lock()
		defer n.mu.Unlock()
		pc := n.chans.get(ch)
		return pc.node.broken, pc.err
	}
	broken, err := recorded()
	require.True(t, broken)
	require.Error(t, err)
	p.Restore()
	require.Eventually(t, func() bool { broken, _ := recorded(); return !broken }, 10*time.Second, 5*time.Millisecond, "the connection works again")
	_, err = recorded()
	assert.NoError(t, err, "the connection's failure is no longer recorded")
	assert.NoError(t, n.subscribe(ctx, ch), "subscribed again after the redial")
}
