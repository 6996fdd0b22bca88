package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvDatabaseURL names the variable that points tests at an existing
// Postgres; each test gets a fresh database created on that server.
const EnvDatabaseURL = "FENCE_TEST_DATABASE_URL"

// Postgres is a Postgres server started by testenv (or an external one).
type Postgres struct {
	// Addr is host:port of the server.
	Addr string
	// SocketDir is the directory of the server's Unix socket, for the
	// same port; "" for an external server.
	SocketDir string

	external bool
	adminURL string // URL of the maintenance database
	bin      string
	dir      string
	port     int
	cred     *syscall.Credential

	mu   sync.Mutex
	proc *process
}

// postgresGlob is where Debian installs the Postgres server binaries.
var postgresGlob = "/usr/lib/postgresql/*/bin"

// PostgresBinDir finds the directory with initdb and postgres, or returns an
// error naming the package to install.
func PostgresBinDir() (string, error) {
	var cands []string
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		cands = append(cands, strings.TrimSpace(string(out)))
	}
	if m, _ := filepath.Glob(postgresGlob); len(m) > 0 {
		sort.Sort(sort.Reverse(sort.StringSlice(m)))
		// Prefer 15, the version the project targets, then the newest.
		for _, d := range m {
			if strings.Contains(d, "/15/") {
				cands = append([]string{d}, cands...)
			}
		}
		cands = append(cands, m...)
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		cands = append(cands, filepath.Dir(p))
	}
	for _, d := range cands {
		if fileExists(filepath.Join(d, "initdb")) && fileExists(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errors.New("testenv: Postgres server binaries (initdb, postgres) not found in /usr/lib/postgresql/*/bin, pg_config --bindir or PATH: install the Debian package postgresql-15 (apt-get install postgresql-15), or set " + EnvDatabaseURL + " to an existing server")
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// StartPostgres initialises and starts a private Postgres on a free
// 127.0.0.1 port, in a new temporary directory, as the unprivileged
// 'postgres' user when the process is root. The caller must call Stop.
func StartPostgres() (*Postgres, error) {
	bin, err := PostgresBinDir()
	if err != nil {
		return nil, err
	}
	cred, uid, gid, err := unprivileged()
	if err != nil {
		return nil, err
	}
	// Not t.TempDir: its parent is a 0700 directory of root's that the
	// postgres user cannot enter.
	dir, err := os.MkdirTemp("", "fencelock-pg-")
	if err != nil {
		return nil, fmt.Errorf("testenv: postgres temp dir: %w", err)
	}
	if cred != nil {
		if err := os.Chown(dir, uid, gid); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("testenv: chown %s to postgres: %w", dir, err)
		}
	}
	pg := &Postgres{bin: bin, dir: dir, cred: cred, SocketDir: dir}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if out, err := initdb.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("testenv: initdb failed: %v\n%s", err, out)
	}
	if err := requirePasswords(data); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := reservePort()
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		pg.port = port
		pg.Addr = "127.0.0.1:" + strconv.Itoa(port)
		pg.adminURL = pg.URL("postgres")
		if lastErr = pg.start(); lastErr == nil {
			return pg, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

func (pg *Postgres) start() error {
	logPath := filepath.Join(pg.dir, "postgres.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o666)
	if err != nil {
		return fmt.Errorf("testenv: postgres log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(pg.bin, "postgres"),
		"-D", filepath.Join(pg.dir, "data"), "-p", strconv.Itoa(pg.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+pg.dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=300", "-c", "shared_buffers=32MB")
	cmd.Dir = pg.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	p, err := startProcess(cmd, pg.cred)
	if err != nil {
		return fmt.Errorf("testenv: start postgres: %w", err)
	}
	if err := waitPostgres(pg.adminURL, p, 20*time.Second); err != nil {
		p.kill()
		return fmt.Errorf("%w\npostgres log:\n%s", err, tail(logPath, 3000))
	}
	pg.mu.Lock()
	pg.proc = p
	pg.mu.Unlock()
	return nil
}

func waitPostgres(url string, p *process, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		c, err := pgx.Connect(ctx, url)
		if err == nil {
			err = c.Ping(ctx)
			_ = c.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		if p != nil && p.exited() {
			return fmt.Errorf("testenv: postgres exited at start: %v", p.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: postgres did not accept connections within %v: %w", limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URL returns a connection URL for database db on this server.
func (pg *Postgres) URL(db string) string {
	if pg.external {
		cfg, err := pgx.ParseConfig(pg.adminURL)
		if err == nil {
			return replaceDB(pg.adminURL, cfg.Database, db)
		}
	}
	return "postgres://postgres@" + pg.Addr + "/" + db + "?sslmode=disable"
}

func replaceDB(url, from, to string) string {
	// postgres://user:pw@host:port/dbname?params
	q := ""
	if i := strings.IndexByte(url, '?'); i >= 0 {
		url, q = url[:i], url[i:]
	}
	if from != "" && strings.HasSuffix(url, "/"+from) {
		return strings.TrimSuffix(url, from) + to + q
	}
	return strings.TrimRight(url, "/") + "/" + to + q
}

// External reports whether the server was not started by testenv.
func (pg *Postgres) External() bool { return pg.external }

// PID is the postmaster's process id (0 for an external server).
func (pg *Postgres) PID() int {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if pg.proc == nil {
		return 0
	}
	return pg.proc.pid()
}

// CreateDatabase creates a new, empty database with a unique name and
// returns its name and URL.
func (pg *Postgres) CreateDatabase(ctx context.Context) (name, url string, err error) {
	name = "fence_" + randHex(6)
	c, err := pgx.Connect(ctx, pg.adminURL)
	if err != nil {
		return "", "", fmt.Errorf("testenv: connect to %s: %w", pg.Addr, err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	if _, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", "", fmt.Errorf("testenv: create database: %w", err)
	}
	return name, pg.URL(name), nil
}

// DropDatabase drops a database made by CreateDatabase, ending its sessions.
func (pg *Postgres) DropDatabase(ctx context.Context, name string) error {
	c, err := pgx.Connect(ctx, pg.adminURL)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	_, err = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	return err
}

// Restart stops the server (fast shutdown: open connections are cut) and
// starts it again on the same port with its data.
func (pg *Postgres) Restart() error {
	if pg.external {
		return ErrExternal
	}
	pg.mu.Lock()
	p := pg.proc
	pg.proc = nil
	pg.mu.Unlock()
	if p != nil {
		_ = p.stop(syscall.SIGINT, 10*time.Second)
	}
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		if err = pg.start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// Pause freezes the postmaster and every backend with SIGSTOP.
func (pg *Postgres) Pause() error { return pg.signalGroup(syscall.SIGSTOP) }

// Resume continues a paused server.
func (pg *Postgres) Resume() error { return pg.signalGroup(syscall.SIGCONT) }

func (pg *Postgres) signalGroup(sig syscall.Signal) error {
	if pg.external {
		return ErrExternal
	}
	pid := pg.PID()
	if pid == 0 {
		return errors.New("testenv: postgres is stopped")
	}
	// Backends are children of the postmaster in its process group.
	return syscall.Kill(-pid, sig)
}

// Stop stops the server and removes its directory. Safe to call twice.
func (pg *Postgres) Stop() error {
	if pg.external {
		return nil
	}
	pg.mu.Lock()
	p := pg.proc
	pg.proc = nil
	pg.mu.Unlock()
	if p != nil {
		_ = p.stop(syscall.SIGQUIT, 5*time.Second)
	}
	if pg.dir != "" {
		_ = os.RemoveAll(pg.dir)
	}
	return nil
}

// DB is a fresh database for one test.
type DB struct {
	Name string
	// URL is how the test reaches the database: the server itself, or
	// PgBouncer for PgBouncer.NewDB.
	URL string
	// DirectURL always goes to the server (the same as URL unless the DB
	// came through PgBouncer).
	DirectURL string
	Pool      *pgxpool.Pool
	Server    *Postgres
}

var (
	sharedMu sync.Mutex
	sharedPG *Postgres
)

// SharedPostgres returns the server shared by the whole test binary
// (FENCE_TEST_DATABASE_URL or one started on first use). StopShared stops it;
// Main calls StopShared.
func SharedPostgres() (*Postgres, error) {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedPG != nil {
		return sharedPG, nil
	}
	if u := os.Getenv(EnvDatabaseURL); u != "" {
		cfg, err := pgx.ParseConfig(u)
		if err != nil {
			return nil, fmt.Errorf("testenv: %s: %w", EnvDatabaseURL, err)
		}
		sharedPG = &Postgres{external: true, adminURL: u, Addr: cfg.Host + ":" + strconv.Itoa(int(cfg.Port))}
		return sharedPG, nil
	}
	pg, err := StartPostgres()
	if err != nil {
		return nil, err
	}
	sharedPG = pg
	return pg, nil
}

// StopShared stops the shared Postgres, the shared PgBouncer in front of
// it and the shared Redis Cluster, if they were started.
func StopShared() {
	stopSharedCluster()
	stopSharedPgBouncer()
	sharedMu.Lock()
	pg := sharedPG
	sharedPG = nil
	sharedMu.Unlock()
	if pg != nil {
		_ = pg.Stop()
	}
}

// NewDB creates a fresh database for the test on the shared server and a
// ready pool for it; both are dropped at the end of the test.
func NewDB(t testing.TB) *DB {
	t.Helper()
	pg, err := SharedPostgres()
	if err != nil {
		t.Fatalf("%v", err)
	}
	return pg.NewDB(t)
}

// NewDB creates a fresh database on this server for the test, with a ready
// pool; both are dropped at the end of the test.
func (pg *Postgres) NewDB(t testing.TB) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name, url, err := pg.CreateDatabase(ctx)
	if err != nil {
		t.Fatalf("%v", err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("testenv: pool for %s: %v", name, err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = pg.DropDatabase(ctx, name)
	})
	return &DB{Name: name, URL: url, DirectURL: url, Pool: pool, Server: pg}
}
