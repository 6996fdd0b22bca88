package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// EnvRedisURL names the variable that points tests at an existing Redis.
const EnvRedisURL = "FENCE_TEST_REDIS_URL"

// ErrExternal is returned by fault methods of a server that testenv did not
// start (one given by FENCE_TEST_REDIS_URL or FENCE_TEST_DATABASE_URL).
var ErrExternal = errors.New("testenv: cannot inject faults into an external server; start a private one with NewRedisServer or StartPostgres")

// RedisOption configures a Redis server started by testenv.
type RedisOption interface {
	apply(*redisConfig) error
}

type redisConfig struct {
	aof  bool
	args []string

	// Set by the cluster and sentinel starters, not by options.
	clusterBus bool   // pick a second free port for the cluster bus
	conf       string // config file name in the server's dir (sentinel)
	sentinel   bool   // run in sentinel mode
	dirPrefix  string // temp dir name prefix
}

// WithAOF turns on append-only-file persistence (fsync always), so that
// Restart(true) keeps every acknowledged write.
func WithAOF() RedisOption {
	return optionFunc[redisConfig](func(c *redisConfig) error { c.aof = true; return nil })
}

// WithRedisArgs passes extra command-line arguments to redis-server.
func WithRedisArgs(args ...string) RedisOption {
	return optionFunc[redisConfig](func(c *redisConfig) error { c.args = append(c.args, args...); return nil })
}

// Redis is a Redis server for tests: either one testenv started (faults
// work) or an external one (FENCE_TEST_REDIS_URL).
type Redis struct {
	// Addr is host:port of the server.
	Addr string
	// URL is a redis:// URL for the server.
	URL string
	// Prefix is unique per NewRedis call; tests put it in front of their
	// keys so they can share an external server.
	Prefix string

	external bool
	cfg      redisConfig
	dir      string
	port     int
	busPort  int // cluster bus port, 0 unless a cluster node
	bin      string

	mu      sync.Mutex
	proc    *process
	clients []*redis.Client
	client  *redis.Client
	admin   *redis.Client
}

// redisPaths are where redis-server is looked for when it is not on PATH.
var redisPaths = []string{"/usr/bin/redis-server", "/usr/local/bin/redis-server"}

// RedisBinary finds redis-server, or returns an error naming the package.
func RedisBinary() (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	for _, p := range redisPaths {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("testenv: redis-server not found on PATH: install the Debian package redis-server (apt-get install redis-server), or set " + EnvRedisURL + " to an existing server")
}

// StartRedis starts a private redis-server on a free 127.0.0.1 port in a new
// temporary directory, without persistence unless WithAOF is given. The
// caller must call Stop.
func StartRedis(opts ...RedisOption) (*Redis, error) {
	var cfg redisConfig
	if err := applyOptions(&cfg, opts); err != nil {
		return nil, err
	}
	return startRedis(cfg, nil)
}

// startRedis starts a server with cfg. prepare, if not nil, runs in the new
// directory once the ports are chosen and before each start attempt (the
// sentinel writes its config file there).
func startRedis(cfg redisConfig, prepare func(r *Redis) error) (*Redis, error) {
	bin, err := RedisBinary()
	if err != nil {
		return nil, err
	}
	prefix := cfg.dirPrefix
	if prefix == "" {
		prefix = "fencelock-redis-"
	}
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, fmt.Errorf("testenv: redis temp dir: %w", err)
	}
	r := &Redis{cfg: cfg, dir: dir, bin: bin, Prefix: "t" + randHex(4) + ":"}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := reservePort()
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		r.port = port
		if cfg.clusterBus {
			// The bus port is set explicitly (cluster-port) rather than
			// port+10000, which may be taken or above 65535.
			if r.busPort, err = reservePort(); err != nil {
				_ = os.RemoveAll(dir)
				return nil, err
			}
		}
		r.Addr = "127.0.0.1:" + strconv.Itoa(port)
		r.URL = "redis://" + r.Addr
		if prepare != nil {
			if err := prepare(r); err != nil {
				_ = os.RemoveAll(dir)
				return nil, err
			}
		}
		if lastErr = r.start(); lastErr == nil {
			return r, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

func (r *Redis) start() error {
	var args []string
	if r.cfg.conf != "" {
		args = append(args, filepath.Join(r.dir, r.cfg.conf))
	}
	if r.cfg.sentinel {
		args = append(args, "--sentinel")
	}
	args = append(args,
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--dir", r.dir, "--save", "", "--protected-mode", "no",
		"--daemonize", "no", "--logfile", filepath.Join(r.dir, "redis.log"),
	)
	if r.cfg.aof {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	if r.busPort != 0 {
		args = append(args, "--cluster-port", strconv.Itoa(r.busPort))
	}
	args = append(args, r.cfg.args...)
	cmd := exec.Command(r.bin, args...)
	p, err := startProcess(cmd, nil)
	if err != nil {
		return fmt.Errorf("testenv: start redis-server: %w", err)
	}
	if err := waitRedis(r.Addr, p, 10*time.Second); err != nil {
		p.kill()
		return fmt.Errorf("%w\nredis log:\n%s", err, tail(filepath.Join(r.dir, "redis.log"), 2000))
	}
	r.mu.Lock()
	r.proc = p
	r.mu.Unlock()
	return nil
}

func waitRedis(addr string, p *process, limit time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if p != nil && p.exited() {
			return fmt.Errorf("testenv: redis-server exited at start: %v", p.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: redis-server on %s did not answer PING within %v: %w", addr, limit, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// NewRedis returns a Redis for the test: the server named by
// FENCE_TEST_REDIS_URL if set (with a unique Prefix), otherwise a private
// server stopped at the end of the test. A server that cannot be had fails
// the test with the reason.
func NewRedis(t testing.TB, opts ...RedisOption) *Redis {
	t.Helper()
	if u := os.Getenv(EnvRedisURL); u != "" {
		o, err := redis.ParseURL(u)
		if err != nil {
			t.Fatalf("testenv: %s=%q: %v", EnvRedisURL, u, err)
		}
		r := &Redis{Addr: o.Addr, URL: u, Prefix: "t" + randHex(6) + ":", external: true}
		t.Cleanup(func() { r.closeClients() })
		return r
	}
	return NewRedisServer(t, opts...)
}

// NewRedisServer always starts a private server (faults work), stopped at
// the end of the test.
func NewRedisServer(t testing.TB, opts ...RedisOption) *Redis {
	t.Helper()
	r, err := StartRedis(opts...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { _ = r.Stop() })
	return r
}

// External reports whether the server was not started by testenv.
func (r *Redis) External() bool { return r.external }

// PID is the server's process id (0 for an external server).
func (r *Redis) PID() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return 0
	}
	return r.proc.pid()
}

// Client returns a shared, ready client for the server; it is closed by Stop
// (or at the end of the test for external servers).
func (r *Redis) Client() *redis.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.client == nil {
		r.client = r.newClientLocked(nil)
	}
	return r.client
}

// NewClient returns a new client for the server, closed by Stop. opts may
// be nil; its Addr is overwritten.
func (r *Redis) NewClient(opts *redis.Options) *redis.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.newClientLocked(opts)
}

func (r *Redis) newClientLocked(opts *redis.Options) *redis.Client {
	if opts == nil {
		opts = &redis.Options{}
	}
	o := *opts
	o.Addr = r.Addr
	c := redis.NewClient(&o)
	r.clients = append(r.clients, c)
	return c
}

// adminClient is the client testenv itself uses to query and steer the
// server: short timeouts and no retries, so a paused or dead server costs a
// poll half a second, not the default minutes.
func (r *Redis) adminClient() *redis.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.admin == nil {
		r.admin = r.newClientLocked(&redis.Options{
			DialTimeout: 300 * time.Millisecond, ReadTimeout: 500 * time.Millisecond,
			WriteTimeout: 500 * time.Millisecond, MaxRetries: -1, PoolSize: 4,
			Protocol: 2, // SENTINEL and CLUSTER replies as flat arrays
		})
	}
	return r.admin
}

// running reports whether the server process is up and not paused: the
// ones whose view of a cluster counts.
func (r *Redis) running() bool {
	r.mu.Lock()
	p := r.proc
	r.mu.Unlock()
	if p == nil || p.exited() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.paused
}

func (r *Redis) closeClients() {
	r.mu.Lock()
	cs := r.clients
	r.clients, r.client, r.admin = nil, nil, nil
	r.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
	}
}

func (r *Redis) owned() (*process, error) {
	if r.external {
		return nil, ErrExternal
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return nil, errors.New("testenv: redis server is stopped")
	}
	return r.proc, nil
}

// Pause freezes the server with SIGSTOP: it keeps its connections but
// answers nothing, like a GC pause or a frozen VM.
func (r *Redis) Pause() error {
	p, err := r.owned()
	if err != nil {
		return err
	}
	return p.pause()
}

// Resume continues a paused server (SIGCONT).
func (r *Redis) Resume() error {
	p, err := r.owned()
	if err != nil {
		return err
	}
	return p.resume()
}

// Flush deletes every key (FLUSHALL), like a data loss.
func (r *Redis) Flush(ctx context.Context) error {
	if r.external {
		return ErrExternal
	}
	c := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer c.Close()
	return c.FlushAll(ctx).Err()
}

// Kill kills the server with SIGKILL and does not restart it. Restart brings
// it back on the same port.
func (r *Redis) Kill() error {
	p, err := r.owned()
	if err != nil {
		return err
	}
	p.kill()
	r.mu.Lock()
	r.proc = nil
	r.mu.Unlock()
	return nil
}

// Restart stops the server and starts it again on the same port. With
// keepData the data set survives (AOF when WithAOF was given, otherwise a
// SAVE just before the stop); without it the server comes back empty, as
// after a restart without persistence.
func (r *Redis) Restart(keepData bool) error {
	if r.external {
		return ErrExternal
	}
	r.mu.Lock()
	p := r.proc
	r.proc = nil
	r.mu.Unlock()
	if p != nil && !p.exited() {
		if keepData && !r.cfg.aof {
			_ = p.resume()
			c := redis.NewClient(&redis.Options{Addr: r.Addr})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := c.Save(ctx).Err()
			cancel()
			_ = c.Close()
			if err != nil {
				return fmt.Errorf("testenv: SAVE before restart: %w", err)
			}
		}
		if keepData {
			_ = p.stop(syscall.SIGTERM, 5*time.Second)
		} else {
			p.kill()
		}
	}
	if !keepData {
		_ = os.RemoveAll(filepath.Join(r.dir, "appendonlydir"))
		_ = os.Remove(filepath.Join(r.dir, "dump.rdb"))
		_ = os.Remove(filepath.Join(r.dir, "appendonly.aof"))
	}
	var err error
	for attempt := 0; attempt < 50; attempt++ { // the port may linger briefly
		if err = r.start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// Stop closes the clients handed out, stops the server and removes its
// directory. It is safe to call more than once.
func (r *Redis) Stop() error {
	r.closeClients()
	if r.external {
		return nil
	}
	r.mu.Lock()
	p := r.proc
	r.proc = nil
	r.mu.Unlock()
	if p != nil {
		p.kill()
	}
	if r.dir != "" {
		_ = os.RemoveAll(r.dir)
	}
	return nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
