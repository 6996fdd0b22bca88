package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelOption configures a Sentinel set started by testenv.
type SentinelOption interface {
	apply(*sentinelConfig) error
}

type sentinelConfig struct {
	downAfter       time.Duration
	failoverTimeout time.Duration
	args            []string
}

// WithDownAfter sets the sentinels' down-after-milliseconds (default 2 s):
// how long the master may not answer before the sentinels fail it over.
// Production default is 30 s. Below 2 s a sentinel may find the master it
// just switched to "down" before its link to it is up (it reconnects once a
// second) and fail over again.
func WithDownAfter(d time.Duration) SentinelOption {
	return optionFunc[sentinelConfig](func(c *sentinelConfig) error { c.downAfter = d; return nil })
}

// WithSentinelDataArgs passes extra redis-server arguments to the master
// and the replica.
func WithSentinelDataArgs(args ...string) SentinelOption {
	return optionFunc[sentinelConfig](func(c *sentinelConfig) error { c.args = append(c.args, args...); return nil })
}

// SentinelMasterName is the name the sentinels monitor the master under.
const SentinelMasterName = "fencelock"

// Sentinel is a Sentinel-managed Redis: a master, a replica and three
// sentinels (quorum 2), every one a real redis-server on 127.0.0.1.
type Sentinel struct {
	// MasterName is the monitored master's name (SentinelMasterName).
	MasterName string
	// Data are the master and the replica, in that order at start; roles
	// change with failovers: ask [Sentinel.Master].
	Data []*Redis
	// Sentinels are the three sentinel processes.
	Sentinels []*Redis

	cfg sentinelConfig

	mu      sync.Mutex
	clients []*redis.Client
	client  *redis.Client
}

// StartSentinel starts a master, its replica and three sentinels, and
// returns once the replica is in sync and every sentinel knows the master,
// the replica and the other two sentinels. The caller must call Stop.
func StartSentinel(ctx context.Context, opts ...SentinelOption) (*Sentinel, error) {
	cfg := sentinelConfig{downAfter: 2 * time.Second}
	if err := applyOptions(&cfg, opts); err != nil {
		return nil, err
	}
	if cfg.downAfter < 100*time.Millisecond {
		return nil, fmt.Errorf("testenv: sentinel down-after %v: want at least 100ms", cfg.downAfter)
	}
	// The time a sentinel gives a failover before another may try.
	cfg.failoverTimeout = 3 * cfg.downAfter
	s := &Sentinel{MasterName: SentinelMasterName, cfg: cfg}
	if err := s.start(ctx); err != nil {
		_ = s.Stop()
		return nil, err
	}
	return s, nil
}

// NewSentinel starts a private Sentinel set for the test, stopped at the
// end of the test. One that cannot be started fails the test with the
// reason.
func NewSentinel(t testing.TB, opts ...SentinelOption) *Sentinel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := StartSentinel(ctx, opts...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	return s
}

func (s *Sentinel) start(ctx context.Context) error {
	dataArgs := append([]string{"--repl-diskless-sync-delay", "0"}, s.cfg.args...)
	master, err := startRedis(redisConfig{args: dataArgs, dirPrefix: "fencelock-sentinel-data-"}, nil)
	if err != nil {
		return err
	}
	s.Data = append(s.Data, master)
	replicaArgs := append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(master.port)}, dataArgs...)
	replica, err := startRedis(redisConfig{args: replicaArgs, dirPrefix: "fencelock-sentinel-data-"}, nil)
	if err != nil {
		return err
	}
	s.Data = append(s.Data, replica)
	if err := poll(ctx, "the replica to sync", func() (bool, string) {
		return replica.replicaSynced(ctx), ""
	}); err != nil {
		return err
	}

	// Each sentinel's config names the others and the replica up front
	// (known-sentinel, known-replica), so none has to discover them through
	// hello messages and INFO, which take seconds.
	ports := make([]int, 3)
	ids := make([]string, 3)
	for i := range ports {
		if ports[i], err = reservePort(); err != nil {
			return err
		}
		ids[i] = randHex(20)
	}
	for i := range ports {
		i := i
		prepare := func(r *Redis) error {
			if r.port != ports[i] { // a retry on a new port: tell no one
				ports[i] = r.port
			}
			return os.WriteFile(filepath.Join(r.dir, "sentinel.conf"), []byte(s.sentinelConf(master, replica, ports, ids, i)), 0o644)
		}
		sr, err := startSentinelAt(ports[i], prepare)
		if err != nil {
			return err
		}
		s.Sentinels = append(s.Sentinels, sr)
	}
	return s.WaitHealthy(ctx)
}

// startSentinelAt starts a sentinel, on port first if it is still free.
func startSentinelAt(port int, prepare func(*Redis) error) (*Redis, error) {
	first := true
	return startRedis(redisConfig{conf: "sentinel.conf", sentinel: true, dirPrefix: "fencelock-sentinel-"}, func(r *Redis) error {
		if first {
			first = false
			r.port = port
			r.Addr = "127.0.0.1:" + strconv.Itoa(port)
			r.URL = "redis://" + r.Addr
		}
		return prepare(r)
	})
}

func (s *Sentinel) sentinelConf(master, replica *Redis, ports []int, ids []string, me int) string {
	var b strings.Builder
	name := s.MasterName
	fmt.Fprintf(&b, "sentinel myid %s\n", ids[me])
	fmt.Fprintf(&b, "sentinel monitor %s 127.0.0.1 %d 2\n", name, master.port)
	fmt.Fprintf(&b, "sentinel down-after-milliseconds %s %d\n", name, s.cfg.downAfter.Milliseconds())
	fmt.Fprintf(&b, "sentinel failover-timeout %s %d\n", name, s.cfg.failoverTimeout.Milliseconds())
	fmt.Fprintf(&b, "sentinel parallel-syncs %s 1\n", name)
	fmt.Fprintf(&b, "sentinel known-replica %s 127.0.0.1 %d\n", name, replica.port)
	for i := range ports {
		if i != me {
			fmt.Fprintf(&b, "sentinel known-sentinel %s 127.0.0.1 %d %s\n", name, ports[i], ids[i])
		}
	}
	return b.String()
}

// SentinelAddrs returns the sentinels' addresses.
func (s *Sentinel) SentinelAddrs() []string {
	addrs := make([]string, len(s.Sentinels))
	for i, r := range s.Sentinels {
		addrs[i] = r.Addr
	}
	return addrs
}

// Client returns a shared, ready failover client (redis.NewFailoverClient:
// it asks the sentinels for the master and follows failovers) with go-redis
// defaults; Stop closes it.
func (s *Sentinel) Client() *redis.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client == nil {
		s.client = s.newClientLocked(nil)
	}
	return s.client
}

// NewClient returns a new failover client, closed by Stop. opts may be nil;
// its MasterName and SentinelAddrs are overwritten.
func (s *Sentinel) NewClient(opts *redis.FailoverOptions) *redis.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.newClientLocked(opts)
}

func (s *Sentinel) newClientLocked(opts *redis.FailoverOptions) *redis.Client {
	if opts == nil {
		opts = &redis.FailoverOptions{}
	}
	o := *opts
	o.MasterName = s.MasterName
	o.SentinelAddrs = s.SentinelAddrs()
	c := redis.NewFailoverClient(&o)
	s.clients = append(s.clients, c)
	return c
}

// Stop closes the clients handed out and stops every process. It is safe to
// call more than once.
func (s *Sentinel) Stop() error {
	s.mu.Lock()
	cs := s.clients
	s.clients, s.client = nil, nil
	s.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
	}
	var wg sync.WaitGroup
	for _, r := range append(append([]*Redis(nil), s.Sentinels...), s.Data...) {
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Stop() }()
	}
	wg.Wait()
	return nil
}

// PIDs returns the process IDs of the running data nodes and sentinels.
func (s *Sentinel) PIDs() []int {
	var pids []int
	for _, r := range append(append([]*Redis(nil), s.Data...), s.Sentinels...) {
		if pid := r.PID(); pid != 0 {
			pids = append(pids, pid)
		}
	}
	return pids
}

func (s *Sentinel) dataNode(addr string) *Redis {
	for _, r := range s.Data {
		if r.Addr == addr {
			return r
		}
	}
	return nil
}

// Master returns the data node the running sentinels name as master; an
// error when they disagree (during a failover).
func (s *Sentinel) Master(ctx context.Context) (*Redis, error) {
	addr := ""
	for _, sr := range s.Sentinels {
		if !sr.running() {
			continue
		}
		a, err := sr.adminClient().Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.MasterName).StringSlice()
		if err != nil {
			return nil, fmt.Errorf("testenv: SENTINEL GET-MASTER-ADDR-BY-NAME on %s: %w", sr.Addr, err)
		}
		if len(a) != 2 {
			return nil, fmt.Errorf("testenv: sentinel %s answered %q for the master address", sr.Addr, a)
		}
		got := a[0] + ":" + a[1]
		if addr != "" && got != addr {
			return nil, fmt.Errorf("testenv: sentinels disagree on the master: %s and %s", addr, got)
		}
		addr = got
	}
	if addr == "" {
		return nil, errors.New("testenv: no sentinel is running")
	}
	m := s.dataNode(addr)
	if m == nil {
		return nil, fmt.Errorf("testenv: sentinels name %s as master, which is no data node of this set", addr)
	}
	return m, nil
}

// Replica returns the data node that is not the master.
func (s *Sentinel) Replica(ctx context.Context) (*Redis, error) {
	m, err := s.Master(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range s.Data {
		if r != m {
			return r, nil
		}
	}
	return nil, errors.New("testenv: no replica")
}

// WaitHealthy waits until every process runs, all sentinels agree on a
// master that says it is master, the other data node is its replica and in
// sync, and every sentinel counts the replica (up, not failed) and two
// other sentinels. Call it after restarting processes to get back to a clean set.
//
// A former master that comes back still a master is turned into a replica
// here at once (REPLICAOF), as the sentinels would do at their next INFO
// refresh, up to 10 s later.
func (s *Sentinel) WaitHealthy(ctx context.Context) error {
	return poll(ctx, "a healthy sentinel set", func() (bool, string) {
		for _, r := range append(append([]*Redis(nil), s.Data...), s.Sentinels...) {
			if !r.running() {
				return false, r.Addr + " is not running (killed or paused)"
			}
		}
		m, err := s.Master(ctx)
		if err != nil {
			return false, err.Error()
		}
		if role, err := m.role(ctx); err != nil || role != "master" {
			return false, fmt.Sprintf("%s is named master but says role %q (%v)", m.Addr, role, err)
		}
		for _, r := range s.Data {
			if r == m {
				continue
			}
			if role, err := r.role(ctx); err == nil && role == "master" {
				_ = r.adminClient().Do(ctx, "REPLICAOF", "127.0.0.1", m.port).Err()
			}
			if !r.replicaSynced(ctx) {
				return false, r.Addr + " is not in sync with " + m.Addr
			}
		}
		for _, sr := range s.Sentinels {
			if why := s.sentinelLags(ctx, sr); why != "" {
				return false, why
			}
		}
		return true, ""
	})
}

// sentinelLags says what sentinel sr does not yet know of a healthy set
// ("" when it knows it all).
func (s *Sentinel) sentinelLags(ctx context.Context, sr *Redis) string {
	st, err := sr.adminClient().Do(ctx, "SENTINEL", "MASTER", s.MasterName).StringSlice()
	if err != nil {
		return err.Error()
	}
	f := pairs(st)
	if f["num-slaves"] != "1" || f["num-other-sentinels"] != "2" || f["flags"] != "master" {
		return fmt.Sprintf("sentinel %s: flags=%s num-slaves=%s num-other-sentinels=%s", sr.Addr, f["flags"], f["num-slaves"], f["num-other-sentinels"])
	}
	reps, err := sr.adminClient().Do(ctx, "SENTINEL", "REPLICAS", s.MasterName).Slice()
	if err != nil || len(reps) != 1 {
		return fmt.Sprintf("sentinel %s lists %d replicas (%v)", sr.Addr, len(reps), err)
	}
	rs, ok := reps[0].([]any)
	if !ok {
		return fmt.Sprintf("sentinel %s: SENTINEL REPLICAS answered %T", sr.Addr, reps[0])
	}
	f = pairs(toStrings(rs))
	// Not master-link-status: a sentinel refreshes it every 10 s, and the
	// replica's own INFO (checked above) is the truth.
	if f["flags"] != "slave" {
		return fmt.Sprintf("sentinel %s: replica %s:%s flags=%s", sr.Addr, f["ip"], f["port"], f["flags"])
	}
	return ""
}

// Failover asks a running sentinel for a failover (SENTINEL FAILOVER: no
// agreement needed, the master may be healthy) and returns the new master
// once every running sentinel names it and it says it is master.
func (s *Sentinel) Failover(ctx context.Context) (*Redis, error) {
	old, err := s.Master(ctx)
	if err != nil {
		return nil, err
	}
	var sent bool
	for _, sr := range s.Sentinels {
		if !sr.running() {
			continue
		}
		if err := sr.adminClient().Do(ctx, "SENTINEL", "FAILOVER", s.MasterName).Err(); err != nil {
			return nil, fmt.Errorf("testenv: SENTINEL FAILOVER on %s: %w", sr.Addr, err)
		}
		sent = true
		break
	}
	if !sent {
		return nil, errors.New("testenv: no sentinel is running")
	}
	return s.WaitFailover(ctx, old)
}

// WaitFailover waits until every running sentinel names a master other than
// old and that node says it is master, and returns it: the failover after
// old was paused or killed for longer than the down-after time.
func (s *Sentinel) WaitFailover(ctx context.Context, old *Redis) (*Redis, error) {
	var got *Redis
	err := poll(ctx, "the sentinels to fail over from "+old.Addr, func() (bool, string) {
		m, err := s.Master(ctx)
		if err != nil {
			return false, err.Error()
		}
		if m == old {
			return false, "sentinels still name " + old.Addr
		}
		if role, err := m.role(ctx); err != nil || role != "master" {
			return false, fmt.Sprintf("%s is named master but says role %q (%v)", m.Addr, role, err)
		}
		got = m
		return true, ""
	})
	return got, err
}

func pairs(kv []string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func toStrings(vs []any) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = fmt.Sprint(v)
	}
	return out
}
