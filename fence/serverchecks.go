package fence

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
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
// PUBLISH/SPUBLISH only speed up handovers: when it is denied, a release
// still hands the lock over (or deletes it) and reports success, and fence
// warns once that waiters in other processes learn of a handover at their
// next heartbeat instead. A user that may not SUBSCRIBE waits on its
// heartbeats alone (with a warning, once per client).
//
// Eviction: with maxmemory set and any policy but noeviction, Redis may
// evict a lock key (every fence key has an expiry, so the volatile-*
// policies pick among them too): a competitor then acquires at once and
// the holder learns it at its next renewal. The check runs once per
// client, in the background from New (see "Server configuration" in the
// package documentation for why there), and warns on the configuration
// logger; [Client.Inspect] reports the node of one lock.

// serverChecks holds a client's once-only checks of the server.
type serverChecks struct {
	publishWarned   sync.Once
	subscribeWarned sync.Once
	outageWarned    sync.Once
	done            chan struct{} // closed when the background check ended
}

// configLogger is where warnings about the server's configuration go: the
// WithLogger logger, else slog.Default() as it is when the warning is
// logged (an application that sets its default logger after New still
// gets them). These warnings are once per client, so they cannot flood a
// log, and they name a setting that can lose locks: they must reach the
// operator without opt-in.
func (c *Client) configLogger() *slog.Logger {
	if c.cfg.logSet {
		return c.cfg.logger
	}
	return slog.Default()
}

// warnPublishRefused is logged once per client when a script reports that
// its notification was refused; refused is Redis's error. The fix it
// names needs the client's user, one more round trip: that goes in the
// background, off the release's path.
func (c *Client) warnPublishRefused(name, refused string) {
	c.checks.publishWarned.Do(func() {
		if !c.goBackground(func() { c.logPublishRefused(c.bgCtx, true, name, refused) }) {
			c.logPublishRefused(context.Background(), false, name, refused) // closed: no lookup
		}
	})
}

// warnOutage is logged once per client when a waiting Acquire cannot
// reach Redis (err: the dial error, or the connection's): Acquire waits
// through an outage, as through a failover, and without this line the
// wait reads as a held lock. until says what ends that wait (waitEnd).
func (c *Client) warnOutage(name, until string, err error) {
	c.checks.outageWarned.Do(func() {
		attrs := []any{slog.String("name", name), slog.String("err", err.Error())}
		at := "the client's address"
		if addr := c.addrOf(err); addr != "" {
			attrs = append(attrs, slog.String("addr", addr))
			at = addr
		}
		attrs = append(attrs, slog.String("fix", "check that redis-server runs at "+at+" and that this host may reach it"))
		if until == "" {
			until = "its context or wait limit"
		}
		c.configLogger().Warn("fence: Redis is unreachable while Acquire waits; it keeps trying until "+until+
			" ends the wait", attrs...)
	})
}

// addrOf is the address of the node an outage error is about: the
// server of a single-server client, else the address the error names (a
// dial's or a connection's), "" when it names none. Nothing is looked up:
// the warning may be logged by the watchdog's goroutine.
func (c *Client) addrOf(err error) string {
	if addr := c.nodeAddr(); addr != "" {
		return addr
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Addr != nil {
		return oe.Addr.String()
	}
	return ""
}

// checkClusterOptions warns, once per client, about a cluster client
// that reads from replicas: go-redis then looks every call up in the
// server's COMMAND table before routing it, pipelines too (see
// Client.runScript), and loads that table once per client from random
// nodes, replicas included, bounded only by ReadTimeout, under a mutex
// every call waits on. While a node is stopped at that moment, every call
// of fence on every master waits: acquisitions, releases, renewals.
func (c *Client) checkClusterOptions() {
	cc, ok := c.rdb.(*redis.ClusterClient)
	if !ok || !cc.Options().ReadOnly {
		return
	}
	c.configLogger().Warn("fence: the cluster client reads from replicas (ReadOnly, RouteByLatency or RouteRandomly), "+
		"so go-redis loads the COMMAND table before it routes a call, from random nodes, replicas included, and every "+
		"call of the client waits for it: while a node is stopped, calls and renewals on every master wait up to "+
		"ReadTimeout",
		slog.String("fix", "give fence.New a *redis.ClusterClient of its own without ReadOnly, RouteByLatency and RouteRandomly"))
}

// whoamiTimeout bounds the ACL WHOAMI of the no-PUBLISH warning.
const whoamiTimeout = time.Second

// logPublishRefused logs the no-PUBLISH warning with the command that
// grants what Redis refused: the command itself, or the channels (a user
// made on Redis 7 gets no channel by default, acl-pubsub-default
// resetchannels). Redis checks the command before the channels, so after
// the command is granted a channel may still be refused: the warning says
// so. The user is the one the client's options name, else the one ACL
// WHOAMI names, looked up when lookup is set.
func (c *Client) logPublishRefused(ctx context.Context, lookup bool, name, refused string) {
	user, found := "<user>", false // a placeholder, not quoted
	if lg := c.login(); lg.known {
		// The client's options name the user (or the default user):
		// no ACL WHOAMI needed, which the documented ACL line leaves out.
		user, found = shellQuote(lg.user), true
	} else if lookup {
		ctx, cancel := context.WithTimeout(ctx, whoamiTimeout)
		pipe := c.rdb.Pipeline() // RedisClient has no Do
		who := pipe.Do(ctx, "ACL", "WHOAMI")
		_, _ = pipe.Exec(ctx)
		if u, err := who.Text(); err == nil && u != "" {
			user, found = shellQuote(u), true
		}
		cancel()
	}
	cli := "redis-cli" + hostPortArgs(c.nodeAddr()) + " ACL SETUSER " + user + " "
	channels := shellQuote("&" + aclGlobEscape(c.cfg.prefix) + "*")
	var fix string
	if strings.Contains(strings.ToLower(refused), "channel") {
		fix = cli + channels
	} else {
		fix = cli + "+publish"
		if c.cluster {
			fix += " +spublish"
		}
		fix += "; and if Redis then refuses the channel: " + cli + channels
	}
	if c.cluster {
		fix += " (on every node: ACL rules are per node)"
	}
	attrs := []any{slog.String("name", name), slog.String("err", refused), slog.String("fix", fix)}
	if !found {
		attrs = append(attrs, slog.String("user", "<user> is the Redis user this client connects as "+
			"(redis-cli ACL WHOAMI with its credentials names it)"))
	}
	c.configLogger().Warn("fence: the Redis user may not publish lock notifications: locks are released and "+
		"handed over, but waiters in other processes learn of a handover only at their next heartbeat", attrs...)
}

// nodeAddr is the address of a single-server client, "" otherwise.
func (c *Client) nodeAddr() string {
	if n, ok := c.rdb.(*redis.Client); ok && !isFailoverClient(n) {
		return n.Options().Addr
	}
	return ""
}

// aclGlobEscape escapes the characters an ACL channel pattern (a glob)
// treats as special, so that the pattern matches the prefix literally.
func aclGlobEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// shellQuote quotes s for a POSIX shell when it holds anything but
// letters, digits and -_.:@/ (an ACL pattern's & and *, a space).
func shellQuote(s string) string {
	plain := s != ""
	for _, r := range s {
		if !(r < 128 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.:@/", r))) {
			plain = false
			break
		}
	}
	if plain {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// startServerChecks runs the one-time configuration checks in the
// background (New has no context and must not block on the network). The
// goroutine ends within checkTimeout, or when Close cancels the client's
// background context, and Close waits for it.
func (c *Client) startServerChecks() {
	done := make(chan struct{})
	c.checks.done = done
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(c.bgCtx, checkTimeout)
		defer cancel()
		if c.view != nil {
			c.view.read(ctx, true) // the node clients made before New
		}
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

// checkEviction reads the eviction configuration of every master and
// warns once, naming every master that may evict lock keys.
func (c *Client) checkEviction(ctx context.Context) {
	var (
		mu      sync.Mutex
		evicts  []Eviction
		unknown error
	)
	check := func(ctx context.Context, node infoer) error {
		ev, err := readEviction(ctx, node)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err != nil:
			unknown = err
		case ev.Evicts():
			evicts = append(evicts, ev)
		}
		return nil
	}
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		_ = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return check(ctx, node) })
	} else if node, ok := c.rdb.(infoer); ok {
		_ = check(ctx, node)
	}
	if unknown != nil {
		// INFO denied or the server unreachable at start: nothing to say
		// to the operator yet (Inspect and fencectl doctor report it).
		c.cfg.logger.Debug("fence: cannot read maxmemory-policy (INFO memory)", slog.Any("err", unknown))
	}
	if len(evicts) == 0 {
		return
	}
	nodes := make([]string, len(evicts))
	fixes := make([]string, len(evicts))
	for i, ev := range evicts {
		nodes[i] = cmp.Or(ev.Addr, "the master") + " (" + ev.Policy + ")"
		fixes[i] = "redis-cli" + hostPortArgs(ev.Addr) + " CONFIG SET maxmemory-policy noeviction"
	}
	c.configLogger().Warn("fence: Redis may evict lock keys: a competitor could then acquire a held lock at once, "+
		"and its holder learns it only at its next renewal; set maxmemory-policy noeviction (and in redis.conf) "+
		"on every server that holds locks",
		slog.String("nodes", strings.Join(nodes, ", ")), slog.Int64("maxmemory", evicts[0].Maxmemory),
		slog.String("fix", strings.Join(fixes, "; ")))
}

// hostPortArgs is " -h HOST -p PORT" for redis-cli, or "" when addr is
// unknown.
func hostPortArgs(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	return " -h " + host + " -p " + port
}
