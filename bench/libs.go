package main

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/fence"
)

// Settings every library gets, stated in the results.
const (
	// peerTTL is the lock TTL of the peers: redsync's default expiry, used
	// for redislock too so both keep a lock equally long.
	peerTTL = 8 * time.Second
	// redislockBackoff is the retry redislock's documentation shows
	// (LinearBackoff(100ms)); redislock does not retry by default.
	redislockBackoff = 100 * time.Millisecond
	// poolSize is the same for every library's go-redis client: with
	// GOMAXPROCS=1 go-redis would default to 10 connections, fewer than
	// the 16 goroutines of the parallel and contended scenarios.
	poolSize = 32
	// fastPollBackoff and fastPollName: the informational variant of
	// redislock that polls every millisecond.
	fastPollBackoff = time.Millisecond
	fastPollName    = "redislock-1ms"
)

// counter is a go-redis hook counting what a client sends: round trips
// (one per command or per pipeline) and commands (pipelined ones counted
// one by one). When timing is on it also records the span of every
// pipeline, which is how a renewal round is timed from outside the
// library.
type counter struct {
	roundTrips atomic.Int64
	cmds       atomic.Int64

	mu     sync.Mutex
	timing bool
	spans  []span
	// captured holds the arguments of every pipelined command sent while
	// timing is on: the renewal floor replays them.
	captured [][]any
}

type span struct {
	start, end time.Time
	cmds       int
}

func (c *counter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(ctx, network, addr)
	}
}

func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.roundTrips.Add(1)
		c.cmds.Add(1)
		return next(ctx, cmd)
	}
}

func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.roundTrips.Add(1)
		c.cmds.Add(int64(len(cmds)))
		c.mu.Lock()
		timing := c.timing
		c.mu.Unlock()
		if !timing {
			return next(ctx, cmds)
		}
		start := time.Now()
		err := next(ctx, cmds)
		end := time.Now()
		c.mu.Lock()
		c.spans = append(c.spans, span{start, end, len(cmds)})
		for _, cmd := range cmds {
			c.captured = append(c.captured, slices.Clone(cmd.Args()))
		}
		c.mu.Unlock()
		return err
	}
}

func (c *counter) startTiming() {
	c.mu.Lock()
	c.timing, c.spans, c.captured = true, nil, nil
	c.mu.Unlock()
}

func (c *counter) stopTiming() ([]span, [][]any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timing = false
	s, a := c.spans, c.captured
	c.spans, c.captured = nil, nil
	return s, a
}

// renewedKeys is how many lock keys a renewal was captured for since
// startTiming.
func (c *counter) renewedKeys() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(renewalsByKey(c.captured))
}

type counts struct{ roundTrips, cmds int64 }

func (c *counter) snapshot() counts {
	return counts{c.roundTrips.Load(), c.cmds.Load()}
}

func (a counts) sub(b counts) counts { return counts{a.roundTrips - b.roundTrips, a.cmds - b.cmds} }

func newRedisClient(addr string, hook redis.Hook) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: poolSize})
	if hook != nil {
		c.AddHook(hook)
	}
	return c
}

// held is a lock a library handed out.
type held interface {
	Release(ctx context.Context) error
}

// locker is one library under test, used as its documentation shows.
type locker interface {
	Name() string
	// Acquire blocks until the lock is held, with the library's documented
	// waiting (event-driven for fence, polling for the peers), bounded by
	// ctx.
	Acquire(ctx context.Context, key string) (held, error)
	Counter() *counter
	Close()
}

// ---- fence ----

type fenceLocker struct {
	rdb *redis.Client
	c   *fence.Client
	cnt *counter
}

func newFenceLocker(addr string, opts ...fence.ClientOption) (*fenceLocker, error) {
	cnt := &counter{}
	rdb := newRedisClient(addr, cnt)
	c, err := fence.New(rdb, opts...)
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	return &fenceLocker{rdb: rdb, c: c, cnt: cnt}, nil
}

func (f *fenceLocker) Name() string      { return "fence" }
func (f *fenceLocker) Counter() *counter { return f.cnt }
func (f *fenceLocker) Acquire(ctx context.Context, key string) (held, error) {
	l, err := f.c.Acquire(ctx, key)
	if err != nil {
		return nil, err
	}
	return l, nil
}
func (f *fenceLocker) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = f.c.Close(ctx)
	_ = f.rdb.Close()
}

// ---- redsync (one pool, goredis v9, documented defaults) ----

type redsyncLocker struct {
	rdb *redis.Client
	rs  *redsync.Redsync
	cnt *counter
}

func newRedsyncLocker(addr string) *redsyncLocker {
	cnt := &counter{}
	rdb := newRedisClient(addr, cnt)
	return &redsyncLocker{rdb: rdb, rs: redsync.New(rsgoredis.NewPool(rdb)), cnt: cnt}
}

func (r *redsyncLocker) Name() string      { return "redsync" }
func (r *redsyncLocker) Counter() *counter { return r.cnt }
func (r *redsyncLocker) Close()            { _ = r.rdb.Close() }

type redsyncHeld struct{ m *redsync.Mutex }

func (h redsyncHeld) Release(ctx context.Context) error {
	ok, err := h.m.UnlockContext(ctx)
	if err == nil && !ok {
		err = errors.New("redsync: unlock reported not held")
	}
	return err
}

func (r *redsyncLocker) Acquire(ctx context.Context, key string) (held, error) {
	// Defaults: expiry 8s, 32 tries, retry delay random 50–250 ms.
	m := r.rs.NewMutex("rs:" + key)
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return redsyncHeld{m}, nil
}

// gaveUp reports the error of a peer's Acquire that stopped retrying
// while its context was still alive: redsync after its 32 tries
// (ErrFailed, or the last try's *ErrTaken), redislock when its retry
// strategy ends (ErrNotObtained). The contended loops count it and call
// Acquire again, as an application would.
func gaveUp(err error) bool {
	var taken *redsync.ErrTaken
	return errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) || errors.Is(err, redislock.ErrNotObtained)
}

// ---- bsm/redislock (LinearBackoff(100ms) as its docs show) ----

type redislockLocker struct {
	rdb     *redis.Client
	c       *redislock.Client
	cnt     *counter
	backoff time.Duration
	name    string
}

func newRedislockLocker(addr string, backoff time.Duration, name string) *redislockLocker {
	cnt := &counter{}
	rdb := newRedisClient(addr, cnt)
	return &redislockLocker{rdb: rdb, c: redislock.New(rdb), cnt: cnt, backoff: backoff, name: name}
}

func (r *redislockLocker) Name() string      { return r.name }
func (r *redislockLocker) Counter() *counter { return r.cnt }
func (r *redislockLocker) Close()            { _ = r.rdb.Close() }

func (r *redislockLocker) Acquire(ctx context.Context, key string) (held, error) {
	l, err := r.c.Obtain(ctx, r.name+":"+key, peerTTL, &redislock.Options{
		RetryStrategy: redislock.LinearBackoff(r.backoff),
	})
	if err != nil {
		return nil, err
	}
	return l, nil
}
