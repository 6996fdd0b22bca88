package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

func (e *env) startServers(ctx context.Context, pinned bool, pl *placement) error {
	r, err := testenv.StartRedis()
	if err != nil {
		return err
	}
	e.redis = r
	if pinned && r.PID() != 0 {
		if _, err := pinGroup(r.PID(), 0); err != nil {
			return fmt.Errorf("pin redis: %w", err)
		}
	}
	if r.PID() != 0 {
		pl.RedisCPUs = affinityOf(r.PID())
	}
	e.ping = newRedisClient(r.Addr, nil)
	if info, err := e.ping.Info(ctx, "server").Result(); err == nil {
		pl.RedisVersion = infoField(info, "redis_version")
	}
	if e.cfg.Etcd && (e.cfg.wants("handoff2") || e.cfg.wants("fair") || e.cfg.wants("election")) {
		if err := e.startEtcd(ctx, pinned, pl); err != nil {
			return err
		}
	}

	if !e.cfg.wants("guard") && !e.cfg.wants("sqlfence") && !e.cfg.wants("sync") && !e.cfg.wants("outbox") && !e.cfg.wants("tick") {
		return nil
	}
	pg, err := testenv.StartPostgres()
	if err != nil {
		return err
	}
	e.pg = pg
	if pinned && pg.PID() != 0 {
		// Pin the postmaster and the auxiliary processes it has forked
		// before any client connects: backends forked later inherit.
		if _, err := pinGroup(pg.PID(), 0); err != nil {
			return fmt.Errorf("pin postgres: %w", err)
		}
	}
	if pg.PID() != 0 {
		pl.PostgresCPUs = affinityOf(pg.PID())
	}
	c, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err == nil {
		_ = c.QueryRow(ctx, "SHOW server_version").Scan(&pl.PostgresVer)
		_ = c.Close(ctx)
	}
	return nil
}

// startEtcd starts the etcd server of the etcd peer, pinned with the
// other servers.
func (e *env) startEtcd(ctx context.Context, pinned bool, pl *placement) error {
	s, err := startEtcd(ctx)
	if err != nil {
		return fmt.Errorf("the etcd peer: %w", err)
	}
	e.etcd = s
	if pinned {
		if _, err := pinGroup(s.PID(), 0); err != nil {
			return fmt.Errorf("pin etcd: %w", err)
		}
	}
	pl.EtcdCPUs = affinityOf(s.PID())
	pl.EtcdVersion = s.Version
	pl.EtcdDataDir = s.DataDir
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	e.etcdc = c
	return nil
}

func infoField(info, name string) string {
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), name+":"); ok {
			return v
		}
	}
	return ""
}

// commandStats reads INFO commandstats: calls per command.
func commandStats(ctx context.Context, c *redis.Client) (map[string]int64, error) {
	st, err := commandTimes(ctx, c)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(st))
	for k, v := range st {
		out[k] = v.calls
	}
	return out, nil
}

// cmdStat is one command's line of INFO commandstats. A script's usec
// includes the commands it calls, which are counted on their own lines too.
type cmdStat struct{ calls, usec int64 }

func commandTimes(ctx context.Context, c *redis.Client) (map[string]cmdStat, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := map[string]cmdStat{}
	for _, l := range strings.Split(info, "\n") {
		l = strings.TrimSpace(l)
		rest, ok := strings.CutPrefix(l, "cmdstat_")
		if !ok {
			continue
		}
		name, fields, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		var st cmdStat
		for _, f := range strings.Split(fields, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				st.calls, _ = strconv.ParseInt(v, 10, 64)
			} else if v, ok := strings.CutPrefix(f, "usec="); ok {
				st.usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		out[name] = st
	}
	return out, nil
}

// scriptSplit divides the commandstats delta of a run whose library sends
// only scripts (EVALSHA, EVAL) into the scripts' time and the time of the
// commands they call, in µs, and counts the commands the server ran.
func scriptSplit(before, after map[string]cmdStat) (scriptUs, innerUs float64, cmds int64) {
	for k, a := range after {
		if k == "info" || strings.HasPrefix(k, "config") || strings.Contains(k, "subscribe") {
			continue
		}
		b := before[k]
		d := float64(a.usec - b.usec)
		switch {
		case strings.HasPrefix(k, "eval") || strings.HasPrefix(k, "fcall"):
			scriptUs += d
		default:
			innerUs += d
			cmds += a.calls - b.calls
		}
	}
	return scriptUs, innerUs, cmds
}

// serverCmds is the difference of two commandstats readings: every command
// the server executed (those run inside Lua scripts included), less the
// harness' own INFO calls.
type serverCmds struct {
	Total  int64            `json:"total"`
	PubSub int64            `json:"pubsub"` // (un)subscribe commands: client-issued, not from scripts
	By     map[string]int64 `json:"by_command"`
}

func diffStats(before, after map[string]int64) serverCmds {
	d := serverCmds{By: map[string]int64{}}
	for k, v := range after {
		n := v - before[k]
		if n == 0 || k == "info" || strings.HasPrefix(k, "config") {
			continue
		}
		d.By[k] = n
		d.Total += n
		if strings.Contains(k, "subscribe") {
			d.PubSub += n
		}
	}
	return d
}

func (e *env) startLibs() error {
	f, err := newFenceLocker(e.redis.Addr)
	if err != nil {
		return fmt.Errorf("fence.New: %w", err)
	}
	e.fence = f
	e.libs = []locker{f, newRedsyncLocker(e.redis.Addr), newRedislockLocker(e.redis.Addr, redislockBackoff, "redislock")}
	e.fastPoll = newRedislockLocker(e.redis.Addr, fastPollBackoff, fastPollName)
	return nil
}

// waitLibs are the libraries of the scenarios where waiting matters: the
// three under test plus redislock polling every millisecond, which is not
// its documented setting and never counts as "the best peer" in a goal; it
// shows what polling faster buys and costs.
func (e *env) waitLibs() []locker {
	if e.fastPoll == nil {
		return e.libs
	}
	return append(append([]locker(nil), e.libs...), e.fastPoll)
}

func librarySettings() map[string]string {
	return map[string]string{
		"fence":          "fence.New(rdb) defaults: watchdog mode (lease 9 s, renewed every lease/3), token issued on every acquisition, event-driven waiting (pub/sub)",
		"redsync":        "github.com/go-redsync/redsync/v4, one pool (goredis v9), NewMutex defaults: expiry 8 s, 32 tries, retry delay random 50–250 ms",
		"redislock":      fmt.Sprintf("github.com/bsm/redislock, Obtain with TTL %v and RetryStrategy LinearBackoff(%v) (its documented example; no retry by default)", peerTTL, redislockBackoff),
		fastPollName:     fmt.Sprintf("informational only, in handoff and contended: redislock with LinearBackoff(%v), not its documented setting; never used as the best peer in a goal", fastPollBackoff),
		etcdName:         "etcd's concurrency.Mutex (go.etcd.io/etcd/client/v3), one client per process, one session (default TTL 60 s) per goroutine, a NewMutex per acquisition, on a single-member etcd server the bench starts (data directory on tmpfs where there is one: the bench's Redis persists nothing and its Postgres runs with fsync off): a peer in handoff2 and fair only",
		electionName:     fmt.Sprintf("fence's Election (Client.Election(name), Campaign with a %d-byte value, Release to resign) at its defaults: term lease %v (fence.DefaultTermLease), renewed every lease/3; candidates in the lock's queue; in election, leaderkill and observe", len(campaignValue), fence.DefaultTermLease),
		etcdElectionName: "etcd's concurrency.Election (go.etcd.io/etcd/client/v3), one client per process, one session (default TTL 60 s) per candidate, Campaign and Resign, on the bench's etcd server: a peer in election only",
		"go-redis":       fmt.Sprintf("each library has its own go-redis v9 client, PoolSize %d (default would be 10 with GOMAXPROCS=1)", poolSize),
	}
}

func (e *env) close() {
	for _, l := range e.libs {
		l.Close()
	}
	if e.fastPoll != nil {
		e.fastPoll.Close()
	}
	if e.ping != nil {
		_ = e.ping.Close()
	}
	if e.etcdc != nil {
		_ = e.etcdc.Close()
	}
	e.etcd.Stop()
	if e.redis != nil {
		_ = e.redis.Stop()
	}
	if e.pg != nil {
		_ = e.pg.Stop()
	}
}

func startCPUProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }, nil
}

// rotated returns libs rotated by rep, so no library always runs first (or
// last) within a repetition.
func rotated(libs []locker, rep int) []locker {
	n := len(libs)
	out := make([]locker, n)
	for i := range libs {
		out[i] = libs[(i+rep)%n]
	}
	return out
}

// settle gives the servers a moment between measured blocks.
func settle() { time.Sleep(20 * time.Millisecond) }

// serverCPU is the Redis server's CPU time (user+sys) in seconds, from INFO
// cpu: the cost of a library on the server, networking included.
func serverCPU(ctx context.Context, c *redis.Client) (float64, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	u, _ := strconv.ParseFloat(infoField(info, "used_cpu_user"), 64)
	sy, _ := strconv.ParseFloat(infoField(info, "used_cpu_sys"), 64)
	return u + sy, nil
}
