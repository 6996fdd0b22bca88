package fence

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/internal/oneline"
	"github.com/redis/go-redis/v9"
)

// RedisClient is the part of a go-redis v9 client that fence uses: scripts,
// pipelines and pub/sub. [*redis.Client] (one server, or a failover client
// from [redis.NewFailoverClient], which follows Sentinel to the master),
// [*redis.ClusterClient] and [redis.UniversalClient] satisfy it; so does a
// wrapper of one of them. [*redis.Ring] is refused by [New]: a Ring picks
// each key's server from its own view of which shards are up, so two
// clients that disagree (one missed a shard's heartbeat) would lock the
// same name on two servers, and nothing would exclude them.
//
// A client that also has MasterForKey (as [*redis.ClusterClient] does) is
// treated as a cluster: sharded pub/sub, and [WithReplicaSync]'s WAIT on
// the key's master.
type RedisClient interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
}

var (
	_ RedisClient = (*redis.Client)(nil)
	_ RedisClient = (*redis.ClusterClient)(nil)
	_ RedisClient = redis.UniversalClient(nil)
	_ keyRouter   = (*redis.ClusterClient)(nil)
)

// keyRouter is the cluster part of a client: the master node of a key.
type keyRouter interface {
	MasterForKey(ctx context.Context, key string) (*redis.Client, error)
}

// scripter is what running a script in one round trip or a pipeline of
// scripts needs.
type scripter interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

// Client acquires locks on one Redis deployment. It owns one watchdog
// goroutine pair and at most one pub/sub connection (per cluster node);
// [Client.Close] stops them. It is safe for concurrent use.
type Client struct {
	rdb     RedisClient
	router  keyRouter // nil unless a cluster
	cfg     config
	obs     *observers
	cluster bool // sharded pub/sub, WAIT on the key's master
	wd      *watchdog
	waiter  *waiter
	closing chan struct{}
	closed  atomic.Bool

	mu sync.Mutex
	// locks holds the locks acquired and neither released nor lost, by
	// lock key: a lock leaves it when it ends, so a client that lets
	// fixed-lease locks expire keeps nothing of them.
	locks map[string]*Lock

	checks serverChecks // see serverchecks.go
}

// New returns a Client on rdb (see [RedisClient] for the clients that
// work). opts set the client's behaviour and the defaults of its
// acquisitions; a bad option is an error. For renewals to give up on a
// dead connection at the lock's deadline rather than at the client's read
// timeout, create rdb with ContextTimeoutEnabled; losses are signalled on
// time either way.
func New(rdb RedisClient, opts ...ClientOption) (*Client, error) {
	if err := checkRedisClient(rdb); err != nil {
		return nil, err
	}
	cfg := defaultConfig()
	if err := cfg.applyClient(opts); err != nil {
		return nil, err
	}
	router, _ := rdb.(keyRouter)
	c := &Client{rdb: rdb, router: router, cfg: cfg, obs: newObservers(cfg), cluster: router != nil,
		closing: make(chan struct{}), locks: map[string]*Lock{}}
	c.waiter = newWaiter(c)
	c.wd = newWatchdog(c)
	c.startServerChecks()
	return c, nil
}

func checkRedisClient(rdb RedisClient) error {
	if rdb == nil {
		return invalidOption("New: the Redis client is nil")
	}
	if v := reflect.ValueOf(rdb); v.Kind() == reflect.Pointer && v.IsNil() {
		return invalidOption("New: the Redis client is a nil %T", rdb)
	}
	if _, ok := rdb.(*redis.Ring); ok {
		return invalidOption("New: *redis.Ring is refused: each Ring client maps a name to a server by its own view " +
			"of which shards are up, so two clients can lock one name on two servers; use a *redis.Client, " +
			"a failover client or a *redis.ClusterClient")
	}
	return nil
}

func (c *Client) isClosed() bool { return c.closed.Load() }

func (c *Client) lockConfig(name string, opts []LockOption) (config, error) {
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
	if err := cfg.applyLock(opts); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// holderFor is the holder id of one acquisition call: the configured one,
// or a random one kept for every attempt of the call (so that an attempt
// whose reply was lost is taken back by the next).
func holderFor(cfg config) string {
	if cfg.holder != "" {
		return cfg.holder
	}
	return newHolderID()
}

// TryAcquire makes one attempt to acquire name: one round trip. It returns
// an error matching [ErrNotAcquired] when another holder has the lock, or
// when ctx is done (the error then also matches ctx's error). ctx bounds
// the round trip. With [WithHolder], a lock held by that same holder id is
// handed back (see [WithHolder]).
func (c *Client) TryAcquire(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	cfg, err := c.lockConfig(name, opts)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	holder := holderFor(cfg)
	l, rep, err := c.attempt(ctx, name, keysFor(cfg.prefix, name), cfg, holder)
	switch {
	case err != nil:
		err = attemptErr(ctx, name, err)
	case l == nil:
		err = fmt.Errorf("%w: %q is held by another holder (expires in %v)",
			ErrNotAcquired, name, time.Duration(rep.pttl)*time.Millisecond)
	}
	c.observeAcquire(ctx, name, holder, start, 0, l, rep, err)
	return l, err
}

// Acquire acquires name, waiting while another holder has it: it wakes on
// that holder's release message, or when the lock's expiry has passed. The
// wait ends at the earlier of ctx's end and the wait limit (see "Waiting"
// in the package documentation); Acquire then returns an error matching
// [ErrNotAcquired] and the reason (ctx's error, or the wait limit's, which
// matches [context.DeadlineExceeded]), joined with the last transient
// error, if any. It returns [ErrClosed] when the client is closed
// meanwhile. Transient errors — the node unreachable, a failover or slot
// move under way (READONLY, LOADING, MOVED, CLUSTERDOWN) — are waited
// through, retrying with a backoff of at most 250 ms; any other Redis
// error (a script error, a denied command) is returned at once. With
// [WithHolder], a lock held by that same holder id is handed back at once.
func (c *Client) Acquire(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	cfg, err := c.lockConfig(name, opts)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	holder := holderFor(cfg)
	k := keysFor(cfg.prefix, name)
	// Uncontended path: one round trip, no subscription, bounded by ctx
	// like TryAcquire (no wait-limit context and timer for a lock that is
	// free). Skipped when waiters of this client already queue for the
	// name: the lock goes to them first (see waiter).
	var rep acquireReply
	if !c.waiter.queued(k.channel) {
		var l *Lock
		l, rep, err = c.attempt(ctx, name, k, cfg, holder)
		// A transient error (failover, restart) is waited through, like
		// a held lock.
		if l != nil || (err != nil && (!transient(err) || ctxEnded(ctx))) {
			err = attemptErr(ctx, name, err)
			c.observeAcquire(ctx, name, holder, start, 0, l, rep, err)
			return l, err
		}
	}
	return c.wait(ctx, name, k, cfg, holder, start, rep)
}

func (c *Client) observeAcquire(ctx context.Context, name, holder string, start time.Time, waited time.Duration,
	l *Lock, rep acquireReply, err error) {
	if len(c.obs.acquire) == 0 {
		return
	}
	e := AcquireEvent{Name: name, Holder: holder, Duration: time.Since(start), Waited: waited, Err: err}
	if l != nil {
		e.Token, e.Reacquired = l.token, rep.reacquired
	} else if rep.pttl != 0 {
		e.Remaining = pttlDuration(rep.pttl)
	}
	c.obs.onAcquire(ctx, e)
}

func pttlDuration(pttl int64) time.Duration {
	if pttl < 0 {
		return -1
	}
	return time.Duration(pttl) * time.Millisecond
}

// attemptErr turns an attempt's error into the caller's: an attempt or
// wait that ended with ctx (or the wait context) matches ErrNotAcquired
// and the context's cause.
func attemptErr(ctx context.Context, name string, err error) error {
	if err == nil {
		return nil
	}
	if ctxEnded(ctx) && !errors.Is(err, ErrClosed) {
		return notAcquiredCtx(ctx, name)
	}
	return err
}

// ctxEnded is ctx.Err() != nil, also in the instant after its deadline
// passed and before its Done closes: a connection deadline set from ctx
// (ContextTimeoutEnabled) can fire first.
func ctxEnded(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

func notAcquiredCtx(ctx context.Context, name string) error {
	cause := context.Cause(ctx)
	if cause == nil { // deadline passed, Done not closed yet
		cause = context.DeadlineExceeded
	}
	return fmt.Errorf("%w: %q: %w", ErrNotAcquired, name, cause)
}

// Do acquires name (waiting like [Client.Acquire]), runs fn with a context
// that is cancelled when ctx is done or the lock is lost, and releases the
// lock. It returns fn's error joined with the lock's loss ([ErrLockLost],
// [ErrMaxHold]) if the lock was lost while fn ran, or with the release
// error.
func (c *Client) Do(ctx context.Context, name string, fn func(ctx context.Context, l *Lock) error, opts ...LockOption) error {
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
		return oneline.Join(ferr, lost)
	}
	return oneline.Join(ferr, rerr)
}

// attempt runs the acquire script once. It returns the lock, or the reply
// saying the lock is held.
func (c *Client) attempt(ctx context.Context, name string, k keys, cfg config, holder string) (*Lock, acquireReply, error) {
	if err := ctx.Err(); err != nil {
		return nil, acquireReply{}, err // a done ctx sends nothing
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
	// The lock's context carries ctx's values (trace ids), not its
	// cancellation; no goroutine: the parent never ends.
	l.vctx = ctx
	if ctx.Done() != nil {
		l.vctx = context.WithoutCancel(ctx)
	}
	l.ctx, l.cancel = context.WithCancelCause(l.vctx)
	l.setDeadlineFrom(start, cfg.lease)
	if cfg.maxHold > 0 {
		l.maxHoldAt = start.Add(cfg.maxHold)
	}
	if cfg.replicas > 0 && acks < int64(cfg.replicas) {
		_ = c.release(ctx, l)
		l.cancel(ErrReleased)
		return nil, acquireReply{}, &ReplicaSyncError{Name: name, Want: cfg.replicas, Got: int(acks), Timeout: cfg.replicaTimeout}
	}
	c.mu.Lock()
	if c.isClosed() {
		c.mu.Unlock()
		_ = c.release(ctx, l)
		l.cancel(ErrClosed)
		return nil, acquireReply{}, ErrClosed
	}
	old := c.locks[k.lock]
	if old != nil && rep.reacquired && old.value == rep.value && c.wd.refreshed(old, start, cfg.lease) {
		// This client's own lock, taken again by its holder id: the same
		// Lock, its lease restarted (not re-entrancy: one Release ends it).
		c.mu.Unlock()
		l.cancel(ErrReleased)
		return old, rep, nil
	}
	c.locks[k.lock] = l
	c.wd.add(l)
	c.mu.Unlock()
	if old != nil && old.value != l.value {
		// The server gave the name to a new acquisition: the old one is
		// no longer held, whatever its deadline says.
		c.wd.lose(old, &LostError{Name: name, Token: old.token, Reason: ReasonTaken, TakenBy: l.holder, TakenToken: l.token}, time.Now())
	}
	return l, rep, nil
}

// acquireAndWait runs the acquire script and WAIT in one pipeline on one
// connection: WAIT counts the replicas that have the writes of its own
// connection.
func (c *Client) acquireAndWait(ctx context.Context, call scriptCall, cfg config) (acquireReply, int64, error) {
	var node scripter = c.rdb
	if c.router != nil {
		n, err := c.router.MasterForKey(ctx, call.keys[0])
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

// release runs the release script for l, detached from ctx's
// cancellation and bounded by releaseTimeout. When it published nothing
// (the lock was gone, or the call failed), the head waiter of this client
// is woken locally: it may be waiting for this lock's release message
// alone.
func (c *Client) release(ctx context.Context, l *Lock) error {
	if ctx.Done() != nil { // a context that cannot be cancelled needs no detaching
		ctx = context.WithoutCancel(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	call := l.releaseCall()
	n, err := releaseScript.Run(ctx, c.rdb, call.keys, call.args...).Int64()
	if err != nil {
		c.refreshTopology(err)
		c.waiter.wakeChannel(l.keys.channel)
		return fmt.Errorf("fence: release %q: %w", l.name, err)
	}
	return c.releaseOutcome(l, n)
}

// newest reports whether no later lock of l's name was acquired by this
// client since l ended.
func (c *Client) newest(l *Lock) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.locks[l.keys.lock]
	return cur == nil || cur == l
}

// forget drops l from the client's locks (a newer lock of the same name
// stays).
func (c *Client) forget(l *Lock) {
	c.mu.Lock()
	if c.locks[l.keys.lock] == l {
		delete(c.locks, l.keys.lock)
	}
	c.mu.Unlock()
}

// Close releases the locks the client still holds (those whose deadline
// has not passed; in one pipelined round trip, detached from ctx's
// cancellation, bounded by its deadline and by 5 s), cancels their
// contexts with [ErrClosed], ends waiting acquisitions, and stops the
// watchdog and the pub/sub connection. Every later call returns
// [ErrClosed]. It returns the release errors other than "not held".
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		return ErrClosed
	}
	c.closed.Store(true)
	close(c.closing)
	now := time.Now().UnixNano()
	locks := make([]*Lock, 0, len(c.locks))
	for _, l := range c.locks {
		l.released.Store(true)
		c.wd.remove(l)
		l.cancel(ErrClosed)
		// Past its deadline a lock is no longer ours to release (the
		// server may have given it to someone else already).
		if l.deadline.Load() > now {
			locks = append(locks, l)
		}
	}
	c.locks = nil
	c.mu.Unlock()

	var errs []error
	if len(locks) > 0 {
		calls := make([]scriptCall, len(locks))
		for i, l := range locks {
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
			c.obs.onRelease(ctx, ReleaseEvent{Name: locks[i].name, Token: locks[i].token,
				Held: time.Since(locks[i].acquiredAt), Err: err})
		}
	}
	c.wd.close()
	c.waiter.close()
	c.waitServerChecks()
	return oneline.Join(errs...)
}

func newHolderID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go ≥ 1.24)
	return hex.EncodeToString(b[:])
}
