package fence

import (
	"context"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// Channels that must change connection (see notify.go). On a cluster a
// sharded channel lives on the master of its slot: when the slot moves
// (a failover, a resharding) or the master's connection breaks, its
// channels move to the master the slot map names now, and a broken
// connection nobody uses any more is dropped. A failover client's single
// connection may stay on a demoted master after a graceful switch, still
// answering: sentinelProbe finds it and the channels move to a new
// connection. All of it runs in the node's reader goroutine.

// unsubscribed handles a SUNSUBSCRIBE from the server: when fence did not
// ask for it (the channel is still wanted on nd and confirmed), the slot
// moved to another master; the reader moves the channel once the slot
// map says where.
func (nd *psNode) unsubscribed(channel string) {
	n := nd.n
	n.mu.Lock()
	pc := n.chans.get(channel)
	unasked := pc != nil && pc.node == nd && pc.isConf && !n.chans.awaitsConfirmation(channel)
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
func (nd *psNode) movePending() bool {
	if !nd.sharded {
		return false
	}
	n := nd.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || nd.closed {
		return false
	}
	for _, pc := range n.chans.on(nd) {
		if nd.broken || pc.stale {
			return true
		}
	}
	return false
}

// moveChannels moves the channels of a cluster node whose connection is
// broken, or whose subscription the server dropped, to the master that
// serves their slot now, once the slot map names another one. It closes
// nd when no channel is left on it and reports whether it did.
func (nd *psNode) moveChannels() (closed bool) {
	n := nd.n
	cc, ok := n.c.rdb.(*redis.ClusterClient)
	if !ok || !nd.sharded {
		return false
	}
	n.mu.Lock()
	var chs []string
	for ch, pc := range n.chans.on(nd) {
		if nd.broken || pc.stale {
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
		nd.moveTo(ch, node)
	}
	return nd.dropUnused()
}

// moveTo subscribes ch, a channel of nd, on node instead.
func (nd *psNode) moveTo(ch string, node *redis.Client) {
	n := nd.n
	n.mu.Lock()
	defer n.mu.Unlock()
	pc := n.chans.get(ch)
	if pc == nil || pc.node != nd || n.closed {
		return
	}
	if !nd.broken {
		// Alive (the slot moved away): tell go-redis to forget the channel
		// there, so that a reconnect does not subscribe it again.
		nd.queue(psOp{ch: ch})
	}
	n.chans.attach(ch, pc, n.nodeLocked(node, node.Options().Addr))
	pc.stale, pc.moved = false, true
}

// dropUnused closes a cluster node's broken connection that no channel
// uses any more, rather than redial a node that may be gone for good; the
// next subscription to that node opens a new one.
func (nd *psNode) dropUnused() bool {
	n := nd.n
	n.mu.Lock()
	drop := nd.sharded && nd.broken && !nd.closed && !n.closed && n.chans.unusedOn(nd)
	if drop {
		n.closeNodeLocked(nd)
	}
	n.mu.Unlock()
	if drop {
		_ = nd.ps.Close() // outside the lock: it may wait for a dial in progress
	}
	return drop
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

// sentinelProbe tells whether a failover client's pub/sub connection is
// on the master: every connection subscribes a channel of this client's
// own, and the master counts its subscribers (PUBSUB NUMSUB). go-redis
// leaves the connection on a demoted master after a graceful switch. The
// zero probe (any other client) is off.
type sentinelProbe struct {
	channel string
}

func newSentinelProbe(prefix string) sentinelProbe {
	return sentinelProbe{channel: prefix + "probe:" + newHolderID()}
}

func (p sentinelProbe) on() bool { return p.channel != "" }

// subscribeOn queues the probe's SUBSCRIBE first on a new connection.
// Called with notifier.mu held.
func (p sentinelProbe) subscribeOn(nd *psNode) {
	if p.on() {
		nd.queue(psOp{ch: p.channel, sub: true})
	}
}

// check moves nd's channels to a new connection when the master does not
// see nd subscribed to the probe channel. It reports whether nd was
// replaced (and closed).
func (p sentinelProbe) check(nd *psNode) bool {
	n := nd.n
	n.mu.Lock()
	inUse := !n.chans.unusedOn(nd)
	n.mu.Unlock()
	if !inUse {
		return false
	}
	ctx, cancel := context.WithTimeout(n.ctx, probeEvery)
	defer cancel()
	counts, err := n.c.rdb.(*redis.Client).PubSubNumSub(ctx, p.channel).Result() // see isFailoverClient
	if err != nil || counts[p.channel] > 0 {
		return false // unknown, or on the master
	}
	return nd.replace()
}

// replace moves every channel of nd to a new connection of the same
// client, and closes nd. false when nd or the client closed meanwhile.
func (nd *psNode) replace() bool {
	n := nd.n
	n.mu.Lock()
	if n.closed || nd.closed {
		n.mu.Unlock()
		return false
	}
	n.closeNodeLocked(nd)
	nn := n.nodeLocked(n.c.rdb, nd.addr) // subscribes the probe first
	var missed []*waiter
	for ch, pc := range n.chans.on(nd) {
		n.chans.attach(ch, pc, nn)
		pc.moved = true
		missed = append(missed, pc.waiters...)
	}
	n.mu.Unlock()
	_ = nd.ps.Close()
	n.c.wd.beatSoon(missed...)
	return true
}
