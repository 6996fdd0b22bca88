package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/testenv"
)

// runMainEnv makes the test binary act as fencectl itself (see fencectlProc).
const runMainEnv = "FENCECTL_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	testenv.Main(m)
}

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// fencectl runs the CLI in-process.
func fencectl(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return fencectlIn(t, "", args...)
}

func fencectlIn(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code = run(ctx, args, strings.NewReader(stdin), &o, &e)
	return code, o.String(), e.String()
}

// fencectlProc runs the CLI as its own process (this test binary, re-executed
// into main), so that everything any library writes to the process's real
// stdout and stderr is captured too. env adds variables; REDIS_URL and
// DATABASE_URL are unset unless env sets them.
func fencectlProc(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "REDIS_URL=") && !strings.HasPrefix(kv, "DATABASE_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, runMainEnv+"=1")
	cmd.Env = append(cmd.Env, env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr, cmd.Stdin = &o, &e, io.LimitReader(nil, 0)
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("run fencectl: %v", err)
	}
	return code, o.String(), e.String()
}

// migratedDB is a fresh database with the fencelock schema.
func migratedDB(t *testing.T) *testenv.DB {
	t.Helper()
	db := testenv.NewDB(t)
	sdb := stdlib.OpenDBFromPool(db.Pool)
	defer sdb.Close()
	require.NoError(t, migrations.Up(context.Background(), sdb))
	return db
}

// withPassword returns u with user:password as its userinfo.
func withPassword(t *testing.T, raw, user, password string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	u.User = url.UserPassword(user, password)
	return u.String()
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// requireNoSecret asserts a password appears in none of the outputs.
func requireNoSecret(t *testing.T, secret string, outputs ...string) {
	t.Helper()
	for _, o := range outputs {
		require.NotContains(t, o, secret, "a password was printed")
		require.NotContains(t, o, url.QueryEscape(secret), "a password was printed (escaped)")
	}
}
