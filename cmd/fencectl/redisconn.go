package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/fence"
)

// silentLogger drops go-redis's internal log lines (a dead server otherwise
// prints several "redis: connection pool: ..." lines per attempt): fencectl
// reports every failure itself, in one line.
type silentLogger struct{}

func (silentLogger) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(silentLogger{}) }

// redisConn is an open connection to a standalone Redis, a Redis Cluster,
// or the master a Sentinel names.
type redisConn struct {
	rdb      redis.UniversalClient
	cluster  bool
	sentinel string // the master's name when reached through a Sentinel
	src      source // the address as given and where it came from
	display  string // the address as given, password redacted
	seed     string // host:port dialled first
	user     string // the ACL user logged in as ("default" when the address names none)
	prefix   string // the key prefix (--prefix)
	timeout  time.Duration
	version  string // redis_version, or "" when the server does not say
	role     string // master or replica (standalone), "" when unknown
}

// parseRedisAddr accepts redis://, rediss:// and unix:// URLs, or a bare
// host:port (host alone means port 6379).
func parseRedisAddr(s string) (*redis.Options, error) {
	u := s
	if !strings.Contains(u, "://") {
		u = "redis://" + u
	}
	opts, err := redis.ParseURL(u)
	if err != nil {
		return nil, usageErrorf("Redis address %s: %v; give host:port or redis://[user:password@]host:port[/db]",
			redactAddr(s), err)
	}
	return opts, nil
}

// openRedis connects to the address src and finds out whether it is a
// cluster node; on a cluster it returns a ClusterClient seeded with it,
// which follows MOVED and ASK redirections and can reach every master.
//
// The first command is HELLO, which every user may run (Redis exempts it
// from ACL checks, like AUTH): fencectl needs no PING, so it works as a
// user that has only the commands fence sends. It also tells network,
// credential and permission failures apart (see serverError).
func openRedis(ctx context.Context, src source, sentinelMaster, prefix string, timeout time.Duration) (*redisConn, error) {
	if src.addr == "" {
		return nil, usageErrorf("no Redis: give --redis host:port|URL or set REDIS_URL")
	}
	opts, err := parseRedisAddr(src.addr)
	if err != nil {
		return nil, err
	}
	// One attempt per command: an operator wants the failure now, not after
	// three backed-off retries.
	opts.MaxRetries = -1
	opts.DialTimeout = timeout
	opts.ContextTimeoutEnabled = true
	opts.PoolSize = 4
	c := &redisConn{src: src, display: src.display(), seed: opts.Addr, user: orDefault(opts.Username, "default"),
		prefix: prefix, timeout: timeout}
	probe := redis.NewClient(opts)
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var mode string
	c.version, c.role, mode, err = serverInfo(pctx, probe)
	if err != nil {
		_ = probe.Close()
		return nil, c.failure("Redis", err)
	}
	c.cluster = mode == "cluster"
	if mode == "sentinel" {
		defer probe.Close()
		return c.openSentinel(pctx, probe, opts, sentinelMaster)
	}
	if sentinelMaster != "" {
		_ = probe.Close()
		return nil, usageErrorf("--sentinel-master %q: %s is not a Sentinel", sentinelMaster, c.display)
	}
	if !c.cluster {
		c.rdb = probe
		return c, nil
	}
	_ = probe.Close()
	return c.openCluster(pctx, opts)
}

// openSentinel finishes openRedis for a Sentinel (probe): it connects to
// the master named sentinelMaster, or to the Sentinel's one master.
func (c *redisConn) openSentinel(ctx context.Context, probe *redis.Client, opts *redis.Options, sentinelMaster string) (*redisConn, error) {
	name, err := sentinelMasterName(ctx, probe, sentinelMaster, c.display)
	if err != nil {
		return nil, c.explain(err)
	}
	// The address's user and password serve for the sentinel (they just
	// worked) and for the data nodes.
	c.sentinel = name
	c.rdb = redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            name,
		SentinelAddrs:         []string{opts.Addr},
		SentinelUsername:      opts.Username,
		SentinelPassword:      opts.Password,
		Username:              opts.Username,
		Password:              opts.Password,
		DB:                    opts.DB,
		TLSConfig:             opts.TLSConfig,
		DialTimeout:           opts.DialTimeout,
		ReadTimeout:           opts.ReadTimeout,
		WriteTimeout:          opts.WriteTimeout,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		PoolSize:              4,
	})
	if c.version, c.role, _, err = serverInfo(ctx, c.rdb.(*redis.Client)); err != nil {
		_ = c.rdb.Close()
		return nil, c.failure(fmt.Sprintf("the master %q of the Sentinel", name), err)
	}
	return c, nil
}

// openCluster finishes openRedis for a cluster node: a ClusterClient
// seeded with it, its slot map loaded.
func (c *redisConn) openCluster(ctx context.Context, opts *redis.Options) (*redisConn, error) {
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 []string{opts.Addr},
		Username:              opts.Username,
		Password:              opts.Password,
		TLSConfig:             opts.TLSConfig,
		Dialer:                opts.Dialer,
		DialTimeout:           opts.DialTimeout,
		ReadTimeout:           opts.ReadTimeout,
		WriteTimeout:          opts.WriteTimeout,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		PoolSize:              4,
	})
	c.rdb = cc
	// Loading the slot map (CLUSTER SLOTS) is the cluster client's first
	// command: what it needs is what every later command needs.
	if _, err := cc.MasterForKey(ctx, lockKey(c.prefix, "fencectl")); err != nil {
		_ = cc.Close()
		return nil, c.failure("Redis Cluster", err)
	}
	return c, nil
}

// failure is err, from reaching the server, with its cause named: the
// network, the credentials, a permission (with the ACL line that fixes
// it) or the timeout.
func (c *redisConn) failure(server string, err error) error {
	if e := redisFailure(server, c.src, c.user, c.prefix, c.timeout, err); e != nil {
		return e
	}
	return fmt.Errorf("%s at %s: %w", server, c.display, err)
}

// explain names the cause of err, from a command on the open connection,
// when it is one fencectl can tell (see serverError); else err as it is.
func (c *redisConn) explain(err error) error {
	if err == nil {
		return nil
	}
	var se *serverError
	var ue *usageError
	if errors.As(err, &se) || errors.As(err, &ue) {
		return err
	}
	what := "Redis"
	if c.cluster {
		what = "Redis Cluster"
	}
	if e := redisFailure(what, c.src, c.user, c.prefix, c.timeout, err); e != nil {
		return e
	}
	return err
}

// serverInfo asks HELLO (Redis 6+, allowed to every user) for the version,
// role and mode (standalone, cluster, sentinel); PING and INFO are the
// fallback for older servers. The error is HELLO's (or PING's): the
// server is not reachable, or refused the login.
func serverInfo(ctx context.Context, c *redis.Client) (version, role, mode string, err error) {
	m, err := c.Do(ctx, "HELLO").Result()
	if err == nil {
		get := func(k string) string {
			s, _ := replyField(m, k).(string)
			return s
		}
		return get("version"), get("role"), get("mode"), nil
	}
	if !isUnknownCommand(err) {
		return "", "", "", err
	}
	// Redis before 6: no HELLO, and no ACLs either.
	if err := c.Ping(ctx).Err(); err != nil {
		return "", "", "", err
	}
	info, err := c.Info(ctx).Result()
	if err != nil {
		return "", "", "", nil
	}
	f := infoFields(info)
	role = f["role"]
	if role == "slave" {
		role = "replica"
	}
	mode = f["redis_mode"]
	if f["cluster_enabled"] == "1" {
		mode = "cluster"
	}
	return f["redis_version"], role, mode, nil
}

// replyField is the value of key k in a map reply (HELLO, ACL GETUSER):
// a map in RESP3, a flat key/value list in RESP2; nil when absent.
func replyField(reply any, k string) any {
	switch m := reply.(type) {
	case map[any]any:
		return m[k]
	case []any:
		for i := 0; i+1 < len(m); i += 2 {
			if m[i] == k {
				return m[i+1]
			}
		}
	}
	return nil
}

// sentinelMasterName picks the master to use from a Sentinel: the one
// named, or the only one it monitors.
func sentinelMasterName(ctx context.Context, c *redis.Client, want, display string) (string, error) {
	res, err := c.Do(ctx, "SENTINEL", "MASTERS").Slice()
	if err != nil {
		return "", fmt.Errorf("%s is a Sentinel, and SENTINEL MASTERS failed: %w", display, err)
	}
	var names []string
	for _, m := range res {
		switch mm := m.(type) {
		case map[any]any:
			if n, ok := mm["name"].(string); ok {
				names = append(names, n)
			}
		case []any:
			for i := 0; i+1 < len(mm); i += 2 {
				if mm[i] == "name" {
					if n, ok := mm[i+1].(string); ok {
						names = append(names, n)
					}
				}
			}
		}
	}
	switch {
	case want != "":
		for _, n := range names {
			if n == want {
				return n, nil
			}
		}
		return "", usageErrorf("--sentinel-master %q: the Sentinel at %s monitors %s", want, display, strings.Join(quoteAll(names), ", "))
	case len(names) == 1:
		return names[0], nil
	case len(names) == 0:
		return "", fmt.Errorf("the Sentinel at %s monitors no master", display)
	default:
		return "", usageErrorf("the Sentinel at %s monitors several masters (%s): choose one with --sentinel-master", display, strings.Join(quoteAll(names), ", "))
	}
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

// infoFields parses INFO output into key -> value.
func infoFields(info string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.HasPrefix(k, "#") {
			out[k] = v
		}
	}
	return out
}

func (c *redisConn) mode() string {
	switch {
	case c.cluster:
		return "cluster"
	case c.sentinel != "":
		return fmt.Sprintf("master %q of a Sentinel", c.sentinel)
	}
	return "standalone"
}

// locks returns a fence client on the connection (its watchdog is idle:
// fencectl never holds a lock).
func (c *redisConn) locks() (*fence.Client, error) {
	// fencectl reports what it finds itself (doctor checks the eviction
	// policy): the client's own warnings would only repeat it on stderr.
	return fence.New(c.rdb, fence.WithPrefix(c.prefix), fence.WithLogger(slog.New(slog.DiscardHandler)))
}

// nodeAddr is a node's address for reports: a node that does not know its
// own IP (a one-node cluster announces ":port") gets the seed's host.
func (c *redisConn) nodeAddr(n *redis.Client) string {
	addr := n.Options().Addr
	if strings.HasPrefix(addr, ":") {
		if host, _, ok := strings.Cut(c.seed, ":"); ok {
			addr = host + addr
		}
	}
	return addr
}

func (c *redisConn) Close() error { return c.rdb.Close() }

// lockKey mirrors fence's key layout (see DESIGN.md: one hash tag per
// name, so a lock's keys share a slot), for doctor's probes and the
// tokens' node clocks; releasing goes through fence (Client.ForceRelease).
func lockKey(prefix, name string) string { return prefix + "{" + name + "}" }

// nodeClock returns the server time, in µs, of the node that owns key,
// read once per node and kept in clocks: a clock read earlier is a lower
// bound of the one the next acquisition reads, so comparing a mark with it
// is conservative, and thousands of resources cost one TIME per node.
func (c *redisConn) nodeClock(ctx context.Context, key string, clocks map[string]int64) (int64, string, error) {
	var cmd redis.Cmdable = c.rdb
	node := ""
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return 0, "", err
		}
		cmd, node = m, c.nodeAddr(m)
	}
	if t, ok := clocks[node]; ok {
		return t, node, nil
	}
	t, err := cmd.Time(ctx).Result()
	if err != nil {
		return 0, node, err
	}
	clocks[node] = t.UnixMicro()
	return clocks[node], node, nil
}
