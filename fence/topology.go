package fence

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Redis Cluster client routes by a slot map it refreshes only every
// ClusterStateReloadInterval (60 s by default) and on MOVED replies: after
// a master dies, commands for its slots go to the dead address until the
// next refresh, a minute of "connection refused" although the replica took
// over within seconds. fence asks for a refresh on every error that says
// the map may be stale, so that acquisitions, renewals and subscriptions
// reach the promoted master as soon as the cluster has promoted it.
//
// A failover client (redis.NewFailoverClient) needs nothing of the kind:
// it asks Sentinel for the master's address on every new connection, and
// drops a connection that answered READONLY or broke.

// refreshTopology makes the cluster client reload its slot map when err
// says it may be stale. Reloads run in the background, one at a time and
// at most one every refreshEvery (clusterView.refresh), so callers need
// not limit how often they ask.
func (c *Client) refreshTopology(err error) {
	if c.view != nil && staleTopology(err) {
		c.view.refresh()
	}
}

// staleTopology reports errors after which the client's idea of which node
// serves a key may be wrong: the node is unreachable (refused, reset,
// timed out, closed), or it answered that it no longer serves the slot
// (MOVED), is a replica now (READONLY), is loading its data after a
// restart (LOADING), or that the cluster cannot serve it (CLUSTERDOWN,
// MASTERDOWN, TRYAGAIN).
func staleTopology(err error) bool {
	if err == nil {
		return false
	}
	if _, moved := redis.IsMovedError(err); moved {
		return true
	}
	var unmapped *unmappedSlotError
	if errors.As(err, &unmapped) {
		return true
	}
	if redis.IsReadOnlyError(err) || redis.IsLoadingError(err) || redis.IsClusterDownError(err) ||
		redis.IsMasterDownError(err) || redis.IsTryAgainError(err) {
		return true
	}
	return connectionError(err)
}

// connectionError reports a failure to reach a node, as opposed to an
// answer from it.
func connectionError(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		// The caller's context ended (its error satisfies net.Error):
		// nothing is known of the node.
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// dialCause names why the node of name cannot be reached, when an
// acquisition ended with its context and go-redis's retries hid the cause
// (a retry's backoff returns the context's error, not the dial error
// before it): one dial with the client's own dialer, bounded by
// dialCauseTimeout. It returns nil when the dial works (the cause was not
// the connection) or the client's dialer is not known (a wrapper).
func (c *Client) dialCause(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), dialCauseTimeout)
	defer cancel()
	var opt *redis.Options
	switch rdb := c.rdb.(type) {
	case *redis.ClusterClient:
		n, err := rdb.MasterForKey(ctx, keysFor(c.cfg.prefix, name).lock)
		if err != nil {
			return err
		}
		opt = n.Options()
	case *redis.Client:
		opt = rdb.Options()
	}
	if opt == nil || opt.Dialer == nil {
		return nil
	}
	conn, err := opt.Dialer(ctx, opt.Network, opt.Addr)
	if err != nil {
		return err
	}
	_ = conn.Close()
	return nil
}

// dialCauseTimeout bounds dialCause: the wait it explains has ended.
const dialCauseTimeout = 100 * time.Millisecond

// transient reports errors worth retrying while a wait lasts: the node is
// unreachable or between roles (failover, restart, slot move). Other
// errors (a script error, a denied command) fail the call at once.
func transient(err error) bool {
	return staleTopology(err) || redis.IsMaxClientsError(err)
}

// byNode splits a round's renewals and heartbeats by the master that
// serves their keys, so that each node's go out, and come back, on their
// own. Without a cluster it is one group.
func (c *Client) byNode(b batch) []batch {
	cc, ok := c.rdb.(*redis.ClusterClient)
	if !ok || b.size() == 0 {
		return []batch{b}
	}
	// The slot map is in memory once a lock was acquired; the bound only
	// matters if it was never loaded.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	index := map[*redis.Client]int{}
	var groups []batch
	group := func(key string) *batch {
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			node = nil // one group for the unroutable: its round reports the error
		}
		i, ok := index[node]
		if !ok {
			i = len(groups)
			index[node] = i
			groups = append(groups, batch{})
		}
		return &groups[i]
	}
	for _, l := range b.locks {
		g := group(l.keys.lock)
		g.locks = append(g.locks, l)
	}
	for _, x := range b.waiters {
		g := group(x.k.lock)
		g.waiters = append(g.waiters, x)
	}
	return groups
}
