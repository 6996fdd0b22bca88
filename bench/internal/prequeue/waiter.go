package prequeue

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// confirmWait bounds the wait for a SUBSCRIBE confirmation; past it the
	// waiter goes on with its PTTL timer alone (slower, still correct).
	confirmWait = time.Second
	// pingEvery is how long the pub/sub reader waits for a message before
	// it pings, so that a dead connection is noticed and redialled.
	pingEvery = 30 * time.Second
	// noExpiryWait is the retry period when the lock has no expiry (set by
	// hand); release messages still wake the waiter at once.
	noExpiryWait = time.Second
	// subLinger is how long a channel stays subscribed after its last
	// waiter left: a name that is contended again soon (a lock passed
	// between two processes) then costs no SUBSCRIBE round trip and no
	// UNSUBSCRIBE on the way out of Acquire. Idle channels are dropped when
	// another waiter leaves or when the connection is idle for pingEvery,
	// so one lingers between subLinger and about pingEvery.
	subLinger = time.Second
)

// waiter multiplexes the release notifications of every lock name a client
// waits for over one pub/sub connection (one per cluster node, with sharded
// channels). Subscriptions are reference-counted per channel.
//
// The waiters of one channel form a FIFO queue, and a release message wakes
// only its head: one release, one attempt from this client, instead of a
// herd of attempts of which all but one fail. The head is the waiter that
// attempts; a waiter that joins behind others on a confirmed subscription
// does not attempt at all until it is woken (no barging past the queue, so
// the lock goes round in arrival order). To lose no wake-up:
//   - a head that leaves without the lock (ctx done, wait limit, error)
//     wakes the next waiter, which attempts and learns the lock's PTTL;
//   - a head that leaves with the lock holds it in this client: the release
//     message of that lock wakes the next head, and when its end publishes
//     nothing (lost, or the release found it gone or failed) the client
//     wakes the head locally (Client.release and Client.lost call
//     wakeChannel);
//   - a waiter that attempted keeps its PTTL timer as the fallback, so an
//     expiry without a message is noticed;
//   - a broken pub/sub connection wakes every waiter of it.
type waiter struct {
	c      *Client
	ctx    context.Context // cancelled by close; ends the readers
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	groups map[string]*psGroup    // by node address ("" when not a cluster)
	subs   map[string]*channelSub // by channel
	// unconfirmed counts SUBSCRIBEs sent per channel whose confirmation
	// has not arrived: after a quick unsubscribe and subscribe, the old
	// confirmation must not pass for the new one.
	unconfirmed map[string]int
	// idle lists channels in the order their queue emptied (entries may
	// be stale: a channel used again, or emptied again later).
	idle []idleChannel
	wg   sync.WaitGroup
	// probe is a channel of this client's own, subscribed on a failover
	// client's pub/sub connection (see waiter_failover.go); "" otherwise.
	probe string
}

type psGroup struct {
	ps      *redis.PubSub
	sharded bool
	addr    string // the node; "" when not a cluster
	// Guarded by waiter.mu (see waiter_failover.go): broken while the
	// connection fails, closed once its channels moved to other nodes.
	broken, closed bool
}

type channelSub struct {
	group     *psGroup
	confirmed chan struct{} // closed on the server's confirmation
	isConf    bool
	stale     bool            // the server dropped the subscription (slot moved)
	moved     bool            // resubscribed on another connection, unconfirmed
	queue     []*subscription // by arrival; queue[0] is woken by a message
	idleSince time.Time       // when the queue emptied; zero while in use
}

// subscription is one waiter's interest in a channel.
type subscription struct {
	m    *waiter
	ch   string
	wake chan struct{} // cap 1: a release message (or a reconnect) arrived
}

func newWaiter(c *Client) *waiter {
	ctx, cancel := context.WithCancel(context.Background())
	m := &waiter{c: c, ctx: ctx, cancel: cancel,
		groups: map[string]*psGroup{}, subs: map[string]*channelSub{}, unconfirmed: map[string]int{}}
	if isFailoverClient(c.rdb) {
		m.probe = c.cfg.prefix + "probe:" + newHolderID()
	}
	return m
}

// queued reports whether waiters of this client already wait on channel
// over a confirmed subscription: a new waiter then joins their queue
// instead of attempting first.
func (m *waiter) queued(channel string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	cs := m.subs[channel]
	return cs != nil && cs.isConf && len(cs.queue) > 0
}

// subscribe registers interest in channel and waits (bounded by ctx and
// confirmWait) until the server confirmed the subscription, so that a
// release published after this returns is not missed. behind is true when
// the waiter joined a confirmed queue behind other waiters: it may wait
// for its wake without attempting first.
func (m *waiter) subscribe(ctx context.Context, channel string) (s *subscription, behind bool, err error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, false, ErrClosed
	}
	cs := m.subs[channel]
	if cs == nil {
		g, err := m.groupFor(ctx, channel)
		if err == nil && g.broken && g.sharded {
			// Its node is unreachable: subscribing would wait for a dial
			// (under m.mu). The waiter retries once the slot map names
			// the new master or the node is back (see waiter_failover.go).
			err = errNodeDown
		}
		if err == nil {
			if g.sharded {
				err = g.ps.SSubscribe(ctx, channel)
			} else {
				err = g.ps.Subscribe(ctx, channel)
			}
		}
		if err != nil {
			m.mu.Unlock()
			return nil, false, err
		}
		m.unconfirmed[channel]++
		cs = &channelSub{group: g, confirmed: make(chan struct{})}
		m.subs[channel] = cs
	}
	s = &subscription{m: m, ch: channel, wake: make(chan struct{}, 1)}
	cs.idleSince = time.Time{}
	behind = cs.isConf && len(cs.queue) > 0
	cs.queue = append(cs.queue, s)
	confirmed := cs.confirmed
	m.mu.Unlock()
	if behind {
		return s, true, nil
	}

	t := time.NewTimer(confirmWait)
	defer t.Stop()
	select {
	case <-confirmed:
	case <-ctx.Done():
		s.close(false)
		return nil, false, ctx.Err()
	case <-t.C:
		m.c.warn("fence: no pub/sub confirmation; waiting on lock expiry only", slog.String("channel", channel))
	}
	return s, false, nil
}

// groupFor returns (creating it lazily) the pub/sub connection for a
// channel. Called with m.mu held.
func (m *waiter) groupFor(ctx context.Context, channel string) (*psGroup, error) {
	addr := ""
	var node RedisClient = m.c.rdb
	if m.c.router != nil {
		n, err := m.c.router.MasterForKey(ctx, channel)
		if err != nil {
			return nil, err
		}
		node, addr = n, n.Options().Addr
	}
	if g := m.groups[addr]; g != nil {
		return g, nil
	}
	return m.newGroup(node, addr), nil
}

// newGroup opens the pub/sub connection for node and starts its reader.
// Called with m.mu held.
func (m *waiter) newGroup(node RedisClient, addr string) *psGroup {
	g := &psGroup{sharded: m.c.cluster, addr: addr}
	switch {
	case g.sharded:
		g.ps = node.SSubscribe(m.ctx)
	case m.probe != "":
		g.ps = node.Subscribe(m.ctx, m.probe)
	default:
		g.ps = node.Subscribe(m.ctx)
	}
	m.groups[addr] = g
	m.wg.Add(1)
	go m.read(g)
	return g
}

// close drops the interest; the channel is unsubscribed with its last
// waiter. A head that leaves without the lock (acquired false) passes the
// wake on to the next waiter, which may be waiting for it alone.
func (s *subscription) close(acquired bool) {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	cs := m.subs[s.ch]
	if cs == nil {
		return
	}
	i := slices.Index(cs.queue, s)
	if i < 0 {
		return
	}
	cs.queue = slices.Delete(cs.queue, i, i+1)
	if len(cs.queue) > 0 {
		if i == 0 && !acquired {
			cs.queue[0].poke()
		}
		return
	}
	if m.closed {
		return
	}
	now := time.Now()
	m.sweepLocked(now)
	cs.idleSince = now
	m.idle = append(m.idle, idleChannel{s.ch, now})
}

type idleChannel struct {
	ch string
	at time.Time
}

// sweepLocked unsubscribes the channels idle for subLinger or longer.
// Called with m.mu held: that keeps an UNSUBSCRIBE ordered before a later
// SUBSCRIBE of the same channel on the same connection.
func (m *waiter) sweepLocked(now time.Time) {
	i := 0
	for ; i < len(m.idle); i++ {
		e := m.idle[i]
		cs := m.subs[e.ch]
		if cs == nil || !cs.idleSince.Equal(e.at) {
			continue // used again since (a later entry, if idle again)
		}
		if now.Sub(e.at) < subLinger {
			break // the later entries are newer
		}
		delete(m.subs, e.ch)
		ctx, cancel := context.WithTimeout(m.ctx, time.Second)
		if cs.group.sharded {
			_ = cs.group.ps.SUnsubscribe(ctx, e.ch)
		} else {
			_ = cs.group.ps.Unsubscribe(ctx, e.ch)
		}
		cancel()
	}
	m.idle = slices.Delete(m.idle, 0, i)
}

// sweep is sweepLocked for the reader, when its connection is idle.
func (m *waiter) sweep() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.sweepLocked(time.Now())
	}
}

// read delivers one connection's messages to the waiters.
func (m *waiter) read(g *psGroup) {
	defer m.wg.Done()
	backoff := 10 * time.Millisecond
	for {
		wait := pingEvery
		if m.probe != "" {
			wait = probeEvery
		}
		msg, err := g.ps.ReceiveTimeout(m.ctx, wait)
		if m.ctx.Err() != nil || m.groupClosed(g) {
			return
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				m.sweep()
				if m.probe != "" && m.checkProbe(g) {
					return // moved to a new connection, with its own reader
				}
				_ = g.ps.Ping(m.ctx)
				continue
			}
			// The connection broke (go-redis redials and resubscribes
			// on the next receive), or the node refused a subscription
			// (MOVED: the slot has another master). Messages may have
			// been missed: wake every waiter of this connection to try
			// again, and let a failover's new master be found (see
			// waiter_failover.go).
			m.c.refreshTopology(err)
			m.failGroup(g, connectionError(err))
			if m.dropUnused(g) {
				return
			}
			t := time.NewTimer(backoff)
			select {
			case <-m.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(backoff*2, maxReconnectWait)
			// PING redials (and resubscribes) the connection: once that
			// works the node is back, even for a connection with no
			// channel left, which would receive nothing to say so.
			if g.ps.Ping(m.ctx) == nil {
				m.healGroup(g)
			}
			continue
		}
		backoff = 10 * time.Millisecond
		m.healGroup(g)
		switch x := msg.(type) {
		case *redis.Subscription:
			switch x.Kind {
			case "subscribe", "ssubscribe":
				m.confirm(g, x.Channel)
			case "sunsubscribe":
				m.unsubscribed(g, x.Channel)
			}
		case *redis.Message:
			m.wakeChannel(x.Channel)
		}
	}
}

// maxReconnectWait caps the pause between attempts to read from a broken
// pub/sub connection: it is resubscribed at most this long after its node
// (or, with Sentinel, the promoted master) accepts connections again.
const maxReconnectWait = 250 * time.Millisecond

func (m *waiter) confirm(g *psGroup, channel string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := m.unconfirmed[channel] - 1; n > 0 {
		m.unconfirmed[channel] = n
		return // an earlier SUBSCRIBE's confirmation
	}
	delete(m.unconfirmed, channel) // also absorbs resubscriptions after a reconnect
	cs := m.subs[channel]
	switch {
	case cs == nil || cs.group != g:
	case !cs.isConf:
		cs.isConf = true
		close(cs.confirmed)
		if cs.moved && len(cs.queue) > 0 {
			// Moved to another connection: a release published
			// meanwhile was missed, so the head tries again.
			cs.queue[0].poke()
		}
		cs.moved = false
	case len(cs.queue) > 0:
		// Resubscribed after a reconnect: a release published while the
		// connection was down was missed, so the head tries again.
		cs.queue[0].poke()
	}
}

// wakeChannel wakes the head of channel's queue: on a release message, and
// when a lock of this client ended without publishing.
func (m *waiter) wakeChannel(channel string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cs := m.subs[channel]; cs != nil && len(cs.queue) > 0 {
		cs.queue[0].poke()
	}
}

func (s *subscription) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// close ends every pub/sub connection and waits for the readers.
func (m *waiter) close() {
	m.mu.Lock()
	m.closed = true
	groups := m.groups
	m.groups = map[string]*psGroup{}
	m.mu.Unlock()
	m.cancel()
	for _, g := range groups {
		_ = g.ps.Close()
	}
	m.wg.Wait()
}

// wait is Acquire's wait for a held lock, after its first attempt found
// it held (rep) or was skipped because waiters of this client queue for
// the name. start is when Acquire was called: the wait limit counts from
// it.
//
// The wait ends at the earlier of ctx's end and the wait limit, where the
// limit is WithWaitLimit's when given, else DefaultWaitLimit when ctx has
// no deadline, else none (ctx's deadline decides).
func (c *Client) wait(ctx, wctx context.Context, name string, k keys, cfg config, holder string, start time.Time,
	rep acquireReply, lastErr error) (*Lock, error) {
	// Held: subscribe first, then try again, so that a release between
	// the failed attempt and the wait is seen either by the attempt or as
	// a message.
	waitStart := time.Now()
	var l *Lock
	done := func(err error) (*Lock, error) {
		c.observeAcquire(ctx, name, holder, start, time.Since(waitStart), l, rep, err)
		return l, err
	}
	var (
		wake   <-chan struct{} // nil: no notifications, expiry timer only
		sub    *subscription
		behind bool
		warned bool // about a failed subscription, once per wait
	)
	// subscribe registers the waiter; on failure it waits on the lock's
	// expiry and tries again after its next attempt (the node may be in
	// a failover).
	subscribe := func() error {
		s, b, err := c.waiter.subscribe(wctx, k.channel)
		switch {
		case err == nil:
			sub, wake, behind = s, s.wake, b
		case errors.Is(err, ErrClosed) || ctxEnded(wctx):
			return err
		case !warned:
			warned = true
			// The pub/sub connection failed but commands may work: wait
			// on the lock's expiry rather than fail.
			c.warn("fence: cannot subscribe to release notifications; waiting on lock expiry meanwhile",
				slog.String("name", name), slog.String("err", err.Error()))
		}
		return nil
	}
	if err := subscribe(); err != nil {
		return done(c.attemptErr(wctx, name, err, lastErr))
	}
	// Leaving without the lock passes a wake on to the next waiter.
	defer func() {
		if sub != nil {
			sub.close(l != nil)
		}
	}()
	announced := len(c.obs.wait) == 0
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	backoff := minErrorBackoff
	for {
		// A waiter that joined behind others waits for its wake (the
		// waiters ahead of it pass it on) before its first attempt; after
		// that, every waiter has a PTTL timer as the fallback.
		if !behind {
			var err error
			l, rep, err = c.attempt(wctx, name, k, cfg, holder)
			switch {
			case l != nil:
				return done(nil)
			case err != nil && transient(err) && !ctxEnded(wctx):
				// A failover, restart or slot move: the slot map is being
				// reloaded (see attempt); try again until the wait ends.
				lastErr = err
				timer.Reset(backoff)
				backoff = min(2*backoff, maxErrorBackoff)
			case err != nil:
				return done(c.attemptErr(wctx, name, err, lastErr))
			default:
				backoff, lastErr = minErrorBackoff, nil
				// Held, and its node answered: a subscription that failed,
				// or whose node is gone, is made again now, then the
				// attempt repeated (subscribe first, then try).
				if sub == nil {
					if err := subscribe(); err != nil {
						return done(c.attemptErr(wctx, name, err, lastErr))
					}
					if sub != nil {
						continue
					}
				} else if c.waiter.resubscribe(wctx, sub) {
					continue
				}
				wait := retryAfter(rep.pttl)
				if sub != nil && c.waiter.movePending(sub) {
					// Without this, a channel whose slot map was still
					// stale moved only at the lock's expiry.
					wait = min(wait, movePendingRetry)
				}
				timer.Reset(wait)
			}
		}
		if !announced {
			announced = true
			c.obs.onWait(ctx, WaitEvent{Name: name, Remaining: pttlDuration(rep.pttl)})
		}
		behind = false
		select {
		case <-wake:
		case <-timer.C:
		case <-c.closing:
			return done(ErrClosed)
		case <-wctx.Done():
			return done(waitEndErr(wctx, name, lastErr))
		}
	}
}

// Acquire's retries after transient errors (a failover, a restart) start
// at minErrorBackoff and double up to maxErrorBackoff: the wait goes on
// at most that long after the new master accepts commands.
const (
	minErrorBackoff = 10 * time.Millisecond
	maxErrorBackoff = 250 * time.Millisecond
)

// warn logs to the client's logger.
func (c *Client) warn(msg string, attrs ...slog.Attr) {
	c.cfg.logger.LogAttrs(context.Background(), slog.LevelWarn, msg, attrs...)
}

// retryAfter is how long a waiter sleeps when no release message comes:
// until the lock's PTTL has elapsed, plus jitter so that waiters of one
// expiring lock do not all retry in the same millisecond.
func retryAfter(pttl int64) time.Duration {
	switch {
	case pttl == -2: // gone between EXISTS and PTTL: retry now
		return 0
	case pttl < 0: // no expiry: only a release (or a hand) frees it
		return noExpiryWait
	}
	d := time.Duration(pttl) * time.Millisecond
	return d + rand.N(d/20+2*time.Millisecond)
}
