package fence

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// What fence needs of the server, and how it copes with less.
//
// ACL: fence runs its scripts with EVALSHA, and after a script-cache miss
// (a restart, a failover) with EVAL, which caches the script again. It
// never needs SCRIPT LOAD, so a user restricted with +@all -script works.
// PUBLISH/SPUBLISH only wake waiters: when it is denied, a release still
// deletes the key and reports success, and fence warns once that waiters
// in other processes wake at the lock's expiry instead. A user that may
// not SUBSCRIBE waits on expiry alone (with a warning from the waiter).
//
// Eviction: with maxmemory set and any policy but noeviction, Redis may
// evict a lock key (every fence key has an expiry, so the volatile-*
// policies pick among them too): a competitor then acquires at once and
// the holder learns it at its next renewal. New checks the policy of every
// master once, in the background, and warns; [Client.Inspect] reports it.

// Release outcomes returned by release.lua.
const (
	releaseNotOurs     = 0
	releaseOK          = 1
	releaseUnpublished = 2 // deleted; the release message was refused
)

// serverChecks holds a client's once-only checks of the server.
type serverChecks struct {
	publishWarned sync.Once
	done          chan struct{} // closed when the background check ended
}

// releaseOutcome turns release.lua's reply for l into Release's error.
// When no message was published, this client's head waiter is woken
// locally: it may be waiting for this lock's release message alone.
func (c *Client) releaseOutcome(l *Lock, n int64) error {
	switch n {
	case releaseOK:
		return nil
	case releaseUnpublished:
		c.waiter.wakeChannel(l.keys.channel)
		c.checks.publishWarned.Do(func() {
			c.cfg.logger.Warn("fence: the Redis user may not PUBLISH/SPUBLISH: locks are released, "+
				"but waiters in other processes wake only at the lock's expiry; grant +publish and +spublish",
				slog.String("name", l.name))
		})
		return nil
	default:
		c.waiter.wakeChannel(l.keys.channel)
		return notHeld(l.name)
	}
}

// startServerChecks runs the one-time configuration checks in the
// background (New has no context and must not block on the network). The
// goroutine ends within checkTimeout, or when Close cancels the waiter's
// context, and Close waits for it.
func (c *Client) startServerChecks() {
	done := make(chan struct{})
	c.checks.done = done
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(c.waiter.ctx, checkTimeout)
		defer cancel()
		c.checkEviction(ctx)
	}()
}

// waitServerChecks waits for the background checks (Close).
func (c *Client) waitServerChecks() {
	if c.checks.done != nil {
		<-c.checks.done
	}
}

// checkTimeout bounds the background configuration check.
const checkTimeout = 5 * time.Second

// checkEviction warns for every master whose maxmemory-policy may evict
// lock keys.
func (c *Client) checkEviction(ctx context.Context) {
	check := func(ctx context.Context, node infoer) error {
		ev, err := readEviction(ctx, node)
		if err != nil {
			c.cfg.logger.Debug("fence: cannot read maxmemory-policy (INFO memory)", slog.Any("err", err))
			return nil
		}
		if ev.Evicts() {
			c.cfg.logger.Warn("fence: Redis may evict lock keys: a competitor could then acquire a held lock at once, "+
				"and its holder learns it only at the next renewal; set maxmemory-policy noeviction on the servers that hold locks",
				slog.String("node", ev.Addr), slog.String("maxmemory-policy", ev.Policy), slog.Int64("maxmemory", ev.Maxmemory))
		}
		return nil
	}
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		_ = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return check(ctx, node) })
		return
	}
	if node, ok := c.rdb.(infoer); ok {
		_ = check(ctx, node)
	}
}

// infoer is a client that can run INFO (every go-redis client; a
// [RedisClient] wrapper may not).
type infoer interface {
	Info(ctx context.Context, section ...string) *redis.StringCmd
}

// Eviction is a server's eviction configuration, as [Client.Inspect]
// reports it for the node that holds a lock.
type Eviction struct {
	Addr      string // the node, when known
	Policy    string // maxmemory-policy
	Maxmemory int64  // bytes; 0 means no limit, nothing is evicted
}

// Evicts reports whether the server may evict lock keys: a memory limit
// is set and the policy is not noeviction. fence's keys all have an
// expiry, so volatile-* policies may evict them as well as allkeys-*.
func (e Eviction) Evicts() bool {
	return e.Maxmemory > 0 && e.Policy != "" && e.Policy != "noeviction"
}

// readEviction reads maxmemory and maxmemory-policy with INFO memory,
// which managed services allow more often than CONFIG GET.
func readEviction(ctx context.Context, node infoer) (Eviction, error) {
	s, err := node.Info(ctx, "memory").Result()
	if err != nil {
		return Eviction{}, err
	}
	var ev Eviction
	if n, ok := node.(*redis.Client); ok {
		ev.Addr = n.Options().Addr
	}
	for line := range strings.Lines(s) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "maxmemory_policy":
			ev.Policy = v
		case "maxmemory":
			ev.Maxmemory, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return ev, nil
}

// evictionFor reads the eviction configuration of the node that holds key.
func (c *Client) evictionFor(ctx context.Context, key string) (Eviction, error) {
	node, _ := c.rdb.(infoer)
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		n, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return Eviction{}, err
		}
		node = n
	}
	if node == nil {
		return Eviction{}, errors.New("fence: the Redis client cannot run INFO")
	}
	return readEviction(ctx, node)
}
