package fence

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The pub/sub side of waiting. A handover (release.lua, see queue.lua)
// publishes "grant:<server µs>:<token>:<holder>" on the name's channel; a
// release with nobody queued publishes the released value. This client
// subscribes the channels of the names its waiters wait for, one pub/sub
// connection per node (per cluster master, with sharded channels; one
// without a cluster), and hands each grant to the waiter it names.
//
// No mutex is held across a network call: a node's SUBSCRIBE and
// UNSUBSCRIBE are sent in order by that node's writer goroutine, its
// messages read by its reader goroutine, and the node of a channel is
// looked up (MasterForKey) by the waiter before it takes the notifier's
// mutex. So one slow or unreachable node stalls only the waiters whose
// channels it serves.
//
// Messages are hints that save a round trip, never the only path: every
// waiter heartbeats (see wait.go), and a heartbeat that finds the lock
// handed to it takes it. A message may be missed while a connection is
// down, before a subscription is confirmed, or when the Redis user may not
// PUBLISH; the notifier then makes the waiters of the channel heartbeat at
// once where it can tell (a reconnect, a subscription moved).

const (
	// confirmWait bounds the wait for a SUBSCRIBE confirmation; past it the
	// waiter goes on with its heartbeats alone (slower, still correct).
	confirmWait = time.Second
	// pingEvery is how long a reader waits for a message before it pings,
	// so that a dead connection is noticed and redialled.
	pingEvery = 30 * time.Second
	// subLinger is how long a channel stays subscribed after its last
	// waiter left: a name that is contended again soon (a lock passed
	// between two processes) then costs no SUBSCRIBE round trip and no
	// UNSUBSCRIBE on the way out of Acquire. Idle channels are dropped when
	// another waiter leaves or when the connection is idle for pingEvery,
	// so one lingers between subLinger and about pingEvery.
	subLinger = time.Second
	// opTimeout bounds one SUBSCRIBE or UNSUBSCRIBE sent by a writer.
	opTimeout = 5 * time.Second
	// maxReconnectWait caps the pause between attempts to read from a
	// broken pub/sub connection: it is resubscribed at most this long after
	// its node (or, with Sentinel, the promoted master) accepts connections
	// again.
	maxReconnectWait = 250 * time.Millisecond
	// movePendingRetry is how often a reader retries moving a channel whose
	// slot moved while the slot map still names the old node: go-redis
	// reloads it in the background, typically within milliseconds.
	movePendingRetry = 100 * time.Millisecond
	// probeEvery is how often a failover client's reader checks that its
	// connection is on the current master, while channels are subscribed.
	probeEvery = time.Second
)

// errNodeDown is the subscription error while the pub/sub connection of
// the channel's node is broken.
var errNodeDown = errors.New("fence: the node of this lock's channel is unreachable")

// errUnconfirmed: the server did not confirm a subscription within
// confirmWait.
var errUnconfirmed = errors.New("fence: no pub/sub confirmation")

type notifier struct {
	c      *Client
	ctx    context.Context // cancelled by close; ends the goroutines
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	nodes  map[string]*psNode    // by address ("" when not a cluster)
	chans  map[string]*psChannel // by channel
	// unconfirmed counts SUBSCRIBEs queued per channel whose confirmation
	// has not arrived: after a quick unsubscribe and subscribe, the old
	// confirmation must not pass for the new one.
	unconfirmed map[string]int
	// idle lists channels in the order their last waiter left (entries may
	// be stale: a channel used again, or emptied again later).
	idle []idleChannel
	wg   sync.WaitGroup
	// probe is a channel of this client's own, subscribed on a failover
	// client's pub/sub connection to tell whether it is on the master; ""
	// otherwise.
	probe string
}

// psNode is one pub/sub connection and its two goroutines.
type psNode struct {
	addr    string      // "" when not a cluster
	client  RedisClient // what ps was made from
	ps      *redis.PubSub
	sharded bool
	kick    chan struct{} // cap 1: ops were queued, or the node closed

	// Guarded by notifier.mu.
	ops []psOp
	// broken while the connection fails (cleared once it answers again),
	// with err the failure; closed once its channels moved to other nodes
	// or the client closed.
	broken, closed bool
	err            error
}

type psOp struct {
	ch  string
	sub bool // SUBSCRIBE; else UNSUBSCRIBE
}

// psChannel is one channel of this client: its subscription and the
// waiters of its name.
type psChannel struct {
	node      *psNode   // nil until a node could be resolved
	waiters   []*waiter // by arrival in this client
	watch     *watch    // an election's observers (its events channel); nil for a lock's channel
	confirmed chan struct{}
	isConf    bool
	moved     bool      // subscribed on another node, unconfirmed: missed messages
	stale     bool      // the server dropped it (its slot moved): must move
	err       error     // what the node answered since it was subscribed, while unconfirmed
	idleSince time.Time // when the last waiter left; zero while in use
}

type idleChannel struct {
	ch string
	at time.Time
}

func newNotifier(c *Client) *notifier {
	ctx, cancel := context.WithCancel(context.Background())
	n := &notifier{c: c, ctx: ctx, cancel: cancel,
		nodes: map[string]*psNode{}, chans: map[string]*psChannel{}, unconfirmed: map[string]int{}}
	if isFailoverClient(c.rdb) {
		n.probe = c.cfg.prefix + "probe:" + newHolderID()
	}
	return n
}

// warm reports whether channel has a confirmed subscription: a waiter
// registered before its first attempt then receives any grant published
// after it.
func (n *notifier) warm(channel string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	pc := n.chans[channel]
	return pc != nil && pc.isConf && pc.node != nil && !pc.node.broken
}

// register adds w to its channel's waiters (the channel's subscription,
// if any, is kept; see subscribe). It reports whether the subscription
// was confirmed already.
func (n *notifier) register(w *waiter) (warm bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	pc := n.chans[w.k.channel]
	if pc == nil {
		pc = &psChannel{confirmed: make(chan struct{})}
		n.chans[w.k.channel] = pc
	}
	pc.idleSince = time.Time{}
	pc.waiters = append(pc.waiters, w)
	return pc.isConf && pc.node != nil && !pc.node.broken
}

// unregister removes w. When w was this client's first waiter of the name
// and others remain, the new first one is returned (it takes over the
// polls at the holder's expiry from its next answer on, see
// waiter.nextBeat). The channel lingers subscribed after its last waiter.
func (n *notifier) unregister(w *waiter) (newFirst *waiter) {
	n.mu.Lock()
	defer n.mu.Unlock()
	pc := n.chans[w.k.channel]
	if pc == nil {
		return nil
	}
	i := slices.Index(pc.waiters, w)
	if i < 0 {
		return nil
	}
	pc.waiters = slices.Delete(pc.waiters, i, i+1)
	if len(pc.waiters) > 0 {
		if i == 0 {
			return pc.waiters[0]
		}
		return nil
	}
	if !n.closed && pc.watch == nil {
		now := time.Now()
		n.sweepLocked(now)
		pc.idleSince = now
		n.idle = append(n.idle, idleChannel{w.k.channel, now})
	}
	return nil
}

// addWatch makes wt the observer of channel (an election's events); the
// caller subscribes it.
func (n *notifier) addWatch(channel string, wt *watch) {
	n.mu.Lock()
	defer n.mu.Unlock()
	pc := n.chans[channel]
	if pc == nil {
		pc = &psChannel{confirmed: make(chan struct{})}
		n.chans[channel] = pc
	}
	pc.idleSince = time.Time{}
	pc.watch = wt
}

// removeWatch takes wt off channel, which lingers subscribed like a
// waiter's.
func (n *notifier) removeWatch(channel string, wt *watch) {
	n.mu.Lock()
	defer n.mu.Unlock()
	pc := n.chans[channel]
	if pc == nil || pc.watch != wt {
		return
	}
	pc.watch = nil
	if len(pc.waiters) == 0 && !n.closed {
		now := time.Now()
		n.sweepLocked(now)
		pc.idleSince = now
		n.idle = append(n.idle, idleChannel{channel, now})
	}
}

// first reports whether w is this client's first waiter of its name.
func (n *notifier) first(w *waiter) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	pc := n.chans[w.k.channel]
	return pc != nil && len(pc.waiters) > 0 && pc.waiters[0] == w
}

// subscribe makes sure channel is subscribed and waits (bounded by ctx
// and confirmWait) for the server's confirmation. It returns nil once
// confirmed, or what kept it from subscribing: the node unknown, or what
// the node's connection met meanwhile (a dial error, NOPERM), or
// errUnconfirmed when nothing was heard in time; the waiter then relies
// on its heartbeats, and tries again later.
func (n *notifier) subscribe(ctx context.Context, channel string) error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return ErrClosed
	}
	pc := n.chans[channel]
	if pc == nil {
		n.mu.Unlock()
		return nil // every waiter left meanwhile
	}
	needNode := pc.node == nil || pc.node.closed
	n.mu.Unlock()
	if needNode {
		node, addr, err := n.resolve(ctx, channel) // outside the mutex: it may wait for the slot map
		if err != nil {
			return err
		}
		n.mu.Lock()
		if pc = n.chans[channel]; pc != nil && !n.closed && (pc.node == nil || pc.node.closed) {
			nd := n.nodeLocked(node, addr)
			if nd.broken && nd.sharded {
				err := cmp.Or(nd.err, errNodeDown)
				n.mu.Unlock()
				return err
			}
			n.attachLocked(pc, channel, nd)
		}
		n.mu.Unlock()
		if pc == nil {
			return nil
		}
	}
	n.mu.Lock()
	confirmed, isConf := pc.confirmed, pc.isConf
	n.mu.Unlock()
	if isConf {
		return nil
	}
	t := time.NewTimer(confirmWait)
	defer t.Stop()
	select {
	case <-confirmed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		n.mu.Lock()
		err := pc.err
		n.mu.Unlock()
		return cmp.Or(err, errUnconfirmed)
	}
}

// resolve returns the node that serves channel: the cluster master of its
// slot, or the client itself.
func (n *notifier) resolve(ctx context.Context, channel string) (RedisClient, string, error) {
	if n.c.router == nil {
		return n.c.rdb, "", nil
	}
	node, err := n.c.router.MasterForKey(ctx, channel)
	if err != nil {
		return nil, "", err
	}
	return node, node.Options().Addr, nil
}

// nodeLocked returns the pub/sub node for addr, starting it if needed.
// Called with n.mu held; nothing is sent (a PubSub made without channels
// does not dial).
func (n *notifier) nodeLocked(client RedisClient, addr string) *psNode {
	if nd := n.nodes[addr]; nd != nil && !nd.closed {
		return nd
	}
	nd := &psNode{addr: addr, client: client, sharded: n.c.cluster, kick: make(chan struct{}, 1)}
	if nd.sharded {
		nd.ps = client.SSubscribe(n.ctx)
	} else {
		nd.ps = client.Subscribe(n.ctx)
	}
	if n.probe != "" {
		nd.ops = append(nd.ops, psOp{ch: n.probe, sub: true})
		nd.poke()
	}
	n.nodes[addr] = nd
	n.wg.Add(2)
	go n.write(nd)
	go n.read(nd)
	return nd
}

// attachLocked subscribes pc (channel) on nd. Called with n.mu held.
func (n *notifier) attachLocked(pc *psChannel, channel string, nd *psNode) {
	pc.node = nd
	pc.isConf, pc.err = false, nil
	pc.confirmed = make(chan struct{})
	n.unconfirmed[channel]++
	nd.ops = append(nd.ops, psOp{ch: channel, sub: true})
	nd.poke()
}

func (nd *psNode) poke() {
	select {
	case nd.kick <- struct{}{}:
	default:
	}
}

// write sends nd's queued SUBSCRIBEs and UNSUBSCRIBEs, in order. A failed
// one needs no retry: go-redis keeps the channel set of a PubSub and
// subscribes it again when the reader's connection is redialled.
func (n *notifier) write(nd *psNode) {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-nd.kick:
		}
		n.mu.Lock()
		ops, closed := nd.ops, nd.closed
		nd.ops = nil
		n.mu.Unlock()
		if closed {
			return
		}
		for _, op := range ops {
			ctx, cancel := context.WithTimeout(n.ctx, opTimeout)
			var err error
			switch {
			case op.sub && nd.sharded:
				err = nd.ps.SSubscribe(ctx, op.ch)
			case op.sub:
				err = nd.ps.Subscribe(ctx, op.ch)
			case nd.sharded:
				err = nd.ps.SUnsubscribe(ctx, op.ch)
			default:
				err = nd.ps.Unsubscribe(ctx, op.ch)
			}
			cancel()
			if err != nil {
				n.c.cfg.logger.Debug("fence: pub/sub command failed; the reader resubscribes after a reconnect",
					slog.String("channel", op.ch), slog.String("node", nd.addr), slog.Any("err", err))
			}
		}
	}
}

// sweepLocked unsubscribes the channels idle for subLinger or longer.
// Called with n.mu held; the UNSUBSCRIBE is queued behind any SUBSCRIBE
// of the same channel on the same node, so the two stay ordered.
func (n *notifier) sweepLocked(now time.Time) {
	i := 0
	for ; i < len(n.idle); i++ {
		e := n.idle[i]
		pc := n.chans[e.ch]
		if pc == nil || !pc.idleSince.Equal(e.at) {
			continue // used again since (a later entry, if idle again)
		}
		if now.Sub(e.at) < subLinger {
			break // the later entries are newer
		}
		delete(n.chans, e.ch)
		if nd := pc.node; nd != nil && !nd.closed {
			nd.ops = append(nd.ops, psOp{ch: e.ch})
			nd.poke()
		}
	}
	n.idle = slices.Delete(n.idle, 0, i)
}

func (n *notifier) sweep() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.closed {
		n.sweepLocked(time.Now())
	}
}

// read receives nd's messages and watches its connection.
func (n *notifier) read(nd *psNode) {
	defer n.wg.Done()
	backoff := 10 * time.Millisecond
	for {
		msg, err := nd.ps.ReceiveTimeout(n.ctx, n.receiveWait(nd))
		if n.ctx.Err() != nil || n.nodeClosed(nd) {
			return
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				n.sweep()
				if n.movePending(nd) && n.moveChannels(nd) {
					return
				}
				if n.probe != "" && n.checkProbe(nd) {
					return // replaced by a new connection, with its own reader
				}
				_ = nd.ps.Ping(n.ctx)
				continue
			}
			// The connection broke (go-redis redials and resubscribes on
			// the next receive), or the node refused a subscription
			// (MOVED: the slot has another master). Messages may have been
			// missed: the waiters of this connection heartbeat at once, and
			// a cluster's channels move once the slot map names a new
			// master.
			n.c.refreshTopology(err)
			n.fail(nd, err)
			if n.moveChannels(nd) {
				return
			}
			if !sleepCtx(n.ctx, backoff) {
				return
			}
			backoff = min(backoff*2, maxReconnectWait)
			// PING redials (and resubscribes) the connection: once that
			// works the node is back, even for a connection with no
			// channel left, which would receive nothing to say so.
			if nd.ps.Ping(n.ctx) == nil {
				n.heal(nd)
			}
			continue
		}
		backoff = 10 * time.Millisecond
		n.heal(nd)
		switch x := msg.(type) {
		case *redis.Subscription:
			switch x.Kind {
			case "subscribe", "ssubscribe":
				n.confirm(nd, x.Channel)
			case "sunsubscribe":
				n.unsubscribed(nd, x.Channel)
			}
		case *redis.Message:
			n.dispatch(x.Channel, x.Payload)
		}
	}
}

// receiveWait is how long nd's reader waits for a message before it looks
// after the connection: shorter while a channel waits to move, or on a
// failover client (the probe).
func (n *notifier) receiveWait(nd *psNode) time.Duration {
	switch {
	case n.movePending(nd):
		return movePendingRetry
	case n.probe != "":
		return probeEvery
	}
	return pingEvery
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (n *notifier) nodeClosed(nd *psNode) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return nd.closed
}

// confirm records the server's confirmation of a subscription.
func (n *notifier) confirm(nd *psNode, channel string) {
	n.mu.Lock()
	if c := n.unconfirmed[channel] - 1; c > 0 {
		n.unconfirmed[channel] = c
		n.mu.Unlock()
		return // an earlier SUBSCRIBE's confirmation
	}
	delete(n.unconfirmed, channel) // also absorbs resubscriptions after a reconnect
	pc := n.chans[channel]
	var missed []*waiter
	var wt *watch
	if pc != nil && pc.node == nd {
		wt = pc.watch // subscribed, or again: it reads the election
	}
	switch {
	case pc == nil || pc.node != nd:
	case !pc.isConf:
		pc.isConf = true
		close(pc.confirmed)
		if pc.moved {
			// Moved to another node: a grant published meanwhile was
			// missed.
			missed = slices.Clone(pc.waiters)
		}
		pc.moved = false
	default:
		// Resubscribed after a reconnect: a grant published while the
		// connection was down was missed.
		missed = slices.Clone(pc.waiters)
	}
	n.mu.Unlock()
	if wt != nil {
		wt.confirmed()
	}
	n.c.wd.beatSoon(missed...)
}

// dispatch hands a grant to the waiters of this client it names; a
// plain release message (from a version without handover, or with
// nobody queued at the time) makes this client's first waiter of the
// name heartbeat, which takes the lock or hands it to the queue's head.
func (n *notifier) dispatch(channel, payload string) {
	n.mu.Lock()
	pc := n.chans[channel]
	if pc != nil && pc.watch != nil {
		wt := pc.watch
		n.mu.Unlock()
		wt.message(payload)
		return
	}
	at, value, grant := parseGrant(payload)
	if pc == nil || len(pc.waiters) == 0 {
		n.mu.Unlock()
		return
	}
	if !grant {
		first := pc.waiters[0]
		n.mu.Unlock()
		n.c.wd.beatSoon(first)
		return
	}
	var to []*waiter
	h := holderOf(value)
	for _, w := range pc.waiters {
		if w.holder == h {
			to = append(to, w)
		}
	}
	n.mu.Unlock()
	for _, w := range to {
		w.grantedAt(value, at)
	}
}

// handedTo delivers a handover this client's own release made (release.lua
// answered with the new holder's value) to a waiter of this client, at
// once: start is when the release was sent, before the handover.
func (n *notifier) handedTo(channel, value string, start time.Time) {
	h := holderOf(value)
	n.mu.Lock()
	var to []*waiter
	if pc := n.chans[channel]; pc != nil {
		for _, w := range pc.waiters {
			if w.holder == h {
				to = append(to, w)
			}
		}
	}
	n.mu.Unlock()
	for _, w := range to {
		w.handedOver(value, start)
	}
}

// poll makes this client's first waiter of channel heartbeat now: a lock
// of this client ended without handing over (lost), so the lock may be
// free with nobody told.
func (n *notifier) poll(channel string) {
	n.mu.Lock()
	var first *waiter
	if pc := n.chans[channel]; pc != nil && len(pc.waiters) > 0 {
		first = pc.waiters[0]
	}
	n.mu.Unlock()
	n.c.wd.beatSoon(first)
}

// fail records a failed read on nd (err) and makes every waiter of it
// heartbeat. A connection error breaks nd (its channels move when their
// slot has a new master); otherwise the node refused a command (a MOVED
// reply to a subscription, or NOPERM): the channels not yet confirmed on
// it must move. Either way err is what a subscription not yet confirmed
// on nd reports (see subscribe).
func (n *notifier) fail(nd *psNode, err error) {
	broken := connectionError(err)
	n.mu.Lock()
	if broken {
		nd.broken, nd.err = true, err
	}
	var missed []*waiter
	var watches []*watch
	for _, pc := range n.chans {
		if pc.node != nd {
			continue
		}
		if !pc.isConf {
			pc.err = err
			if !broken {
				pc.stale = true
			}
		}
		missed = append(missed, pc.waiters...)
		if pc.watch != nil {
			watches = append(watches, pc.watch)
		}
	}
	n.mu.Unlock()
	for _, wt := range watches {
		wt.broken()
	}
	n.c.wd.beatSoon(missed...)
}

// heal records that nd's connection works again (a message arrived, or a
// PING was sent on a redialled connection): its failure is over, and so
// is the connection error its unconfirmed channels recorded, which would
// otherwise pass for the state of a subscription still waiting for its
// confirmation. A refusal (NOPERM, MOVED) stays: the connection's health
// does not answer it. fail records connection errors only with nd broken.
func (n *notifier) heal(nd *psNode) {
	n.mu.Lock()
	if nd.broken {
		for _, pc := range n.chans {
			if pc.node == nd && connectionError(pc.err) {
				pc.err = nil
			}
		}
	}
	nd.broken, nd.err = false, nil
	n.mu.Unlock()
}

// unsubscribed handles a SUNSUBSCRIBE from the server: when fence did not
// ask for it (the channel is still wanted on nd and confirmed), the slot
// moved to another master; the reader moves the channel once the slot
// map says where.
func (n *notifier) unsubscribed(nd *psNode, channel string) {
	n.mu.Lock()
	pc := n.chans[channel]
	unasked := pc != nil && pc.node == nd && pc.isConf && n.unconfirmed[channel] == 0
	var missed []*waiter
	var wt *watch
	if unasked {
		pc.stale = true
		missed = slices.Clone(pc.waiters)
		wt = pc.watch
	}
	n.mu.Unlock()
	if wt != nil {
		wt.broken() // polls until the channel is subscribed on its new master
	}
	if unasked {
		if cc, ok := n.c.rdb.(*redis.ClusterClient); ok {
			cc.ReloadState(context.Background())
		}
		n.c.wd.beatSoon(missed...)
	}
}

// movePending reports whether a channel of nd must move (its connection
// is broken, or the server dropped the subscription).
func (n *notifier) movePending(nd *psNode) bool {
	if !nd.sharded {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || nd.closed {
		return false
	}
	for _, pc := range n.chans {
		if pc.node == nd && (nd.broken || pc.stale) {
			return true
		}
	}
	return false
}

// moveChannels moves the channels of a cluster node whose connection is
// broken, or whose subscription the server dropped, to the master that
// serves their slot now, once the slot map names another one. It closes
// nd when no channel is left on it and reports whether it did.
func (n *notifier) moveChannels(nd *psNode) (closed bool) {
	cc, ok := n.c.rdb.(*redis.ClusterClient)
	if !ok || !nd.sharded {
		return false
	}
	n.mu.Lock()
	var chs []string
	for ch, pc := range n.chans {
		if pc.node == nd && (nd.broken || pc.stale) {
			chs = append(chs, ch)
		}
	}
	n.mu.Unlock()
	for _, ch := range chs {
		ctx, cancel := context.WithTimeout(n.ctx, time.Second)
		node, err := cc.MasterForKey(ctx, ch)
		cancel()
		if err != nil || node.Options().Addr == nd.addr {
			continue // the slot map still names nd: a later call retries
		}
		n.mu.Lock()
		if pc := n.chans[ch]; pc != nil && pc.node == nd && !n.closed {
			if !nd.broken {
				// Alive (the slot moved away): tell go-redis to forget the
				// channel there, so that a reconnect does not subscribe it
				// again.
				nd.ops = append(nd.ops, psOp{ch: ch})
				nd.poke()
			}
			n.attachLocked(pc, ch, n.nodeLocked(node, node.Options().Addr))
			pc.stale, pc.moved = false, true
		}
		n.mu.Unlock()
	}
	return n.dropUnused(nd)
}

// dropUnused closes a cluster node's broken connection that no channel
// uses any more, rather than redial a node that may be gone for good; the
// next subscription to that node opens a new one.
func (n *notifier) dropUnused(nd *psNode) bool {
	n.mu.Lock()
	drop := nd.sharded && nd.broken && !nd.closed && !n.closed && n.unusedLocked(nd)
	if drop {
		n.closeNodeLocked(nd)
	}
	n.mu.Unlock()
	if drop {
		_ = nd.ps.Close() // outside the lock: it may wait for a dial in progress
	}
	return drop
}

// unusedLocked reports whether no channel uses nd. Called with n.mu held.
func (n *notifier) unusedLocked(nd *psNode) bool {
	for _, pc := range n.chans {
		if pc.node == nd {
			return false
		}
	}
	return true
}

// closeNodeLocked marks nd closed; the caller closes its PubSub after
// unlocking. Called with n.mu held.
func (n *notifier) closeNodeLocked(nd *psNode) {
	nd.closed = true
	if n.nodes[nd.addr] == nd {
		delete(n.nodes, nd.addr)
	}
	nd.poke() // the writer ends
}

// isFailoverClient reports a client made by redis.NewFailoverClient.
func isFailoverClient(rdb RedisClient) bool {
	c, ok := rdb.(*redis.Client)
	return ok && c.Options().Addr == "FailoverClient"
}

// checkProbe moves nd's channels to a new connection when the master does
// not see nd subscribed to the probe channel: go-redis leaves a failover
// client's pub/sub connection on a demoted master after a graceful
// switch. It reports whether nd was replaced (and closed).
func (n *notifier) checkProbe(nd *psNode) bool {
	n.mu.Lock()
	inUse := !n.unusedLocked(nd)
	n.mu.Unlock()
	if !inUse {
		return false
	}
	ctx, cancel := context.WithTimeout(n.ctx, probeEvery)
	defer cancel()
	counts, err := n.c.rdb.(*redis.Client).PubSubNumSub(ctx, n.probe).Result() // see isFailoverClient
	if err != nil || counts[n.probe] > 0 {
		return false // unknown, or on the master
	}
	n.mu.Lock()
	if n.closed || nd.closed {
		n.mu.Unlock()
		return false
	}
	n.closeNodeLocked(nd)
	nn := n.nodeLocked(n.c.rdb, nd.addr) // subscribes the probe first
	var missed []*waiter
	for ch, pc := range n.chans {
		if pc.node == nd {
			n.attachLocked(pc, ch, nn)
			pc.moved = true
			missed = append(missed, pc.waiters...)
		}
	}
	n.mu.Unlock()
	_ = nd.ps.Close()
	n.c.wd.beatSoon(missed...)
	return true
}

// close ends every pub/sub connection and waits for the goroutines.
func (n *notifier) close() {
	n.mu.Lock()
	n.closed = true
	nodes := n.nodes
	n.nodes = map[string]*psNode{}
	for _, nd := range nodes {
		nd.closed = true
	}
	n.mu.Unlock()
	n.cancel()
	for _, nd := range nodes {
		_ = nd.ps.Close()
	}
	n.wg.Wait()
}

// waitersLocked lists every registered waiter (Close). Called with n.mu
// held.
func (n *notifier) allWaiters() []*waiter {
	n.mu.Lock()
	defer n.mu.Unlock()
	var ws []*waiter
	for _, pc := range n.chans {
		ws = append(ws, pc.waiters...)
	}
	return ws
}
