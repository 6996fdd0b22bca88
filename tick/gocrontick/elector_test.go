package gocrontick_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/fencelock/fencelock/tick/gocrontick"
	"github.com/fencelock/fencelock/tick/ticktest"
	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two gocron schedulers with Electors on one election: only the leader
// runs the job, each run fenced with the term; when the leader's Redis is
// cut, its term ends, the other instance leads and runs the job, and the
// old leader's late write with its term is refused by the database.
func TestElectorRunsJobsOnTheLeaderAlone(t *testing.T) {
	env := ticktest.NewEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := env.DB.Pool.Exec(ctx, `CREATE TABLE led_runs (instance text NOT NULL, token bigint NOT NULL)`)
	require.NoError(t, err)
	proxy, err := testenv.NewProxy(env.Redis.Addr)
	require.NoError(t, err)
	defer proxy.Close()
	store, err := pgfence.New(env.DB.Pool)
	require.NoError(t, err)

	var mu sync.Mutex
	runs := map[string]int{}
	electors := make([]*gocrontick.Elector, 2)
	for i, addr := range []string{proxy.Addr, env.Redis.Addr} {
		name := []string{"a", "b"}[i]
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { _ = rdb.Close() })
		locks, err := fence.New(rdb, fence.WithPrefix(env.Redis.Prefix+"fence:"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = locks.Close(context.Background()) })
		e, err := locks.Election("scheduler", fence.WithLease(500*time.Millisecond), fence.WithLiveness(500*time.Millisecond))
		require.NoError(t, err)
		el, err := gocrontick.NewElector(e, name)
		require.NoError(t, err)
		t.Cleanup(func() { _ = el.Close(context.Background()) })
		electors[i] = el
		if i == 0 { // a campaigns first: it leads
			require.Eventually(t, func() bool { return el.IsLeader(ctx) == nil }, time.Minute, 5*time.Millisecond)
		}
		s, err := gocron.NewScheduler(gocron.WithDistributedElector(el))
		require.NoError(t, err)
		_, err = s.NewJob(gocron.DurationJob(100*time.Millisecond), gocron.NewTask(func() error {
			term := el.Term()
			if term == nil {
				return errors.New("ran without a term")
			}
			_, err := guard.Exec(term.Context(), store, term, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO led_runs VALUES ($1, $2)`, name, term.Token())
				return err
			})
			if err == nil {
				mu.Lock()
				runs[name]++
				mu.Unlock()
			}
			return err
		}))
		require.NoError(t, err)
		s.Start()
		t.Cleanup(func() { _ = s.Shutdown() })
	}
	count := func(name string) int {
		mu.Lock()
		defer mu.Unlock()
		return runs[name]
	}
	require.Eventually(t, func() bool { return count("a") >= 3 }, time.Minute, 10*time.Millisecond, "the leader runs the job")
	require.ErrorIs(t, electors[1].IsLeader(ctx), gocrontick.ErrNotLeader)
	assert.Zero(t, count("b"), "a follower runs nothing")

	oldTerm := electors[0].Term()
	require.NotNil(t, oldTerm)
	proxy.Blackhole() // a's term can no longer be renewed
	require.Eventually(t, func() bool { return count("b") >= 3 }, time.Minute, 10*time.Millisecond, "the next leader runs the job")
	require.ErrorIs(t, electors[0].IsLeader(ctx), gocrontick.ErrNotLeader)
	// The old leader's write with its term, sent anyway, is refused.
	_, err = guard.Exec(ctx, store, guardLease{oldTerm}, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO led_runs VALUES ('a-late', $1)`, oldTerm.Token())
		return err
	})
	require.ErrorIs(t, err, guard.ErrStaleToken)
	var late int
	require.NoError(t, env.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM led_runs WHERE instance = 'a-late'`).Scan(&late))
	assert.Zero(t, late)
	proxy.Restore()
}

// guardLease is a term as a bare lease (no Done channel): only the
// database can refuse its write.
type guardLease struct{ l *fence.Lock }

func (g guardLease) Name() string   { return g.l.Name() }
func (g guardLease) Token() int64   { return g.l.Token() }
func (g guardLease) Holder() string { return g.l.Holder() }

func TestNewElectorRefusesBadInput(t *testing.T) {
	_, err := gocrontick.NewElector(nil, "x")
	require.ErrorIs(t, err, gocrontick.ErrInvalidInput)
}
