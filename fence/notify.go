package fence

import (
	"cmp"
	"context"
	"errors"
	"runtime"
	"sync"
	"time"
)

// The pub/sub side of waiting. A handover (release.lua, see queue.lua)
// publishes "grant:<server µs>:<token>:<holder>" on the name's channel; a
// release with nobody queued publishes the released value. This client
// subscribes the channels of the names its waiters wait for (and of the
// elections it observes), one pub/sub connection per node (per cluster
// master, with sharded channels; one without a cluster), and hands each
// grant to the waiter it names.
//
// Messages are hints that save a round trip, never the only path: every
// waiter heartbeats (see wait.go), and a heartbeat that finds the lock
// handed to it takes it. A message may be missed while a connection is
// down, before a subscription is confirmed, or when the Redis user may not
// PUBLISH; the notifier then makes the waiters of the channel heartbeat at
// once where it can tell (a reconnect, a subscription moved).
//
// The notifier is split by responsibility:
//   - notifier (this file): what the rest of fence calls — a waiter's or a
//     watch's registration, the wait for a subscription, the deliveries
//     of grants and polls — and the state the parts share;
//   - chanTable and psChannel (notify_channels.go): the multiplexer's
//     table — each channel's listeners, its node, its confirmation — and
//     the linger of channels nobody listens to any more;
//   - psNode (notify_node.go): one pub/sub connection, its writer and
//     reader goroutines, and what the reader learns: confirmations,
//     messages, failures;
//   - moves (notify_move.go): a cluster channel whose slot moved goes to
//     the new master, and sentinelProbe finds a failover client's
//     connection left on a demoted master.
//
// Locks. notifier.mu guards the notifier's fields below it, the chanTable,
// and the psNode and psChannel fields marked so. In the package's lock
// order (see client.go) it is a leaf: taken with Client.mu held (Close) or
// with no mutex held, and nothing under it takes another mutex, sends on
// the network or calls a waiter, a watch or the watchdog: a method
// collects under it what must be done and does it after unlocking. The
// node of a channel is looked up (MasterForKey) before the mutex is
// taken, and a node's SUBSCRIBE and UNSUBSCRIBE are sent by its writer
// goroutine, so one slow or unreachable node stalls only the waiters
// whose channels it serves.

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
	// minReconnectWait and maxReconnectWait bound the pause between
	// attempts to read from a broken pub/sub connection: it is resubscribed
	// at most maxReconnectWait after its node (or, with Sentinel, the
	// promoted master) accepts connections again.
	minReconnectWait = 10 * time.Millisecond
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
	wg     sync.WaitGroup // the nodes' goroutines
	probe  sentinelProbe  // a failover client's; the zero probe otherwise

	mu     sync.Mutex
	closed bool
	nodes  map[string]*psNode // by address ("" when not a cluster)
	chans  chanTable
}

func newNotifier(c *Client) *notifier {
	ctx, cancel := context.WithCancel(context.Background())
	n := &notifier{c: c, ctx: ctx, cancel: cancel, nodes: map[string]*psNode{}, chans: newChanTable()}
	if isFailoverClient(c.rdb) {
		n.probe = newSentinelProbe(c.cfg.prefix)
	}
	return n
}

// warm reports whether channel has a confirmed subscription: a waiter
// registered before its first attempt then receives any grant published
// after it.
func (n *notifier) warm(channel string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	pc := n.chans.get(channel)
	return pc != nil && pc.warm()
}

// register adds w to its channel's waiters (the channel's subscription,
// if any, is kept; see subscribe). It reports whether the subscription
// was confirmed already.
func (n *notifier) register(w *waiter) (warm bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	pc := n.chans.use(w.k.channel)
	pc.waiters = append(pc.waiters, w)
	return pc.warm()
}

// unregister removes w. When w was this client's first waiter of the name
// and others remain, the new first one is returned (it takes over the
// polls at the holder's expiry from its next answer on, see
// waiter.nextBeat). The channel lingers subscribed after its last waiter.
func (n *notifier) unregister(w *waiter) (newFirst *waiter) {
	n.mu.Lock()
	defer n.mu.Unlock()
	pc := n.chans.get(w.k.channel)
	if pc == nil {
		return nil
	}
	newFirst, found := pc.removeWaiter(w)
	if found && pc.unused() && !n.closed {
		n.chans.linger(w.k.channel, pc, time.Now())
	}
	return newFirst
}

// addWatch makes wt the observer of channel (an election's events); the
// caller subscribes it.
func (n *notifier) addWatch(channel string, wt *watch) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.chans.use(channel).watch = wt
}

// removeWatch takes wt off channel, which lingers subscribed like a
// waiter's.
func (n *notifier) removeWatch(channel string, wt *watch) {
	n.mu.Lock()
	defer n.mu.Unlock()
	pc := n.chans.get(channel)
	if pc == nil || pc.watch != wt {
		return
	}
	pc.watch = nil
	if pc.unused() && !n.closed {
		n.chans.linger(channel, pc, time.Now())
	}
}

// first reports whether w is this client's first waiter of its name.
func (n *notifier) first(w *waiter) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.chans.firstWaiter(w.k.channel) == w
}

// allWaiters lists every registered waiter (Close).
func (n *notifier) allWaiters() []*waiter {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.chans.allWaiters()
}

// subscribe makes sure channel is subscribed and waits (bounded by ctx
// and confirmWait) for the server's confirmation. It returns nil once
// confirmed, or what kept it from subscribing: the node unknown, or what
// the node's connection met meanwhile (a dial error, NOPERM), or
// errUnconfirmed when nothing was heard in time; the waiter then relies
// on its heartbeats, and tries again later.
func (n *notifier) subscribe(ctx context.Context, channel string) error {
	pc, err := n.attach(ctx, channel)
	if pc == nil || err != nil {
		return err
	}
	return n.awaitConfirmation(ctx, pc)
}

// attach subscribes channel on its node unless it is on one already, and
// returns its entry: nil when every listener left meanwhile.
func (n *notifier) attach(ctx context.Context, channel string) (*psChannel, error) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, ErrClosed
	}
	pc := n.chans.get(channel)
	needNode := pc != nil && pc.detached()
	n.mu.Unlock()
	if !needNode {
		return pc, nil
	}
	node, addr, err := n.resolve(ctx, channel) // outside the mutex: it may wait for the slot map
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if pc = n.chans.get(channel); pc != nil && !n.closed && pc.detached() {
		nd := n.nodeLocked(node, addr)
		if nd.broken && nd.sharded {
			return nil, cmp.Or(nd.err, errNodeDown)
		}
		n.chans.attach(channel, pc, nd)
	}
	return pc, nil
}

// awaitConfirmation waits for the server's confirmation of pc's
// subscription (see subscribe).
func (n *notifier) awaitConfirmation(ctx context.Context, pc *psChannel) error {
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

// dispatch hands a message to this client's listeners of channel: an
// election's record to its watch; a grant to the waiters it names; a
// plain release message (from a version without handover, or with
// nobody queued at the time) makes this client's first waiter of the
// name heartbeat, which takes the lock or hands it to the queue's head.
func (n *notifier) dispatch(channel, payload string) {
	n.mu.Lock()
	pc := n.chans.get(channel)
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
	to := pc.waitersOf(holderOf(value))
	n.mu.Unlock()
	for _, w := range to {
		w.grantedAt(value, at)
	}
	if len(to) > 0 {
		// The reader yields before it reads again: a waiter woken by the
		// grant then returns from Acquire before the reader re-arms its
		// read (on one P, the waiter would otherwise wait for that).
		runtime.Gosched()
	}
}

// handedTo delivers a handover this client's own release made (release.lua
// answered with the new holder's value) to a waiter of this client, at
// once: start is when the release was sent, before the handover.
func (n *notifier) handedTo(channel, value string, start time.Time) {
	h := holderOf(value)
	n.mu.Lock()
	var to []*waiter
	if pc := n.chans.get(channel); pc != nil {
		to = pc.waitersOf(h)
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
	first := n.chans.firstWaiter(channel)
	n.mu.Unlock()
	n.c.wd.beatSoon(first)
}

// sweep unsubscribes the channels that lingered long enough (a reader
// whose connection was idle).
func (n *notifier) sweep() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.closed {
		n.chans.sweep(time.Now())
	}
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
