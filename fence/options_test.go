package fence_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

func TestNewRejectsBadOptions(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	for _, tc := range []struct {
		name string
		opt  fence.ClientOption
		want string
	}{
		{"max hold below the minimum lease", fence.WithMaxHold(time.Millisecond), "at least 100ms (MinLease), or 0"},
		{"empty prefix", fence.WithPrefix(""), `keep the default "fence:" or give a prefix of your own`},
		{"prefix with a newline", fence.WithPrefix("a\nb:"), "control character (U+000A at byte 1)"},
		{"prefix not UTF-8", fence.WithPrefix("\xff:"), "not valid UTF-8 (at byte 0)"},
		{"holder with a NUL", fence.WithHolder("h\x00"), "control character (U+0000 at byte 1)"},
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
	// Two options for one setting contradict each other: refused, naming
	// both, rather than the last one silently winning.
	for _, tc := range []struct {
		opts []fence.ClientOption
		want string
	}{
		{[]fence.ClientOption{fence.WithLease(time.Second), fence.WithFixedLease(2 * time.Second)},
			"WithLease(1s) and WithFixedLease(2s) both set the lease; pass one of them"},
		{[]fence.ClientOption{fence.WithLease(time.Second), fence.WithLease(2 * time.Second)},
			"WithLease(1s) and WithLease(2s) both set the lease"},
		{[]fence.ClientOption{fence.WithPrefix("a:"), fence.WithPrefix("b:")}, `WithPrefix("a:") and WithPrefix("b:") both set the key prefix`},
		{[]fence.ClientOption{fence.WithWaitLimit(time.Second), fence.WithWaitLimit(time.Minute)}, "both set the wait limit"},
		{[]fence.ClientOption{fence.WithMaxHold(time.Second), fence.WithMaxHold(0)}, "both set the max hold"},
		{[]fence.ClientOption{fence.WithHolder("a"), fence.WithHolder("b")}, "both set the holder id"},
		{[]fence.ClientOption{fence.WithReplicaSync(1, time.Second), fence.WithReplicaSync(0, 0)}, "both set replica sync"},
		{[]fence.ClientOption{fence.WithLogger(slog.Default()), fence.WithLogger(slog.Default())}, "both set the logger"},
	} {
		c, err := fence.New(r.Client(), tc.opts...)
		require.ErrorIs(t, err, fence.ErrInvalidOption)
		assert.Nil(t, c)
		assert.ErrorContains(t, err, tc.want)
	}
	// Several observers are not a contradiction.
	c, err := fence.New(r.Client(), fence.WithObserver(newRecorder()), fence.WithObserver(newRecorder()))
	require.NoError(t, err)
	require.NoError(t, c.Close(context.Background()))

	_, err = fence.New(nil)
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
	t.Parallel()
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
		{"NUL in name", "a\x00b", nil, fence.ErrInvalidName},
		{"newline in name", "a\nb", nil, fence.ErrInvalidName},
		{"name not UTF-8", "\xff\xfe", nil, fence.ErrInvalidName},
		{"lease and fixed lease", "x", []fence.LockOption{fence.WithLease(time.Second), fence.WithFixedLease(time.Second)}, fence.ErrInvalidOption},
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
	// A call's option overrides the client's default for the same
	// setting: that is no contradiction.
	d := newClient(t, r, nil, fence.WithLease(time.Second))
	l, err := d.TryAcquire(ctx, "override", fence.WithFixedLease(2*time.Second))
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	keys, err := r.Client().Keys(ctx, r.Prefix+"*").Result()
	require.NoError(t, err)
	assert.Equal(t, []string{lockKey(r, "override") + ":seq"}, keys, "bad input wrote nothing")
}
