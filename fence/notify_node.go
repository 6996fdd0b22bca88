package fence

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// One pub/sub connection of the notifier (see notify.go), per node, and
// its two goroutines: the writer sends the node's SUBSCRIBEs and
// UNSUBSCRIBEs in order, the reader receives its messages and looks after
// the connection (redials, moves, the Sentinel probe: notify_move.go).
// Neither holds notifier.mu across a network call.

// psNode is one pub/sub connection and its two goroutines.
type psNode struct {
	n       *notifier
	addr    string      // "" when not a cluster
	client  RedisClient // what ps was made from
	ps      *redis.PubSub
	sharded bool
	kick    chan struct{} // cap 1: ops were queued, or the node closed
	// backoff is the reader's own: its pause before the next read of a
	// broken connection.
	backoff time.Duration

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

// nodeLocked returns the pub/sub node for addr, starting it if needed.
// Called with n.mu held; nothing is sent (a PubSub made without channels
// does not dial).
func (n *notifier) nodeLocked(client RedisClient, addr string) *psNode {
	if nd := n.nodes[addr]; nd != nil && !nd.closed {
		return nd
	}
	nd := &psNode{n: n, addr: addr, client: client, sharded: n.c.cluster, kick: make(chan struct{}, 1),
		backoff: minReconnectWait}
	if nd.sharded {
		nd.ps = client.SSubscribe(n.ctx)
	} else {
		nd.ps = client.Subscribe(n.ctx)
	}
	n.probe.subscribeOn(nd)
	n.nodes[addr] = nd
	n.wg.Add(2)
	go nd.write()
	go nd.read()
	return nd
}

// queue hands op to nd's writer. Called with n.mu held.
func (nd *psNode) queue(op psOp) {
	nd.ops = append(nd.ops, op)
	nd.poke()
}

func (nd *psNode) poke() {
	select {
	case nd.kick <- struct{}{}:
	default:
	}
}

// isClosed reports whether nd was closed (its reader and writer end).
func (nd *psNode) isClosed() bool {
	nd.n.mu.Lock()
	defer nd.n.mu.Unlock()
	return nd.closed
}

// write sends nd's queued SUBSCRIBEs and UNSUBSCRIBEs, in order. A failed
// one needs no retry: go-redis keeps the channel set of a PubSub and
// subscribes it again when the reader's connection is redialled.
func (nd *psNode) write() {
	n := nd.n
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
			nd.send(op)
		}
	}
}

// send sends one queued command, bounded by opTimeout.
func (nd *psNode) send(op psOp) {
	ctx, cancel := context.WithTimeout(nd.n.ctx, opTimeout)
	defer cancel()
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
	if err != nil {
		nd.n.c.cfg.logger.Debug("fence: pub/sub command failed; the reader resubscribes after a reconnect",
			slog.String("channel", op.ch), slog.String("node", nd.addr), slog.Any("err", err))
	}
}

// read receives nd's messages and looks after its connection, until the
// client closes or nd is closed (replaced, or no longer used).
func (nd *psNode) read() {
	n := nd.n
	defer n.wg.Done()
	for {
		msg, err := nd.ps.ReceiveTimeout(n.ctx, nd.receiveWait())
		if n.ctx.Err() != nil || nd.isClosed() {
			return
		}
		var ne net.Error
		switch {
		case err == nil:
			nd.backoff = minReconnectWait
			nd.received(msg)
		case errors.As(err, &ne) && ne.Timeout():
			if nd.upkeep() {
				return
			}
		default:
			if nd.recover(err) {
				return
			}
		}
	}
}

// receiveWait is how long nd's reader waits for a message before it looks
// after the connection: shorter while a channel waits to move, or on a
// failover client (the probe).
func (nd *psNode) receiveWait() time.Duration {
	switch {
	case nd.movePending():
		return movePendingRetry
	case nd.n.probe.on():
		return probeEvery
	}
	return pingEvery
}

// received handles a message or a subscription event: the connection
// works.
func (nd *psNode) received(msg any) {
	nd.heal()
	switch x := msg.(type) {
	case *redis.Subscription:
		switch x.Kind {
		case "subscribe", "ssubscribe":
			nd.confirm(x.Channel)
		case "sunsubscribe":
			nd.unsubscribed(x.Channel)
		}
	case *redis.Message:
		nd.n.dispatch(x.Channel, x.Payload)
	}
}

// upkeep runs when no message came for receiveWait: lingering channels
// are dropped, channels that must move are moved, the Sentinel probe is
// checked, and a PING keeps the connection honest. It reports whether nd
// was closed (its reader ends).
func (nd *psNode) upkeep() (closed bool) {
	n := nd.n
	n.sweep()
	if nd.movePending() && nd.moveChannels() {
		return true
	}
	if n.probe.on() && n.probe.check(nd) {
		return true // replaced by a new connection, with its own reader
	}
	_ = nd.ps.Ping(n.ctx)
	return false
}

// recover handles a failed read: the connection broke (go-redis redials
// and resubscribes on the next receive), or the node refused a
// subscription (MOVED: the slot has another master). Messages may have
// been missed: the waiters of this connection heartbeat at once, and a
// cluster's channels move once the slot map names a new master. It
// reports whether the reader must end (nd closed, or the client closing).
func (nd *psNode) recover(err error) (end bool) {
	n := nd.n
	n.c.refreshTopology(err)
	nd.fail(err)
	if nd.moveChannels() {
		return true
	}
	if !sleepCtx(n.ctx, nd.backoff) {
		return true
	}
	nd.backoff = min(nd.backoff*2, maxReconnectWait)
	// PING redials (and resubscribes) the connection: once that works the
	// node is back, even for a connection with no channel left, which
	// would receive nothing to say so.
	if nd.ps.Ping(n.ctx) == nil {
		nd.heal()
	}
	return false
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

// confirm records the server's confirmation of a subscription on nd.
func (nd *psNode) confirm(channel string) {
	n := nd.n
	n.mu.Lock()
	if !n.chans.confirmed(channel) {
		n.mu.Unlock()
		return // an earlier SUBSCRIBE's confirmation
	}
	pc := n.chans.get(channel)
	if pc == nil || pc.node != nd {
		n.mu.Unlock()
		return
	}
	wt := pc.watch // subscribed, or again: it reads the election
	var missed []*waiter
	if !pc.isConf {
		pc.isConf = true
		close(pc.confirmed)
		if pc.moved {
			// Moved to another node: a grant published meanwhile was
			// missed.
			missed = slices.Clone(pc.waiters)
		}
		pc.moved = false
	} else {
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

// fail records a failed read on nd (err) and makes every waiter of it
// heartbeat. A connection error breaks nd (its channels move when their
// slot has a new master); otherwise the node refused a command (a MOVED
// reply to a subscription, or NOPERM): the channels not yet confirmed on
// it must move. Either way err is what a subscription not yet confirmed
// on nd reports (see notifier.subscribe).
func (nd *psNode) fail(err error) {
	n := nd.n
	broken := connectionError(err)
	n.mu.Lock()
	if broken {
		nd.broken, nd.err = true, err
	}
	var missed []*waiter
	var watches []*watch
	for _, pc := range n.chans.on(nd) {
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
func (nd *psNode) heal() {
	n := nd.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if nd.broken {
		for _, pc := range n.chans.on(nd) {
			if connectionError(pc.err) {
				pc.err = nil
			}
		}
	}
	nd.broken, nd.err = false, nil
}
