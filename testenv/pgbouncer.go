package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PgBouncer is a PgBouncer started by testenv in transaction pooling mode in
// front of a Postgres: each transaction may run on a different server
// connection, and session state (prepared statements, SET, advisory locks)
// does not survive between transactions, as behind a production pooler.
//
// Every database of the upstream server is reachable through it under its
// own name (a "*" entry), so databases made by NewDB need no reload.
// Authentication is trust on 127.0.0.1, as for the upstream server; roles
// other than postgres are looked up on the server (auth_query), so a test
// may connect as a role it created.
type PgBouncer struct {
	// Addr is host:port of PgBouncer.
	Addr string
	// Upstream is the Postgres it pools connections to.
	Upstream *Postgres
	// PoolSize is default_pool_size: the most server connections per
	// database and user.
	PoolSize int

	bin  string
	dir  string
	cred *syscall.Credential

	mu   sync.Mutex
	proc *process
}

// pgbouncerPaths are where the Debian package pgbouncer installs the
// binary; PATH is searched too.
var pgbouncerPaths = []string{"/usr/sbin/pgbouncer"}

// PgBouncerBinary finds the pgbouncer binary, or returns an error naming
// the package to install.
func PgBouncerBinary() (string, error) {
	for _, p := range pgbouncerPaths {
		if fileExists(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	return "", errors.New("testenv: pgbouncer not found in /usr/sbin or PATH: install the Debian package pgbouncer (apt-get install pgbouncer; make deps does it)")
}

// DefaultPgBouncerPoolSize is the default_pool_size StartPgBouncer uses
// when poolSize is 0.
const DefaultPgBouncerPoolSize = 20

// StartPgBouncer starts a private PgBouncer in transaction pooling mode in
// front of pg, on a free 127.0.0.1 port, with default_pool_size poolSize
// (DefaultPgBouncerPoolSize when 0). It runs as the 'postgres' user when
// the process is root (PgBouncer refuses to run as root). The caller must
// call Stop.
func StartPgBouncer(pg *Postgres, poolSize int) (*PgBouncer, error) {
	if pg == nil {
		return nil, errors.New("testenv: StartPgBouncer: nil Postgres")
	}
	if poolSize < 0 {
		return nil, fmt.Errorf("testenv: StartPgBouncer: pool size %d: must be >= 0", poolSize)
	}
	if poolSize == 0 {
		poolSize = DefaultPgBouncerPoolSize
	}
	bin, err := PgBouncerBinary()
	if err != nil {
		return nil, err
	}
	cred, uid, gid, err := unprivileged()
	if err != nil {
		return nil, err
	}
	// Not t.TempDir: the postgres user could not enter its parent.
	dir, err := os.MkdirTemp("", "fencelock-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("testenv: pgbouncer temp dir: %w", err)
	}
	if cred != nil {
		if err := os.Chown(dir, uid, gid); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("testenv: chown %s to postgres: %w", dir, err)
		}
	}
	b := &PgBouncer{Upstream: pg, PoolSize: poolSize, bin: bin, dir: dir, cred: cred}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := reservePort()
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		b.Addr = "127.0.0.1:" + strconv.Itoa(port)
		if lastErr = b.start(port); lastErr == nil {
			return b, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

func (b *PgBouncer) start(port int) error {
	host, pgPort, err := splitHostPort(b.Upstream.Addr)
	if err != nil {
		return err
	}
	user := "postgres"
	if b.Upstream.external {
		if cfg, err := pgx.ParseConfig(b.Upstream.adminURL); err == nil && cfg.User != "" {
			user = cfg.User
		}
	}
	userlist := filepath.Join(b.dir, "userlist.txt")
	if err := os.WriteFile(userlist, []byte(strconv.Quote(user)+" \"\"\n"), 0o644); err != nil {
		return fmt.Errorf("testenv: pgbouncer userlist: %w", err)
	}
	logPath := filepath.Join(b.dir, "pgbouncer.log")
	ini := strings.Join([]string{
		"[databases]",
		"* = host=" + host + " port=" + pgPort,
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(port),
		"unix_socket_dir =",
		"auth_type = trust",
		"auth_file = " + userlist,
		"auth_user = " + user,
		"pool_mode = transaction",
		"default_pool_size = " + strconv.Itoa(b.PoolSize),
		"min_pool_size = 0",
		"reserve_pool_size = 0",
		"max_client_conn = 2000",
		"max_db_connections = 0",
		"admin_users = " + user,
		"ignore_startup_parameters = extra_float_digits",
		"logfile = " + logPath,
		"log_connections = 0",
		"log_disconnections = 0",
		"",
	}, "\n")
	iniPath := filepath.Join(b.dir, "pgbouncer.ini")
	if err := os.WriteFile(iniPath, []byte(ini), 0o644); err != nil {
		return fmt.Errorf("testenv: pgbouncer config: %w", err)
	}
	cmd := exec.Command(b.bin, iniPath)
	cmd.Dir = b.dir
	stderr, err := os.OpenFile(filepath.Join(b.dir, "stderr.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o666)
	if err != nil {
		return fmt.Errorf("testenv: pgbouncer log: %w", err)
	}
	defer stderr.Close()
	cmd.Stdout, cmd.Stderr = stderr, stderr
	p, err := startProcess(cmd, b.cred)
	if err != nil {
		return fmt.Errorf("testenv: start pgbouncer: %w", err)
	}
	if err := waitPgBouncer(b.URL("postgres"), p, 20*time.Second); err != nil {
		p.kill()
		return fmt.Errorf("%w\npgbouncer log:\n%s%s", err, tail(logPath, 2000), tail(filepath.Join(b.dir, "stderr.log"), 1000))
	}
	b.mu.Lock()
	b.proc = p
	b.mu.Unlock()
	return nil
}

func splitHostPort(addr string) (host, port string, err error) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return "", "", fmt.Errorf("testenv: postgres address %q has no port", addr)
	}
	return addr[:i], addr[i+1:], nil
}

// waitPgBouncer waits until a query through PgBouncer reaches the server.
func waitPgBouncer(url string, p *process, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		cfg, err := pgx.ParseConfig(url)
		if err == nil {
			cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
			var c *pgx.Conn
			c, err = pgx.ConnectConfig(ctx, cfg)
			if err == nil {
				_, err = c.Exec(ctx, "SELECT 1")
				_ = c.Close(ctx)
			}
		}
		cancel()
		if err == nil {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("testenv: pgbouncer exited at start: %v", p.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: pgbouncer did not pass a query within %v: %w", limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URL returns a connection URL for database db through PgBouncer.
func (b *PgBouncer) URL(db string) string {
	u := "postgres"
	if b.Upstream.external {
		if cfg, err := pgx.ParseConfig(b.Upstream.adminURL); err == nil && cfg.User != "" {
			u = cfg.User
		}
	}
	return "postgres://" + u + "@" + b.Addr + "/" + db + "?sslmode=disable"
}

// PID is PgBouncer's process id (0 once stopped).
func (b *PgBouncer) PID() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc == nil {
		return 0
	}
	return b.proc.pid()
}

// Stop stops PgBouncer (immediate shutdown: client connections are cut)
// and removes its directory. Safe to call twice.
func (b *PgBouncer) Stop() error {
	b.mu.Lock()
	p := b.proc
	b.proc = nil
	b.mu.Unlock()
	if p != nil {
		_ = p.stop(syscall.SIGTERM, 5*time.Second)
	}
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
	return nil
}

// NewDB creates a fresh database on the upstream server for the test, with
// a ready pool through PgBouncer (pgx's defaults, including its default
// exec mode, as an application would have); both are dropped at the end of
// the test. URL goes through PgBouncer; DirectURL goes to the server, for
// what transaction pooling cannot carry (migrations take a session
// advisory lock).
func (b *PgBouncer) NewDB(t testing.TB) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name, direct, err := b.Upstream.CreateDatabase(ctx)
	if err != nil {
		t.Fatalf("%v", err)
	}
	url := b.URL(name)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("testenv: pool for %s through pgbouncer: %v", name, err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = b.Upstream.DropDatabase(ctx, name)
	})
	return &DB{Name: name, URL: url, DirectURL: direct, Pool: pool, Server: b.Upstream}
}

var (
	sharedBouncerMu sync.Mutex
	sharedBouncer   *PgBouncer
)

// SharedPgBouncer returns the PgBouncer shared by the whole test binary,
// in front of SharedPostgres, started on first use with the default pool
// size. StopShared (called by Main) stops it.
func SharedPgBouncer() (*PgBouncer, error) {
	sharedBouncerMu.Lock()
	defer sharedBouncerMu.Unlock()
	if sharedBouncer != nil {
		return sharedBouncer, nil
	}
	pg, err := SharedPostgres()
	if err != nil {
		return nil, err
	}
	b, err := StartPgBouncer(pg, 0)
	if err != nil {
		return nil, err
	}
	sharedBouncer = b
	return b, nil
}

func stopSharedPgBouncer() {
	sharedBouncerMu.Lock()
	b := sharedBouncer
	sharedBouncer = nil
	sharedBouncerMu.Unlock()
	if b != nil {
		_ = b.Stop()
	}
}

// NewDBViaPgBouncer creates a fresh database on the shared server with a
// pool through the shared PgBouncer (see PgBouncer.NewDB).
func NewDBViaPgBouncer(t testing.TB) *DB {
	t.Helper()
	b, err := SharedPgBouncer()
	if err != nil {
		t.Fatalf("%v", err)
	}
	return b.NewDB(t)
}
