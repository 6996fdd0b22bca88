package fence_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

func TestNewRejectsBadOptions(t *testing.T) {
	r := testenv.NewRedis(t)
	for _, tc := range []struct {
		name string
		opt  fence.ClientOption
		want string
	}{
		{"zero lease", fence.WithLease(0), "at least"},
		{"negative lease", fence.WithLease(-time.Second), "at least"},
		{"short lease", fence.WithLease(50 * time.Millisecond), "at least 100ms"},
		{"short fixed lease", fence.WithFixedLease(time.Millisecond), "at least"},
		{"zero wait", fence.WithWaitLimit(0), "must be positive"},
		{"negative wait", fence.WithWaitLimit(-time.Second), "must be positive"},
		{"negative max hold", fence.WithMaxHold(-1), "must be positive"},
		{"negative replicas", fence.WithReplicaSync(-1, time.Second), "replicas"},
		{"replica timeout", fence.WithReplicaSync(1, 0), "timeout must be positive"},
		{"prefix brace", fence.WithPrefix("a{"), "'{' or '}'"},
		{"nil logger", fence.WithLogger(nil), "WithLogger(nil)"},
		{"nil observer", fence.WithObserver(nil), "WithObserver(nil)"},
		{"empty holder", fence.WithHolder(""), "WithHolder"},
		{"nil option", nil, "nil ClientOption"},
		{"observer of no event", fence.WithObserver(struct{}{}), "implements none of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := fence.New(r.Client(), tc.opt)
			require.ErrorIs(t, err, fence.ErrInvalidOption)
			assert.Nil(t, c)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err := fence.New(nil)
	assert.ErrorIs(t, err, fence.ErrInvalidOption)
	var nilClient *redis.Client
	_, err = fence.New(nilClient)
	assert.ErrorIs(t, err, fence.ErrInvalidOption)
	ring := redis.NewRing(&redis.RingOptions{})
	defer ring.Close()
	_, err = fence.New(ring)
	assert.ErrorIs(t, err, fence.ErrInvalidOption)
	assert.ErrorContains(t, err, "*redis.Ring is refused: each Ring client maps a name to a server by its own view")
}

func TestAcquireRejectsBadInput(t *testing.T) {
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 10*time.Second)
	c := newClient(t, r, nil)
	for _, tc := range []struct {
		name string
		lock string
		opts []fence.LockOption
		want error
	}{
		{"empty name", "", nil, fence.ErrInvalidName},
		{"long name", string(make([]byte, 513)), nil, fence.ErrInvalidName},
		{"brace", "a}", nil, fence.ErrInvalidName},
		{"zero lease", "x", []fence.LockOption{fence.WithLease(0)}, fence.ErrInvalidOption},
		{"zero wait", "x", []fence.LockOption{fence.WithWaitLimit(0)}, fence.ErrInvalidOption},
		{"nil option", "x", []fence.LockOption{nil}, fence.ErrInvalidOption},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Acquire(ctx, tc.lock, tc.opts...)
			assert.ErrorIs(t, err, tc.want)
			_, err = c.TryAcquire(ctx, tc.lock, tc.opts...)
			assert.ErrorIs(t, err, tc.want)
			err = c.Do(ctx, tc.lock, func(context.Context, *fence.Lock) error { return nil }, tc.opts...)
			assert.ErrorIs(t, err, tc.want)
		})
	}
	assert.ErrorIs(t, c.Do(ctx, "x", nil), fence.ErrInvalidOption)
	keys, err := r.Client().Keys(ctx, r.Prefix+"*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys, "bad input wrote nothing")
}
