package prequeue

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
)

// Waiters through a failover.
//
// Without a cluster there is one pub/sub connection, and go-redis redials
// and resubscribes it on its own: to the same server, or with a failover
// client to the master Sentinel names at that moment. The reader retries
// at most maxReconnectWait apart, and a resubscription's confirmation
// wakes the head waiter, which tries again in case a release was published
// while the connection was down.
//
// On a cluster, a channel's connection is bound to the master that served
// its slot when the waiter subscribed. When that master dies, or the
// server drops the subscription because the slot moved (SUNSUBSCRIBE from
// the server), the channel must move to the slot's new master: the head
// waiter does that (resubscribe) after an attempt found the lock still
// held, which is also when the slot map is known to be fresh, since the
// attempt reached the new master. A connection whose channels all moved is
// closed and its reader ends.

// errNodeDown is the subscription error while the pub/sub connection of
// the channel's node is broken.
var errNodeDown = errors.New("fence: the node of this lock's channel is unreachable")

// groupClosed reports whether g was closed because its channels moved.
func (m *waiter) groupClosed(g *psGroup) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return g.closed
}

// failGroup records a failed read on g and wakes every waiter of it.
// broken: the connection failed (its channels move when their slot has a
// new master); otherwise the node refused a command (a MOVED reply to a
// subscription): the channels not yet confirmed on it must move.
func (m *waiter) failGroup(g *psGroup, broken bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if broken {
		g.broken = true
	}
	for _, cs := range m.subs {
		if cs.group != g {
			continue
		}
		if !broken && !cs.isConf {
			cs.stale = true
		}
		for _, s := range cs.queue {
			s.poke()
		}
	}
}

// healGroup records that g delivered a message again.
func (m *waiter) healGroup(g *psGroup) {
	m.mu.Lock()
	g.broken = false
	m.mu.Unlock()
}

// unsubscribed handles a SUNSUBSCRIBE from the server: when fence did not
// ask for it (the channel is still wanted on g and confirmed), the slot
// moved to another master; the head waiter is woken to move the channel.
func (m *waiter) unsubscribed(g *psGroup, channel string) {
	m.mu.Lock()
	cs := m.subs[channel]
	unasked := cs != nil && cs.group == g && cs.isConf && m.unconfirmed[channel] == 0
	if unasked {
		cs.stale = true
		if len(cs.queue) > 0 {
			cs.queue[0].poke()
		}
	}
	m.mu.Unlock()
	if unasked {
		if cc, ok := m.c.rdb.(*redis.ClusterClient); ok {
			cc.ReloadState(context.Background())
		}
	}
}

// resubscribe moves s's channel to the master that now serves its slot,
// when its connection is broken or the server dropped it, and waits
// (bounded by ctx and confirmWait) for the new subscription's
// confirmation. It reports whether it subscribed anew: the caller then
// attempts again at once, since a release may have been published before
// the new subscription. Nothing moves while the slot map still names the
// old node: a later call retries.
func (m *waiter) resubscribe(ctx context.Context, s *subscription) bool {
	cc, ok := m.c.rdb.(*redis.ClusterClient)
	if !ok {
		return false
	}
	m.mu.Lock()
	cs := m.subs[s.ch]
	if m.closed || cs == nil || (!cs.group.broken && !cs.stale) {
		m.mu.Unlock()
		return false
	}
	node, err := cc.MasterForKey(ctx, s.ch)
	if err != nil || node.Options().Addr == cs.group.addr {
		m.mu.Unlock()
		return false
	}
	old := cs.group
	g := m.groups[node.Options().Addr]
	if g == nil {
		g = m.newGroup(node, node.Options().Addr)
	}
	if err := g.ps.SSubscribe(ctx, s.ch); err != nil {
		m.mu.Unlock()
		return false
	}
	m.unconfirmed[s.ch]++
	cs.group, cs.stale, cs.isConf, cs.confirmed, cs.moved = g, false, false, make(chan struct{}), true
	confirmed := cs.confirmed
	var drop *psGroup
	if !old.broken {
		// Alive (the slot moved away): tell go-redis to forget the
		// channel there, so that a reconnect does not subscribe it again.
		_ = old.ps.SUnsubscribe(ctx, s.ch)
	}
	if m.unusedLocked(old) {
		old.closed = true
		if m.groups[old.addr] == old {
			delete(m.groups, old.addr)
		}
		drop = old
	}
	m.mu.Unlock()
	if drop != nil {
		_ = drop.ps.Close() // outside the lock: it may wait for a dial in progress
	}
	t := time.NewTimer(confirmWait)
	defer t.Stop()
	select {
	case <-confirmed:
	case <-ctx.Done():
	case <-t.C:
	}
	return true
}

// movePending reports whether s's channel must move (its cluster node's
// connection broke or the server dropped it) but resubscribe could not move
// it yet: the slot map still named the old node. The waiter then tries
// again after movePendingRetry rather than at the lock's expiry.
func (m *waiter) movePending(s *subscription) bool {
	if _, ok := m.c.rdb.(*redis.ClusterClient); !ok {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cs := m.subs[s.ch]
	return !m.closed && cs != nil && (cs.group.broken || cs.stale)
}

// movePendingRetry spaces a waiter's attempts while its channel waits to
// move: go-redis reloads the slot map in the background, typically within
// milliseconds of a failover or slot move.
const movePendingRetry = 100 * time.Millisecond

// dropUnused closes a cluster node's broken connection that no channel
// uses any more, rather than redial a node that may be gone for good; the
// next subscription to that node opens a new one. It reports whether g
// was closed.
func (m *waiter) dropUnused(g *psGroup) bool {
	m.mu.Lock()
	drop := g.sharded && g.broken && !g.closed && !m.closed && m.unusedLocked(g)
	if drop {
		g.closed = true
		if m.groups[g.addr] == g {
			delete(m.groups, g.addr)
		}
	}
	m.mu.Unlock()
	if drop {
		_ = g.ps.Close()
	}
	return drop
}

// unusedLocked reports whether no channel uses g. Called with m.mu held.
func (m *waiter) unusedLocked(g *psGroup) bool {
	for _, cs := range m.subs {
		if cs.group == g {
			return false
		}
	}
	return true
}

// probeEvery is how often a failover client's waiter checks that its
// pub/sub connection is on the current master, while channels are
// subscribed.
const probeEvery = time.Second

// isFailoverClient reports a client made by redis.NewFailoverClient.
func isFailoverClient(rdb RedisClient) bool {
	c, ok := rdb.(*redis.Client)
	return ok && c.Options().Addr == "FailoverClient"
}

// checkProbe moves g's channels to a new connection when the master does
// not see g subscribed to the probe channel. It reports whether g was
// replaced (and closed).
func (m *waiter) checkProbe(g *psGroup) bool {
	m.mu.Lock()
	inUse := !m.unusedLocked(g)
	m.mu.Unlock()
	if !inUse {
		return false
	}
	ctx, cancel := context.WithTimeout(m.ctx, probeEvery)
	defer cancel()
	n, err := m.c.rdb.(*redis.Client).PubSubNumSub(ctx, m.probe).Result() // see isFailoverClient
	if err != nil || n[m.probe] > 0 {
		return false // unknown, or on the master
	}
	m.mu.Lock()
	if m.closed || g.closed {
		m.mu.Unlock()
		return false
	}
	var channels []string
	for ch, cs := range m.subs {
		if cs.group == g {
			channels = append(channels, ch)
		}
	}
	g.closed = true
	delete(m.groups, g.addr)
	ng := m.newGroup(m.c.rdb, g.addr) // subscribes the probe
	if len(channels) > 0 {
		if err := ng.ps.Subscribe(ctx, channels...); err != nil {
			// The new connection failed: its reader retries, and the
			// channels are resubscribed with it; wake the waiters.
			m.c.cfg.logger.Debug("fence: resubscribing after a master switch failed", slog.Any("err", err))
		}
	}
	for _, ch := range channels {
		cs := m.subs[ch]
		m.unconfirmed[ch]++
		cs.group, cs.isConf, cs.confirmed, cs.moved = ng, false, make(chan struct{}), true
		for _, s := range cs.queue {
			s.poke()
		}
	}
	m.mu.Unlock()
	_ = g.ps.Close()
	return true
}
