package fence

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client acquires locks on one Redis deployment. It owns one watchdog
// goroutine pair and at most one pub/sub connection (per cluster node);
// [Client.Close] stops them. It is safe for concurrent use.
type Client struct {
	rdb     redis.UniversalClient
	cfg     config
	cluster bool // sharded pub/sub, WAIT on the key's master
	wd      *watchdog
	waiter  *waiter
	closing chan struct{}
	closed  atomic.Bool

	mu    sync.Mutex
	locks map[*Lock]struct{} // acquired and not yet released

	checks serverChecks // see serverchecks.go
}

// New returns a Client on rdb (a *redis.Client, *redis.ClusterClient or
// failover client; a *redis.Ring is rejected, it cannot carry one pub/sub
// connection for all names). opts set the client's defaults; a bad option
// is an error. For renewals to give up on a dead connection at the lock's
// deadline rather than at the client's read timeout, create rdb with
// ContextTimeoutEnabled; losses are signalled on time either way.
func New(rdb redis.UniversalClient, opts ...Option) (*Client, error) {
	switch x := rdb.(type) {
	case nil:
		return nil, invalidOption("New: the Redis client is nil")
	case *redis.Client:
		if x == nil {
			return nil, invalidOption("New: the Redis client is a nil *redis.Client")
		}
	case *redis.ClusterClient:
		if x == nil {
			return nil, invalidOption("New: the Redis client is a nil *redis.ClusterClient")
		}
	}
	if _, ok := rdb.(*redis.Ring); ok {
		return nil, invalidOption("New: *redis.Ring is not supported; use a *redis.Client or *redis.ClusterClient")
	}
	cfg := defaultConfig()
	if err := cfg.apply(false, opts); err != nil {
		return nil, err
	}
	_, cluster := rdb.(*redis.ClusterClient)
	c := &Client{rdb: rdb, cfg: cfg, cluster: cluster, closing: make(chan struct{}), locks: map[*Lock]struct{}{}}
	c.waiter = newWaiter(c)
	c.wd = newWatchdog(c)
	c.startServerChecks()
	return c, nil
}

func (c *Client) isClosed() bool { return c.closed.Load() }

func (c *Client) lockConfig(name string, opts []Option) (config, error) {
	if c.isClosed() {
		return config{}, ErrClosed
	}
	if err := validateName(name); err != nil {
		return config{}, err
	}
	if len(opts) == 0 {
		return c.cfg, nil
	}
	cfg := c.cfg
	if err := cfg.apply(true, opts); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// TryAcquire makes one attempt to acquire name: one round trip. It returns
// an error wrapping [ErrNotAcquired] when another holder has the lock. ctx
// bounds the round trip.
func (c *Client) TryAcquire(ctx context.Context, name string, opts ...Option) (*Lock, error) {
	cfg, err := c.lockConfig(name, opts)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	l, rep, err := c.attempt(ctx, name, keysFor(cfg.prefix, name), cfg)
	if err != nil {
		return nil, err
	}
	if l == nil {
		return nil, fmt.Errorf("%w: %q is held by another holder (expires in %v)",
			ErrNotAcquired, name, time.Duration(rep.pttl)*time.Millisecond)
	}
	cfg.observer.Acquired(Event{Name: name, Token: l.token, Duration: time.Since(start)})
	return l, nil
}

// Acquire acquires name, waiting while another holder has it: it wakes on
// that holder's release message, or when the lock's expiry has passed. Its
// first attempt is bounded by ctx alone, like [Client.TryAcquire]. It
// returns [ErrNotAcquired] joined with the reason when ctx is done or the
// wait limit ([WithWaitLimit], default [DefaultWaitLimit]) passes (joined
// with the last transient error, if any), and [ErrClosed] when the client
// is closed meanwhile. Transient errors — the node unreachable, a failover
// or slot move under way (READONLY, LOADING, MOVED, CLUSTERDOWN) — are
// waited through, retrying with a backoff of at most 250 ms; any other
// Redis error (a script error, a denied command) is returned at once.
func (c *Client) Acquire(ctx context.Context, name string, opts ...Option) (*Lock, error) {
	cfg, err := c.lockConfig(name, opts)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	k := keysFor(cfg.prefix, name)
	// Uncontended path: one round trip, no subscription, bounded by ctx
	// like TryAcquire (no wait-limit context and timer for a lock that is
	// free). Skipped when waiters of this client already queue for the
	// name: the lock goes to them first (see waiter).
	if !c.waiter.queued(k.channel) {
		l, _, err := c.attempt(ctx, name, k, cfg)
		if l != nil {
			cfg.observer.Acquired(Event{Name: name, Token: l.token, Duration: time.Since(start)})
			return l, nil
		}
		// A transient error (failover, restart) is waited through, like
		// a held lock.
		if err != nil && (!transient(err) || ctx.Err() != nil) {
			return nil, c.attemptErr(ctx, err)
		}
	}
	return c.wait(ctx, name, k, cfg, start)
}

// attemptErr turns an attempt's error into the caller's: a wait that ended
// is ErrNotAcquired joined with why.
func (c *Client) attemptErr(wctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if wctx.Err() != nil && !errors.Is(err, ErrClosed) {
		return errors.Join(ErrNotAcquired, context.Cause(wctx))
	}
	return err
}

// Do acquires name (waiting like [Client.Acquire]), runs fn with a context
// that is cancelled when ctx is done or the lock is lost, and releases the
// lock. It returns fn's error joined with the lock's loss ([ErrLockLost],
// [ErrMaxHold]) if the lock was lost while fn ran, or with the release
// error.
func (c *Client) Do(ctx context.Context, name string, fn func(ctx context.Context, l *Lock) error, opts ...Option) error {
	if fn == nil {
		return invalidOption("Do(%q): fn is nil", name)
	}
	l, err := c.Acquire(ctx, name, opts...)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(l.ctx, func() { cancel(context.Cause(l.ctx)) })
	ferr := fn(fctx, l)
	stop()
	cancel(nil)
	lost := l.Err()
	rerr := l.Release(ctx)
	if lost != nil {
		return errors.Join(ferr, lost)
	}
	return errors.Join(ferr, rerr)
}

// attempt runs the acquire script once. It returns the lock, or the reply
// saying the lock is held.
func (c *Client) attempt(ctx context.Context, name string, k keys, cfg config) (*Lock, acquireReply, error) {
	holder := cfg.holder
	if holder == "" {
		holder = newHolderID()
	}
	call := scriptCall{keys: []string{k.lock, k.seq}, args: []any{holder, cfg.leaseArg, seqIdleExpiry}}
	start := time.Now()
	var (
		rep  acquireReply
		acks int64
		err  error
	)
	if cfg.replicas > 0 {
		rep, acks, err = c.acquireAndWait(ctx, call, cfg)
	} else {
		var v any
		v, err = acquireScript.Run(ctx, c.rdb, call.keys, call.args...).Result()
		if err == nil {
			rep, err = parseAcquire(v)
		}
	}
	if err != nil {
		c.refreshTopology(err)
		return nil, acquireReply{}, fmt.Errorf("fence: acquire %q: %w", name, err)
	}
	if !rep.acquired {
		return nil, rep, nil
	}
	// The holder and the value share the reply's string (no copies).
	l := &Lock{c: c, name: name, keys: k, holder: rep.value[len(rep.value)-len(holder):], token: rep.token,
		value: rep.value, valueArg: rep.value, keyArgs: call.keys[:1:1], leaseArg: cfg.leaseArg, fixed: cfg.fixed,
		acquiredAt: start, lease: cfg.lease, renewAt: start.Add(cfg.lease / 3), idx: -1}
	l.ctx, l.cancel = context.WithCancelCause(context.Background()) // no goroutine: the parent never ends
	l.setDeadlineFrom(start, cfg.lease)
	if cfg.maxHold > 0 {
		l.maxHoldAt = start.Add(cfg.maxHold)
	}
	if cfg.replicas > 0 && acks < int64(cfg.replicas) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		_ = c.release(rctx, l)
		cancel()
		l.cancel(ErrReleased)
		return nil, acquireReply{}, &ReplicaSyncError{Name: name, Want: cfg.replicas, Got: int(acks), Timeout: cfg.replicaTimeout}
	}
	c.mu.Lock()
	if c.isClosed() {
		c.mu.Unlock()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		_ = c.release(rctx, l)
		cancel()
		l.cancel(ErrClosed)
		return nil, acquireReply{}, ErrClosed
	}
	c.locks[l] = struct{}{}
	c.wd.add(l)
	c.mu.Unlock()
	return l, rep, nil
}

// acquireAndWait runs the acquire script and WAIT in one pipeline on one
// connection: WAIT counts the replicas that have the writes of its own
// connection.
func (c *Client) acquireAndWait(ctx context.Context, call scriptCall, cfg config) (acquireReply, int64, error) {
	var node redis.Cmdable = c.rdb
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		n, err := cc.MasterForKey(ctx, call.keys[0])
		if err != nil {
			return acquireReply{}, 0, err
		}
		node = n
	}
	for try := 0; ; try++ {
		pipe := node.Pipeline()
		var acq *redis.Cmd
		if try == 0 {
			acq = acquireScript.EvalSha(ctx, pipe, call.keys, call.args...)
		} else { // EVAL loads the script without SCRIPT LOAD (see execScripts)
			acq = acquireScript.Eval(ctx, pipe, call.keys, call.args...)
		}
		wait := pipe.Do(ctx, "wait", cfg.replicas, cfg.replicaTimeout.Milliseconds())
		_, _ = pipe.Exec(ctx)
		if isNoScript(acq.Err()) && try == 0 {
			continue
		}
		v, err := acq.Result()
		if err != nil {
			return acquireReply{}, 0, err
		}
		rep, err := parseAcquire(v)
		if err != nil {
			return acquireReply{}, 0, err
		}
		acks, err := wait.Int64()
		if err != nil && rep.acquired {
			acks = 0 // the lock is released by the caller: no acknowledged copy
		}
		return rep, acks, nil
	}
}

// release runs the release script for l. When it published nothing (the
// lock was gone, or the call failed), the head waiter of this client is
// woken locally: it may be waiting for this lock's release message alone.
func (c *Client) release(ctx context.Context, l *Lock) error {
	call := l.releaseCall()
	n, err := releaseScript.Run(ctx, c.rdb, call.keys, call.args...).Int64()
	if err != nil {
		c.refreshTopology(err)
		c.waiter.wakeChannel(l.keys.channel)
		return fmt.Errorf("fence: release %q: %w", l.name, err)
	}
	return c.releaseOutcome(l, n)
}

func (c *Client) forget(l *Lock) {
	c.mu.Lock()
	delete(c.locks, l)
	c.mu.Unlock()
}

// Close releases the locks the client still holds (in one pipelined round
// trip, detached from ctx's cancellation, bounded by its deadline and by
// 5 s), cancels their contexts with
// [ErrClosed], ends waiting acquisitions, and stops the watchdog and the
// pub/sub connection. Every later call returns [ErrClosed]. It returns the
// release errors other than "not held".
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		return ErrClosed
	}
	c.closed.Store(true)
	close(c.closing)
	locks := make([]*Lock, 0, len(c.locks))
	for l := range c.locks {
		locks = append(locks, l)
	}
	c.locks = nil
	c.mu.Unlock()

	var errs []error
	if len(locks) > 0 {
		calls := make([]scriptCall, len(locks))
		for i, l := range locks {
			l.released.Store(true)
			c.wd.remove(l)
			l.cancel(ErrClosed)
			calls[i] = l.releaseCall()
		}
		// Detached from ctx's cancellation like Release, bounded by its
		// deadline or closeTimeout, whichever comes first.
		dl := time.Now().Add(closeTimeout)
		if d, ok := ctx.Deadline(); ok && d.Before(dl) {
			dl = d
		}
		rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), dl)
		cmds := execScripts(rctx, c.rdb, releaseScript, calls)
		cancel()
		for i, cmd := range cmds {
			n, err := cmd.Int64()
			switch {
			case err != nil:
				err = fmt.Errorf("fence: close: release %q: %w", locks[i].name, err)
				errs = append(errs, err)
			default:
				err = c.releaseOutcome(locks[i], n)
			}
			c.cfg.observer.Released(Event{Name: locks[i].name, Token: locks[i].token,
				Duration: time.Since(locks[i].acquiredAt), Err: err})
		}
	}
	c.wd.close()
	c.waiter.close()
	c.waitServerChecks()
	return errors.Join(errs...)
}

func newHolderID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go ≥ 1.24)
	return hex.EncodeToString(b[:])
}
