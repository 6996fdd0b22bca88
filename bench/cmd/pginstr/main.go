// Command pginstr counts the instructions a Postgres backend runs per
// guarded transaction, against the same plain transaction, with the
// backend under callgrind: a count that a loaded machine does not
// change, so that two commits' guarded writes compare exactly.
//
//	cd bench && go run ./cmd/pginstr            # -n 400 -warm 100
//
// It starts its own Postgres (the Debian postgresql-15 binaries, as the
// tests do) under valgrind --tool=callgrind with instrumentation off,
// connects one connection per client (pgx; database/sql over the pgx
// driver), installs the schema, and for each kind of transaction runs
// -warm unmeasured, then -n with the backend's instrumentation on, and
// divides the backend's instruction count by n. It needs the Debian
// package valgrind.
package main

import (
	"bytes"
	"context"
	"database/sql"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
)

func main() {
	n := flag.Int("n", 400, "measured transactions per kind")
	warm := flag.Int("warm", 100, "unmeasured transactions per kind first")
	flag.Parse()
	if err := run(*n, *warm); err != nil {
		fmt.Fprintln(os.Stderr, "pginstr:", err)
		os.Exit(1)
	}
}

func run(n, warm int) error {
	for _, tool := range []string{"valgrind"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: install the Debian package valgrind (apt-get install valgrind)", tool)
		}
	}
	pg, err := startPostgres()
	if err != nil {
		return err
	}
	defer pg.stop()
	ctx := context.Background()
	db, err := sql.Open("pgx", pg.url)
	if err != nil {
		return err
	}
	if err := migrations.Up(ctx, db); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (id int)`); err != nil {
		return err
	}
	_ = db.Close()
	fmt.Printf("| transaction (one INSERT) | backend instructions per transaction |\n|---|---|\n")
	for _, k := range kinds {
		// A backend's count is written when it exits: two backends, one
		// running n transactions more than the other after the same
		// warm-up, and the difference over n is what a transaction costs
		// (the connection's start and end cancel out).
		var ir [2]int64
		for j, extra := range []int{0, n} {
			if ir[j], err = pg.backend(ctx, k, warm, extra); err != nil {
				return fmt.Errorf("%s: %w", k.name, err)
			}
		}
		fmt.Printf("| %s | %.1fk |\n", k.name, float64(ir[1]-ir[0])/float64(n)/1000)
	}
	return nil
}

// backend runs warm+extra transactions of kind k on a connection of its
// own and returns the instructions its backend ran, from connection to
// exit.
func (p *pg) backend(ctx context.Context, k kind, warm, extra int) (int64, error) {
	c, err := k.open(ctx, p.url)
	if err != nil {
		return 0, err
	}
	for i := range warm + extra {
		if err := c.tx(ctx, i); err != nil {
			c.close()
			return 0, err
		}
	}
	pid := c.pid
	c.close()
	return p.dumped(pid)
}

// kind is one kind of transaction.
type kind struct {
	name string
	open func(ctx context.Context, url string) (*client, error)
}

// client is one connection running a kind's transactions.
type client struct {
	pid   int
	tx    func(ctx context.Context, i int) error
	close func()
}

const insert = `INSERT INTO t VALUES ($1)`

var lease = guardtest.Lease{Resource: "r", Tok: 1, Who: "h"}

func effect(i int) outbox.Effect {
	return outbox.Effect{Destination: "https://example.com/hook", Key: "k" + strconv.Itoa(i), Payload: []byte(`{}`)}
}

// kinds: plain and guarded, on pgx and on database/sql, and guarded with
// one outbox row.
var kinds = []kind{
	{"plain, pgx", pgxClient(func(_ *pgfence.Store, conn *pgx.Conn) func(context.Context, int) error {
		return func(ctx context.Context, i int) error {
			return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { _, err := tx.Exec(ctx, insert, i); return err })
		}
	})},
	{"guard.Exec, pgfence", pgxClient(func(s *pgfence.Store, _ *pgx.Conn) func(context.Context, int) error {
		return func(ctx context.Context, i int) error {
			_, err := guard.Exec(ctx, s, lease, func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, insert, i); return err })
			return err
		}
	})},
	{"guard.Exec + outbox.Add, pgfence", pgxClient(func(s *pgfence.Store, _ *pgx.Conn) func(context.Context, int) error {
		return func(ctx context.Context, i int) error {
			_, err := guard.Exec(ctx, s, lease, func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, insert, i); err != nil {
					return err
				}
				return outbox.Add(ctx, tx, effect(i))
			})
			return err
		}
	})},
	{"plain, database/sql (pgx driver)", sqlClient(func(_ *sqlfence.Store, db *sql.DB) func(context.Context, int) error {
		return func(ctx context.Context, i int) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, insert, i); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		}
	})},
	{"guard.Exec, sqlfence (pgx driver)", sqlClient(func(s *sqlfence.Store, _ *sql.DB) func(context.Context, int) error {
		return func(ctx context.Context, i int) error {
			_, err := guard.Exec(ctx, s, lease, func(ctx context.Context, tx *sql.Tx) error { _, err := tx.ExecContext(ctx, insert, i); return err })
			return err
		}
	})},
	{"guard.Exec + outbox.Add, sqlfence (pgx driver)", sqlClient(func(s *sqlfence.Store, _ *sql.DB) func(context.Context, int) error {
		return func(ctx context.Context, i int) error {
			_, err := guard.Exec(ctx, s, lease, func(ctx context.Context, tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, insert, i); err != nil {
					return err
				}
				return outbox.Add(ctx, tx, effect(i))
			})
			return err
		}
	})},
}

func pgxClient(tx func(*pgfence.Store, *pgx.Conn) func(context.Context, int) error) func(context.Context, string) (*client, error) {
	return func(ctx context.Context, url string) (*client, error) {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return nil, err
		}
		s, err := pgfence.New(conn)
		if err != nil {
			return nil, err
		}
		return &client{pid: int(conn.PgConn().PID()), tx: tx(s, conn), close: func() { _ = conn.Close(ctx) }}, nil
	}
}

func sqlClient(tx func(*sqlfence.Store, *sql.DB) func(context.Context, int) error) func(context.Context, string) (*client, error) {
	return func(ctx context.Context, url string) (*client, error) {
		db, err := sql.Open("pgx", url)
		if err != nil {
			return nil, err
		}
		db.SetMaxOpenConns(1)
		db.SetMaxIdleConns(1)
		var pid int
		if err := db.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return nil, err
		}
		s, err := sqlfence.New(db)
		if err != nil {
			return nil, err
		}
		return &client{pid: pid, tx: tx(s, db), close: func() { _ = db.Close() }}, nil
	}
}

// pg is a Postgres under callgrind in a directory of its own.
type pg struct {
	dir, url string
	port     int
	cmd      *exec.Cmd
}

func startPostgres() (*pg, error) {
	bin, err := testenv.PostgresBinDir()
	if err != nil {
		return nil, err
	}
	var cred *syscall.Credential
	dir, err := os.MkdirTemp("", "pginstr-")
	if err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 { // Postgres refuses to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root and no postgres user to run Postgres as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	// A free port, as the kernel hands one out; closed again for
	// Postgres to take.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &pg{dir: dir, port: ln.Addr().(*net.TCPAddr).Port}
	_ = ln.Close()
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	// The settings of testenv's servers.
	p.cmd = exec.Command("valgrind", "--tool=callgrind",
		"--callgrind-out-file="+filepath.Join(dir, "cg.%p"),
		filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(p.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "shared_buffers=32MB", "-c", "autovacuum=off")
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var log bytes.Buffer
	p.cmd.Stdout, p.cmd.Stderr = &log, &log
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	p.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
	for start := time.Now(); ; time.Sleep(time.Second) {
		c, err := pgx.Connect(context.Background(), p.url)
		if err == nil {
			_ = c.Close(context.Background())
			return p, nil
		}
		if time.Since(start) > 3*time.Minute {
			p.stop()
			return nil, fmt.Errorf("postgres under valgrind not up after 3 minutes: %v\n%s", err, log.String())
		}
	}
}

var totals = regexp.MustCompile(`(?m)^totals:\s+(\d+)`)

// dumped waits for the count that backend pid writes when it exits.
func (p *pg) dumped(pid int) (int64, error) {
	file := filepath.Join(p.dir, fmt.Sprintf("cg.%d", pid))
	for start := time.Now(); time.Since(start) < time.Minute; time.Sleep(100 * time.Millisecond) {
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		if m := totals.FindSubmatch(b); m != nil {
			return strconv.ParseInt(string(m[1]), 10, 64)
		}
	}
	return 0, fmt.Errorf("backend %d wrote no callgrind count to %s within a minute", pid, file)
}

func (p *pg) stop() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		_ = p.cmd.Wait()
	}
	_ = os.RemoveAll(p.dir)
}
