package pgfence_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// On a hot standby, guarded writes are refused with guard.ErrReadOnly naming
// the standby, and fn does not run; the server's 25006 and 0A000 (from
// BEGIN ... READ WRITE) never come back raw.
func TestHotStandby(t *testing.T) {
	ctx := testCtx(t)
	primary, err := testenv.StartPostgres()
	require.NoError(t, err)
	t.Cleanup(func() { _ = primary.Stop() })
	standbyURL := startStandby(t, primary)

	// The schema and a fence row, made on the primary, replicated.
	prim, err := pgxpool.New(ctx, primary.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(prim.Close)
	migrate(t, prim)
	stockTable(t, prim)
	require.NoError(t, newStore(t, prim).Advance(ctx, guardtest.Lease{Resource: "known", Tok: 1, Who: "a"}))
	standby, err := pgxpool.New(ctx, standbyURL)
	require.NoError(t, err)
	t.Cleanup(standby.Close)
	require.Eventually(t, func() bool {
		var n int64
		return standby.QueryRow(ctx, "SELECT count(*) FROM fencelock.fence").Scan(&n) == nil && n == 1
	}, time.Minute, 20*time.Millisecond, "the standby replays the primary")

	s := newStore(t, standby)
	ran := false
	fn := func(ctx context.Context, tx pgx.Tx) error {
		ran = true
		return insertStock("standby", 1)(ctx, tx)
	}
	check := func(what string, err error) {
		t.Helper()
		require.ErrorIs(t, err, guard.ErrReadOnly, what)
		assert.Contains(t, err.Error(), "hot standby", what)
		assert.NotContains(t, err.Error(), "\n", what)
	}
	for _, l := range []guardtest.Lease{{Resource: "new", Tok: 5, Who: "a"}, {Resource: "known", Tok: 1, Who: "a"}} {
		_, err := guard.Exec(ctx, s, l, fn, guard.WithKey("k"))
		check("Exec "+l.Resource, err)
		check("Step "+l.Resource, s.Run(l, "run").Step(ctx, "1", fn))
	}
	check("Advance", s.Advance(ctx, guardtest.Lease{Resource: "new", Tok: 6, Who: "a"}))
	assert.False(t, ran, "fn must not run on a standby")
}

// startStandby makes a hot standby of primary (pg_basebackup -R) on a
// free port, stopped when the test ends, and returns its URL.
func startStandby(t *testing.T, primary *testenv.Postgres) string {
	t.Helper()
	bin, err := testenv.PostgresBinDir()
	require.NoError(t, err)
	var cred *syscall.Credential
	dir, err := os.MkdirTemp("", "fencelock-standby-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		require.NoError(t, err, "running as root: Postgres runs as the 'postgres' user (Debian package postgresql-15)")
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
		require.NoError(t, os.Chown(dir, uid, gid))
	}
	host, port, _ := net.SplitHostPort(primary.Addr)
	data := filepath.Join(dir, "data")
	bb := exec.Command(filepath.Join(bin, "pg_basebackup"), "-h", host, "-p", port, "-U", "postgres",
		"-D", data, "-R", "-X", "stream", "--no-sync", "-c", "fast")
	bb.Dir = dir
	bb.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	out, err := bb.CombinedOutput()
	require.NoError(t, err, "pg_basebackup: %s", out)

	// A standby needs max_connections (and friends) at least the
	// primary's; testenv raises it.
	pc, err := pgx.Connect(context.Background(), primary.URL("postgres"))
	require.NoError(t, err)
	var maxConns string
	require.NoError(t, pc.QueryRow(context.Background(), "SHOW max_connections").Scan(&maxConns))
	_ = pc.Close(context.Background())

	sp, err := testenv.ReservePort()
	require.NoError(t, err)
	sport := strconv.Itoa(sp)
	logf, err := os.Create(filepath.Join(dir, "standby.log"))
	require.NoError(t, err)
	defer logf.Close()
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", sport,
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=", "-c", "hot_standby=on",
		"-c", "fsync=off", "-c", "shared_buffers=32MB", "-c", "max_connections="+maxConns)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGQUIT)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	url := "postgres://postgres@127.0.0.1:" + sport + "/postgres?sslmode=disable"
	ready := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			return false
		}
		defer c.Close(ctx)
		var rec bool
		return c.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&rec) == nil && rec
	}
	for deadline := time.Now().Add(time.Minute); !ready(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "standby.log"))
			t.Fatalf("the standby does not accept connections in recovery; its log:\n%s", log)
		}
	}
	return url
}
