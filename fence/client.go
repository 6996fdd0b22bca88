package fence

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/internal/oneline"
	"github.com/redis/go-redis/v9"
)

// Locks. Each mutex of package fence is owned by one type, and the top of
// the file that owns it says what it guards and where it stands in this
// order: a mutex may be taken while those to its left on a line are held,
// never the other way round.
//
//	clusterView.mu → Client.mu → watch.mu → observer.mu
//	                 Client.mu → watchdog.mu
//	                 Client.mu → notifier.mu
//	     follower.mu → watch.mu → observer.mu
//	waiter.mu, alone
//
// None of them is held across a network call, a channel operation that
// can block, or a call of the user's code (observers, loggers): what a
// method finds under a mutex, it acts on after unlocking. (A warning
// logged once per client runs inside its sync.Once, which guards nothing
// else.)
//
// Client.mu (this file) guards the client's locks and watches, and makes
// Close's start one step with goBackground's Add, so that Close waits for
// every background call: clusterView.refresh holds its own mutex when it
// starts one, adopt and Close hold it while they schedule and unschedule
// locks (watchdog.mu) and Close while it lists the waiters (notifier.mu),
// and the watches of observe.go take it before their own.

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
// goroutine pair and at most one pub/sub connection (per cluster node,
// each with a reader and a writer goroutine); [Client.Close] stops them.
// It is safe for concurrent use.
type Client struct {
	rdb     RedisClient
	router  keyRouter // nil unless a cluster
	cfg     config
	obs     *observers
	cluster bool // sharded pub/sub, WAIT on the key's master
	scripts *scriptSet
	wd      *watchdog
	notify  *notifier
	closing chan struct{}
	closed  atomic.Bool
	// bgCtx bounds the client's background calls (a waiter's leave); bg
	// counts them, and Close waits for them.
	bgCtx    context.Context
	bgCancel context.CancelFunc
	bg       sync.WaitGroup

	mu sync.Mutex
	// locks holds the locks acquired and neither released nor lost, by
	// lock key: a lock leaves it when it ends, so a client that lets
	// fixed-lease locks expire keeps nothing of them.
	locks map[string]*Lock
	// watches are the elections observed (Observe), by events channel.
	watches map[string]*watch

	checks serverChecks // see serverchecks.go
	// relBound bounds the releases (release.go); waitBound the first
	// attempts of Acquire calls (Client.attemptContext).
	relBound, waitBound sharedBound
	// view keeps a cluster client's calls off stopped nodes
	// (clusterview.go); nil for other clients.
	view *clusterView
}

// New returns a Client on rdb (see [RedisClient] for the clients that
// work). opts set the client's behaviour and the defaults of its
// acquisitions; a bad option is an error. Create rdb with
// ContextTimeoutEnabled: a renewal attempt then gives up a quarter of the
// lease before the lock's deadline, rather than at the client's read
// timeout, and is retried on a fresh connection, so a request lost on a
// dead connection costs no lock. Losses are signalled on time either way.
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
		scripts: scriptsFor(router != nil),
		closing: make(chan struct{}), locks: map[string]*Lock{}}
	c.bgCtx, c.bgCancel = context.WithCancel(context.Background())
	c.relBound.d, c.relBound.step = releaseTimeout, boundStep
	// A first attempt ends at most a 64th of the wait limit late on what
	// selects on Done (a second of the default minute); a limit under
	// 640 ms gets a context of each call's own.
	c.waitBound.d, c.waitBound.cause = cfg.waitLimit, cfg.waitLimitErr
	if step := min(boundStep, cfg.waitLimit/64); step >= minBoundStep {
		c.waitBound.step = step
	}
	c.notify = newNotifier(c)
	c.wd = newWatchdog(c)
	c.checkClusterOptions()
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		c.view = newClusterView(c, cc)
	}
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
	waiters := c.notify.allWaiters()
	now := time.Now().UnixNano()
	locks := make([]*Lock, 0, len(c.locks))
	for _, l := range c.locks {
		l.released.Store(true)
		c.wd.remove(l)
		l.end(ErrClosed)
		// Past its deadline a lock is no longer ours to release (the
		// server may have given it to someone else already).
		if l.deadline.Load() > now {
			locks = append(locks, l)
		}
	}
	c.locks = nil
	c.mu.Unlock()

	// Detached from ctx's cancellation like Release, bounded by its
	// deadline or closeTimeout, whichever comes first.
	dl := time.Now().Add(closeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), dl)
	defer cancel()
	errs := c.closeLocks(ctx, rctx, locks)
	c.leaveAll(rctx, waiters)
	c.wd.close()
	// The waiters' own leaves, until the deadline.
	done := make(chan struct{})
	go func() { c.bg.Wait(); close(done) }()
	select {
	case <-done:
	case <-rctx.Done():
		c.bgCancel()
		<-done
	}
	c.bgCancel()
	c.notify.close()
	c.waitServerChecks()
	return oneline.Join(errs...)
}

// closeLocks releases locks (Close) in one pipeline bounded by rctx, and
// returns the errors other than "not held".
func (c *Client) closeLocks(ctx, rctx context.Context, locks []*Lock) []error {
	if len(locks) == 0 {
		return nil
	}
	calls := make([]scriptCall, len(locks))
	for i, l := range locks {
		calls[i] = l.releaseCall()
	}
	var errs []error
	start := time.Now()
	cmds := execScripts(rctx, c.rdb, c.scripts.release, calls, c.route())
	took := time.Since(start)
	for i, cmd := range cmds {
		rep, err := parseRelease(cmd)
		switch {
		case err != nil:
			err = fmt.Errorf("fence: close: release %q: %w", locks[i].name, err)
			errs = append(errs, err)
		default:
			err = c.releaseOutcome(locks[i], rep, start)
		}
		c.obs.onRelease(ctx, ReleaseEvent{Name: locks[i].name, Token: locks[i].token,
			Held: time.Since(locks[i].acquiredAt), Duration: took, Err: err})
	}
	return errs
}

// leaveAll takes the client's waiters out of their queues in Redis
// (Close), in one pipeline bounded by rctx; their Acquire calls return
// ErrClosed. A handover that raced the close is passed on.
func (c *Client) leaveAll(rctx context.Context, waiters []*waiter) {
	calls := make([]scriptCall, 0, len(waiters))
	for _, w := range waiters {
		w.mu.Lock()
		w.state = left
		w.mu.Unlock()
		w.unschedule()
		calls = append(calls, w.leaveCall())
	}
	if len(calls) > 0 {
		_ = execScripts(rctx, c.rdb, c.scripts.leave, calls, c.route()) // a place not left expires at its deadline
	}
}

// goBackground runs f in a goroutine that Close waits for, unless the
// client is closed (then it reports false and runs nothing).
func (c *Client) goBackground(f func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return false
	}
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		f()
	}()
	return true
}
