package fence_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// aclUser creates user with password "pw" and rules on every master of
// the cluster, removed at the end of the test.
func aclUser(t *testing.T, cc *redis.ClusterClient, user string, rules ...string) {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	args := append([]any{"ACL", "SETUSER", user, "reset", "on", ">pw", "~*", "&*"}, toAny(rules)...)
	require.NoError(t, cc.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
		return n.Do(ctx, args...).Err()
	}))
	t.Cleanup(func() {
		_ = cc.ForEachShard(context.Background(), func(ctx context.Context, n *redis.Client) error {
			return n.Do(ctx, "ACL", "DELUSER", user).Err()
		})
	})
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// flushScripts empties the script cache of every master, as a restart or
// a failover to a replica does.
func flushScripts(t *testing.T, cc *redis.ClusterClient) {
	t.Helper()
	require.NoError(t, cc.ForEachMaster(ctxT(t, 10*time.Second), func(ctx context.Context, n *redis.Client) error {
		return n.ScriptFlush(ctx).Err()
	}))
}

// TestClusterUserWithoutScript: a user restricted with +@all -script may
// run EVAL and EVALSHA but not SCRIPT LOAD. Its locks are renewed across
// script-cache losses (EVAL reloads the script): no renewal depends on
// SCRIPT LOAD, so no lock is lost to NOSCRIPT.
func TestClusterUserWithoutScript(t *testing.T) {
	t.Parallel()
	cl := testenv.SharedRedisCluster(t)
	admin := cl.Client()
	ctx := ctxT(t, 30*time.Second)
	aclUser(t, admin, "noscript", "+@all", "-script")
	cc := cl.NewClient(&redis.ClusterOptions{Username: "noscript", Password: "pw"})
	require.True(t, redis.IsPermissionError(cc.ScriptLoad(ctx, "return 1").Err()), "the user may not SCRIPT LOAD")

	flushScripts(t, admin)
	// Renewals every lease/3; a loaded machine cannot delay one by a lease.
	const lease = time.Second
	prefix := uniquePrefix(t)
	c := newFenceOn(t, cc, prefix, fence.WithLease(lease))
	var locks []*fence.Lock
	for _, ns := range namesPerMaster(t, cc, prefix, "ns", 1) {
		l, err := c.Acquire(ctx, ns[0])
		require.NoError(t, err)
		locks = append(locks, l)
	}
	time.Sleep(2 * lease)  // 6 renewals due
	flushScripts(t, admin) // lost again mid-hold
	time.Sleep(2 * lease)
	for _, l := range locks {
		require.NoError(t, l.Err(), "lock %s renewed without SCRIPT LOAD", l.Name())
		require.NoError(t, l.Release(ctx))
	}
	// WithReplicaSync sends its own EVALSHA: it reloads the same way.
	flushScripts(t, admin)
	l, err := c.TryAcquire(ctx, "ns-sync", fence.WithReplicaSync(1, 5*time.Second))
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
}

// TestClusterUserWithoutPublish: a user that may not (S)PUBLISH releases
// its locks (the key is deleted, Release reports success) and fence warns
// once that waiters elsewhere learn of handovers at their next heartbeat,
// naming the user and, on a cluster, +spublish and every node: Release
// does not report the refused notification as a failed release.
func TestClusterUserWithoutPublish(t *testing.T) {
	t.Parallel()
	cl := testenv.SharedRedisCluster(t)
	admin := cl.Client()
	ctx := ctxT(t, 30*time.Second)
	aclUser(t, admin, "nopub", "+@all", "-publish", "-spublish")
	cc := cl.NewClient(&redis.ClusterOptions{Username: "nopub", Password: "pw"})
	var logs syncBuffer
	prefix := uniquePrefix(t)
	c := newFenceOn(t, cc, prefix, fence.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	for _, name := range []string{"np1", "np2"} {
		l, err := c.Acquire(ctx, name)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx), "released although the notification was refused")
		n, err := admin.Exists(ctx, prefix+"{"+name+"}").Result()
		require.NoError(t, err)
		assert.Zero(t, n, "the lock key is deleted")
	}
	const warning = "may not publish lock notifications"
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), warning) }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1, strings.Count(logs.String(), warning), "warned once: %s", logs.String())
	assert.Contains(t, logs.String(), "ACL SETUSER nopub +publish +spublish", "names the user (ACL WHOAMI) and SPUBLISH")
	assert.Contains(t, logs.String(), "on every node")

	// A forced release by such a user deletes the lock too, and says the
	// waiters were not woken.
	l, err := c.Acquire(ctx, "np3")
	require.NoError(t, err)
	info, err := c.Inspect(ctx, "np3")
	require.NoError(t, err)
	woken, err := c.ForceRelease(ctx, info)
	require.NoError(t, err, "released although the notification was refused")
	assert.False(t, woken)
	n, err := admin.Exists(ctx, prefix+"{np3}").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the lock key is deleted")
	assert.ErrorIs(t, l.Release(ctx), fence.ErrNotHeld)
}

// TestClusterUserWithoutCommand: a user that may not run COMMAND (the
// ACL line of docs/operations.md does not grant it) acquires, waits, hands
// over, refreshes and releases with no COMMAND sent: fence's calls on a
// cluster take go-redis's pipeline path, which routes by slot alone,
// rather than the single-command path, which asks random nodes for the
// COMMAND table and, refused, asks again on every call (up to three
// refused round trips and a log line each time).
func TestClusterUserWithoutCommand(t *testing.T) {
	t.Parallel()
	cl := testenv.SharedRedisCluster(t)
	admin := cl.Client()
	ctx := ctxT(t, 30*time.Second)
	aclUser(t, admin, "nocommand", "+@all", "-command")
	user := func() *redis.ClusterClient {
		return cl.NewClient(&redis.ClusterOptions{Username: "nocommand", Password: "pw"})
	}
	require.True(t, redis.IsPermissionError(user().Command(ctx).Err()), "the user may not run COMMAND")
	before := refusedCommands(t, admin, "nocommand")
	require.NotZero(t, before, "ACL LOG records the refused COMMANDs")
	prefix := uniquePrefix(t)
	holder, waiter := newFenceOn(t, user(), prefix), newFenceOn(t, user(), prefix)
	for _, name := range []string{"nc1", "nc2", "nc3"} {
		l, err := holder.TryAcquire(ctx, name)
		require.NoError(t, err)
		got := acquireAsync(ctx, waiter, name)
		require.Eventually(t, func() bool {
			info, err := holder.Inspect(ctx, name)
			return err == nil && info.Waiters == 1
		}, 10*time.Second, 5*time.Millisecond)
		require.NoError(t, l.Release(ctx))
		a := <-got
		require.NoError(t, a.err)
		require.NoError(t, a.l.Release(ctx))
		f, err := holder.TryAcquire(ctx, name, fence.WithFixedLease(time.Second))
		require.NoError(t, err)
		require.NoError(t, f.Refresh(ctx, time.Second))
		require.NoError(t, f.Release(ctx))
	}
	assert.Equal(t, before, refusedCommands(t, admin, "nocommand"), "COMMANDs refused to the user (ACL LOG)")
}

// refusedCommands counts the COMMANDs refused to user on every node, by
// the nodes' ACL LOG.
func refusedCommands(t *testing.T, cc *redis.ClusterClient, user string) int64 {
	t.Helper()
	var n atomic.Int64
	require.NoError(t, cc.ForEachShard(ctxT(t, 10*time.Second), func(ctx context.Context, node *redis.Client) error {
		entries, err := node.ACLLog(ctx, 128).Result()
		for _, e := range entries {
			if e.Username == user && e.Object == "command" {
				n.Add(e.Count)
			}
		}
		return err
	}))
	return n.Load()
}

// TestClusterReadOnlyClientWarned: New warns, once, about a cluster
// client that reads from replicas (ReadOnly, or RouteRandomly, which sets
// it), whose calls all wait for go-redis's COMMAND table (see
// TestClusterStalledReplicasCostNothing), and names the fix; a client
// that reads from masters is not warned about.
func TestClusterReadOnlyClientWarned(t *testing.T) {
	t.Parallel()
	cl := testenv.SharedRedisCluster(t)
	const warning = "fence: the cluster client reads from replicas"
	for _, tc := range []struct {
		name string
		opts redis.ClusterOptions
		warn bool
	}{
		{"ReadOnly", redis.ClusterOptions{ReadOnly: true}, true},
		{"RouteRandomly", redis.ClusterOptions{RouteRandomly: true}, true},
		{"masters only", redis.ClusterOptions{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs syncBuffer
			c := newFenceOn(t, cl.NewClient(&tc.opts), uniquePrefix(t), fence.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			l, err := c.TryAcquire(ctxT(t, 10*time.Second), "ro")
			require.NoError(t, err)
			require.NoError(t, l.Release(context.Background()))
			if !tc.warn {
				assert.NotContains(t, logs.String(), warning)
				return
			}
			assert.Equal(t, 1, strings.Count(logs.String(), warning), "%s", logs.String())
			assert.Contains(t, logs.String(), `fix="give fence.New a *redis.ClusterClient of its own without ReadOnly, RouteByLatency and RouteRandomly"`)
		})
	}
}

// TestClusterEvictionPolicyWarning: New warns about a master whose
// maxmemory-policy may evict lock keys, naming it; Inspect reports the
// policy of the lock's node.
func TestClusterEvictionPolicyWarning(t *testing.T) {
	t.Parallel()
	cl := testenv.SharedRedisCluster(t)
	admin := cl.Client()
	ctx := ctxT(t, 30*time.Second)
	masters, err := cl.Masters(ctx)
	require.NoError(t, err)
	evicting := masters[1]
	ec := evicting.Client()
	require.NoError(t, ec.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
	require.NoError(t, ec.ConfigSet(ctx, "maxmemory", "1gb").Err())
	t.Cleanup(func() {
		_ = ec.ConfigSet(context.Background(), "maxmemory", "0").Err()
		_ = ec.ConfigSet(context.Background(), "maxmemory-policy", "noeviction").Err()
	})
	var logs syncBuffer
	prefix := uniquePrefix(t)
	c := newFenceOn(t, admin, prefix, fence.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "may evict lock keys") }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1, strings.Count(logs.String(), "may evict lock keys"), "one warning, for the one evicting master")
	assert.Contains(t, logs.String(), evicting.Addr)
	assert.Contains(t, logs.String(), "allkeys-lru")

	for addr, ns := range namesPerMaster(t, admin, prefix, "ev", 1) {
		info, err := c.Inspect(ctx, ns[0])
		require.NoError(t, err)
		assert.Equal(t, addr, info.Eviction.Addr)
		assert.Equal(t, addr == evicting.Addr, info.Eviction.Evicts(), "node %s: %+v", addr, info.Eviction)
	}
}

// TestEvictedLockIsLostAtNextRenewal: under allkeys-lru with a small
// maxmemory, a held lock's key is evicted; a competitor acquires at once
// with a greater token (the clock floor), and the holder's context is
// cancelled at its next renewal. This is the cost the warning is about.
func TestEvictedLockIsLostAtNextRenewal(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t, testenv.WithRedisArgs("--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"))
	ctx := ctxT(t, 30*time.Second)
	var logs syncBuffer
	const lease = 1500 * time.Millisecond
	c := newClient(t, r, nil, fence.WithLease(lease), fence.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "may evict lock keys") }, 10*time.Second, 10*time.Millisecond)
	l, err := c.Acquire(ctx, "evicted")
	require.NoError(t, err)
	evictedAt := time.Time{}
	val := strings.Repeat("x", 64<<10)
	for i := 0; i < 2000 && evictedAt.IsZero(); i++ {
		require.NoError(t, r.Client().Set(ctx, r.Prefix+"fill:"+itoa(i), val, 0).Err())
		if n, err := r.Client().Exists(ctx, lockKey(r, "evicted")).Result(); err == nil && n == 0 {
			evictedAt = time.Now()
		}
	}
	require.False(t, evictedAt.IsZero(), "the lock key was not evicted")
	other := newClient(t, r, nil)
	l2, err := other.TryAcquire(ctx, "evicted")
	require.NoError(t, err, "a competitor acquires the evicted lock at once")
	assert.Greater(t, l2.Token(), l.Token())
	select {
	case <-l.Done():
		t.Logf("holder learnt of the eviction %v later", time.Since(evictedAt))
	case <-time.After(10 * time.Second):
		// Its next renewal (due within lease/3) finds the key gone; a
		// client that renewed by recreating the key would never be told.
		t.Fatal("holder not told within 10 s of the eviction (lease 1.5 s)")
	}
	assert.ErrorIs(t, l.Err(), fence.ErrLockLost)
}

// TestEvictionWarningWithoutLogger: a Redis whose maxmemory with a
// volatile policy can evict lock keys is reported without opt-in: on
// slog.Default() when no WithLogger was given, once per client however
// many locks it takes, naming the node and a redis-cli command that fixes
// it. With WithLogger the warning goes there instead, and not to the
// default logger.
func TestEvictionWarningWithoutLogger(t *testing.T) {
	r := testenv.NewRedisServer(t, testenv.WithRedisArgs("--maxmemory", "1gb", "--maxmemory-policy", "volatile-lru"))
	ctx := ctxT(t, 30*time.Second)
	var deflogs syncBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&deflogs, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	// Other tests' clients may log to the default logger meanwhile: count
	// only this server's lines.
	warnings := func(b *syncBuffer) []string {
		var out []string
		for line := range strings.Lines(b.String()) {
			if strings.Contains(line, "may evict lock keys") && strings.Contains(line, r.Addr) {
				out = append(out, line)
			}
		}
		return out
	}

	c := newClient(t, r, nil)
	require.Eventually(t, func() bool { return len(warnings(&deflogs)) > 0 }, 10*time.Second, 10*time.Millisecond,
		"no eviction warning on slog.Default()")
	for range 3 {
		l, err := c.Acquire(ctx, "ev")
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
	}
	require.NoError(t, c.Close(ctx))
	w := warnings(&deflogs)
	require.Len(t, w, 1, "once per client")
	assert.Contains(t, w[0], "volatile-lru")
	_, port, _ := strings.Cut(r.Addr, ":")
	assert.Contains(t, w[0], "redis-cli -h 127.0.0.1 -p "+port+" CONFIG SET maxmemory-policy noeviction")

	var own syncBuffer
	c2 := newClient(t, r, nil, fence.WithLogger(slog.New(slog.NewTextHandler(&own, nil))))
	require.Eventually(t, func() bool { return len(warnings(&own)) == 1 }, 10*time.Second, 10*time.Millisecond,
		"no eviction warning on the WithLogger logger")
	require.NoError(t, c2.Close(ctx))
	assert.Len(t, warnings(&deflogs), 1, "a client with WithLogger does not warn on slog.Default()")
}

// TestPublishRefusedFix: the no-PUBLISH warning names the client's user
// (ACL WHOAMI) and redis-cli commands that grant what Redis refused, and
// they work pasted into a shell: a user without PUBLISH and without
// channels (a new user's default on Redis 7) is given the command first,
// then the channel pattern of the prefix, whose glob characters are
// escaped; after both, releases are published and nothing is warned. A
// user that may not run ACL WHOAMI gets a placeholder and how to find it.
func TestPublishRefusedFix(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 30*time.Second)
	admin := r.Client()
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "~*", "resetchannels", "+@all", "-publish").Err())
	const prefix = "app*[1]?:"
	// warning releases a lock with a new client of user and returns the
	// warning's attributes (nil: none).
	warning := func(user string) map[string]any {
		t.Helper()
		var logs syncBuffer
		rdb := r.NewClient(&redis.Options{Username: user, Password: "pw"})
		c, err := fence.New(rdb, fence.WithPrefix(prefix), fence.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
		require.NoError(t, err)
		l, err := c.Acquire(ctx, "pf")
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx), "released although the notification may be refused")
		require.NoError(t, c.Close(ctx)) // waits for the warning's ACL WHOAMI
		var found map[string]any
		for line := range strings.Lines(logs.String()) {
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(line), &m))
			if strings.Contains(m["msg"].(string), "may not publish lock notifications") {
				require.Nil(t, found, "warned once per client: %s", logs.String())
				found = m
			}
		}
		return found
	}
	shell := func(cmd string) {
		t.Helper()
		out, err := exec.CommandContext(ctx, "sh", "-c", cmd).CombinedOutput()
		require.NoError(t, err, "%s: %s", cmd, out)
		require.Equal(t, "OK", strings.TrimSpace(string(out)), "%s", cmd)
	}
	sub := admin.Subscribe(ctx, prefix+"{pf}:ch")
	defer sub.Close()
	_, err := sub.Receive(ctx)
	require.NoError(t, err)

	w := warning("app")
	require.NotNil(t, w, "no warning for a user without PUBLISH")
	fix := w["fix"].(string)
	first, then, ok := strings.Cut(fix, "; and if Redis then refuses the channel: ")
	require.True(t, ok, "the command, then the channel: %s", fix)
	assert.Equal(t, "redis-cli"+hostPort(r.Addr)+" ACL SETUSER app +publish", first, "the user's name, no +spublish on a single server")
	assert.Equal(t, "redis-cli"+hostPort(r.Addr)+` ACL SETUSER app '&app\*\[1\]\?:*'`, then)
	assert.Contains(t, w["err"], "can't run this command")
	shell(first)

	w = warning("app")
	require.NotNil(t, w, "the channel is refused next")
	assert.Contains(t, w["err"], "channel")
	assert.Equal(t, then, w["fix"], "the channel's command alone")
	shell(then)

	assert.Nil(t, warning("app"), "published once both are granted")
	msg, err := sub.ReceiveTimeout(ctx, 5*time.Second)
	require.NoError(t, err, "the release was published")
	assert.IsType(t, &redis.Message{}, msg)

	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "nowho", "on", ">pw", "~*", "&*", "+@all", "-publish", "-acl").Err())
	w = warning("nowho")
	require.NotNil(t, w)
	assert.Contains(t, w["fix"], "ACL SETUSER nowho +publish", "the user the client's options name, though it may not run ACL WHOAMI")
	assert.Empty(t, w["user"], "no placeholder to explain")
}

// hostPort is " -h HOST -p PORT" of addr, as redis-cli takes it.
func hostPort(addr string) string {
	host, port, _ := strings.Cut(addr, ":")
	return " -h " + host + " -p " + port
}
