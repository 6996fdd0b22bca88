package pgfence_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
)

const frozenLeaderEnv = "PGFENCE_TEST_FROZEN_LEADER"

// frozenLeader is the child of TestFrozenLeaderRefused: it campaigns in
// election "stock-sync" (term lease $..._LEASE), says "leader <token>",
// and writes two rows as "old" under guard with its term's token; it says
// "wrote" before committing, waits for "commit" on stdin, and says how the
// commit ended: "committed", "stale" (refused as stale) or "error <err>".
// Its lease has no Done channel: a process that was frozen cannot react
// to anything, so only the database stops it.
func frozenLeader() {
	get := func(k string) string { return os.Getenv(frozenLeaderEnv + k) }
	fail := func(err error) {
		fmt.Println("error", err)
		os.Exit(1)
	}
	ctx := context.Background()
	lease, _ := time.ParseDuration(get("_LEASE"))
	locks, err := fence.New(redis.NewClient(&redis.Options{Addr: get("")}), fence.WithPrefix(get("_PREFIX")))
	if err != nil {
		fail(err)
	}
	e, err := locks.Election("stock-sync", fence.WithLease(lease))
	if err != nil {
		fail(err)
	}
	term, err := e.Campaign(ctx, "old")
	if err != nil {
		fail(err)
	}
	fmt.Println("leader", term.Token())
	pool, err := pgxpool.New(ctx, get("_DB"))
	if err != nil {
		fail(err)
	}
	s, err := pgfence.New(pool)
	if err != nil {
		fail(err)
	}
	stdin := bufio.NewScanner(os.Stdin)
	lease2 := guardtest.Lease{Resource: term.Name(), Tok: term.Token(), Who: term.Holder()}
	_, err = guard.Exec(ctx, s, lease2, func(ctx context.Context, tx pgx.Tx) error {
		if err := insertStock("old", 2)(ctx, tx); err != nil {
			return err
		}
		fmt.Println("wrote")
		stdin.Scan() // "commit", after the test resumed this process
		return nil
	})
	switch {
	case err == nil:
		fmt.Println("committed")
	case errors.Is(err, guard.ErrStaleToken):
		fmt.Println("stale")
	default:
		fmt.Println("error", err)
	}
	select {} // killed by the test
}

// A leader process is frozen (SIGSTOP) in the middle of its guarded
// transaction; its term's lease runs out, and a candidate leads with a
// greater token and commits its writes under guard while the old leader
// is still frozen. Resumed (SIGCONT), the old leader commits: refused as
// stale, none of its rows written.
func TestFrozenLeaderRefused(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	ctx := testCtx(t)
	rds := testenv.NewRedis(t)
	const lease = time.Second
	old := testenv.StartChild(t, "old leader", frozenLeaderEnv+"="+rds.Addr, frozenLeaderEnv+"_PREFIX="+rds.Prefix,
		frozenLeaderEnv+"_LEASE="+lease.String(), frozenLeaderEnv+"_DB="+db.URL)
	oldToken, err := strconv.ParseInt(old.Expect("leader", 30*time.Second), 10, 64)
	require.NoError(t, err)
	old.Expect("wrote", 30*time.Second)
	old.Pause()

	locks, err := fence.New(rds.Client(), fence.WithPrefix(rds.Prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = locks.Close(context.Background()) })
	e, err := locks.Election("stock-sync", fence.WithLease(lease))
	require.NoError(t, err)
	term, err := e.Campaign(ctx, "new") // once the frozen leader's term expired
	require.NoError(t, err)
	require.Greater(t, term.Token(), oldToken)
	s := newStore(t, db.Pool)
	_, err = guard.Exec(term.Context(), s, term, insertStock("new", 3))
	require.NoError(t, err, "the successor's guarded writes commit while the old leader is frozen")
	assert.EqualValues(t, 3, rowsBy(t, db.Pool, "new"))

	old.Resume()
	old.Send("commit")
	assert.Equal(t, "", old.Expect("stale", 30*time.Second), "the old leader's commit is refused as stale")
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "old"), "nothing of the old leader is written")
	assert.EqualValues(t, 3, rowsBy(t, db.Pool, "new"))
	assert.Equal(t, term.Token(), storedToken(t, db.Pool, "stock-sync"))
	require.NoError(t, term.Release(ctx))
}
