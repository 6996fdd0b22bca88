package gocrontick_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/fencelock/fencelock/tick"
	"github.com/fencelock/fencelock/tick/gocrontick"
	"github.com/fencelock/fencelock/tick/ticktest"
	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// skips counts the runs gocron skipped because the tick needed no run.
type skips struct {
	mu     sync.Mutex
	notRun map[tick.Result]int
	other  []error
}

func (s *skips) afterLockError(_ uuid.UUID, _ string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var nr *gocrontick.NotRunError
	if errors.As(err, &nr) {
		s.notRun[nr.Outcome.Result]++
		return
	}
	s.other = append(s.other, err)
}

// String is the skipped runs by outcome and the other lock errors, for a
// failure's message: a missed tick is explained by them.
func (s *skips) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("runs not needed by outcome %v; other lock errors %v", s.notRun, s.other)
}

func (s *skips) done() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.notRun[tick.AlreadyDone]
}

// Four gocron schedulers, each with its own fence client, run the same
// job every second (gocrontick.Every: aligned across them); one's Redis is
// cut in the middle of a tick, so its lock is lost and another instance
// resumes the tick at its cursor. Each tick runs once; the others' runs
// are skipped as already done.
func TestGocronRunsEachTickOnce(t *testing.T) {
	env := ticktest.NewEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	proxy, err := testenv.NewProxy(env.Redis.Addr)
	require.NoError(t, err)
	defer proxy.Close()
	def, err := gocrontick.Every(time.Second)
	require.NoError(t, err)
	sk := &skips{notRun: map[tick.Result]int{}}

	var cutOnce sync.Once
	cut := make(chan string, 1)
	start := time.Now()
	for i := range 4 {
		addr := env.Redis.Addr
		job := ticktest.Job{Instance: string(rune('a' + i)), Steps: 2}
		if i == 0 {
			addr = proxy.Addr
			job.BeforeStep = func(ctx context.Context, tk *tick.Tick[pgfence.Run], step int) error {
				if step == 2 && time.Since(start) > 2*time.Second {
					cutOnce.Do(func() {
						proxy.Blackhole()
						cut <- tk.Key
						<-ctx.Done() // the lock is lost: the tick's ctx ends
					})
				}
				return nil
			}
		}
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { _ = rdb.Close() })
		locks, err := fence.New(rdb, fence.WithPrefix(env.Redis.Prefix+"fence:"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = locks.Close(context.Background()) })
		store, err := pgfence.New(env.DB.Pool)
		require.NoError(t, err)
		// gocron schedules a job's next fire only once Lock returned, and
		// skips the instants that passed meanwhile: while an instance
		// waits for the cut tick's lock, it fires nothing, and the ticks
		// it skipped are run first by its next fire's runner if they are
		// still due. They stay due as long as WithWait: 30 periods, so
		// that a tick is missed only when no instance could run it for
		// that long (5 s was met by a loaded machine, once, on the tick
		// after the cut one).
		r, err := tick.New(locks, store, tick.WithLockOptions(fence.WithLease(300*time.Millisecond)), tick.WithWait(30*time.Second))
		require.NoError(t, err)
		l, err := gocrontick.NewLocker(r)
		require.NoError(t, err)
		s, err := gocron.NewScheduler()
		require.NoError(t, err)
		_, err = l.NewJob(s, def, "sync", job.Func(), gocron.WithEventListeners(gocron.AfterLockError(sk.afterLockError)))
		require.NoError(t, err)
		s.Start()
		t.Cleanup(func() { _ = s.Shutdown() })
	}
	var cutKey string
	select {
	case cutKey = <-cut:
	case <-ctx.Done():
		t.Fatal("no tick ran by the instance whose Redis is cut")
	}
	cutAt, err := time.Parse(time.RFC3339Nano, cutKey)
	require.NoError(t, err)
	last := cutAt.Add(3 * time.Second)
	require.Eventually(t, func() bool {
		c, err := ticktest.Count(ctx, env.DB.Pool, "sync")
		return err == nil && len(c) > 0 && !c[len(c)-1].Tick.Before(last)
	}, time.Minute, 20*time.Millisecond, "tick %s ran", tick.Key(last))
	// A tick before last may still be running late: an instance that
	// waited for the cut tick's lock runs the ticks it skipped at its next
	// fire, while they stay due (WithWait, 30 s). Wait that long for every
	// tick up to last to have run (a fresh clone's make test read one as
	// missed the moment last had run); a tick still without a run then is
	// missed.
	tally := func() ([]ticktest.TickCount, ticktest.Tally, error) {
		counts, err := ticktest.Count(ctx, env.DB.Pool, "sync")
		if err != nil || len(counts) == 0 {
			return counts, ticktest.Tally{}, fmt.Errorf("no tick counted: %v", err)
		}
		return counts, ticktest.Sum(counts, ticktest.Ticks(tick.Every(time.Second), counts[0].Tick, last)), nil
	}
	assert.Eventually(t, func() bool {
		_, sum, err := tally()
		return err == nil && sum.Missed == 0
	}, 35*time.Second, 50*time.Millisecond, "every tick up to %s ran", tick.Key(last))
	proxy.Restore()
	counts, sum, err := tally()
	require.NoError(t, err)
	assert.Equal(t, sum.Ticks, sum.Once, "every tick once: %+v; %s", sum, sk)
	for _, c := range counts {
		if c.Tick.Equal(cutAt) {
			assert.Equal(t, ticktest.TickCount{Tick: cutAt, Runs: 1, Holders: 2}, c, "the cut tick resumed by another holder")
		}
	}
	assert.Positive(t, sk.done(), "the other instances' runs are skipped as already done")
}

func TestBadInput(t *testing.T) {
	env := ticktest.NewEnv(t)
	inst := env.NewInstance(t)
	l, err := gocrontick.NewLocker(inst.Runner)
	require.NoError(t, err)
	s, err := gocron.NewScheduler()
	require.NoError(t, err)
	defer s.Shutdown()
	fn := func(context.Context, *tick.Tick[pgfence.Run]) error { return nil }
	def, err := gocrontick.Cron("*/5 * * * *", false)
	require.NoError(t, err)
	_, err = gocrontick.Cron("@every 5m", false)
	assert.ErrorIs(t, err, gocrontick.ErrInvalidInput)
	_, err = gocrontick.Cron("not a spec", false)
	assert.ErrorIs(t, err, gocrontick.ErrInvalidInput)
	_, err = gocrontick.Every(0)
	assert.ErrorIs(t, err, gocrontick.ErrInvalidInput)
	_, err = l.NewJob(s, def, "", fn)
	assert.ErrorIs(t, err, gocrontick.ErrInvalidInput)
	_, err = l.NewJob(s, gocrontick.Definition{}, "j", fn)
	assert.ErrorIs(t, err, gocrontick.ErrInvalidInput)
	_, err = l.NewJob(s, def, "j", nil)
	assert.ErrorIs(t, err, gocrontick.ErrInvalidInput)
	_, err = l.NewJob(s, def, "j", fn)
	require.NoError(t, err)
	_, err = l.NewJob(s, def, "j", fn)
	assert.ErrorIs(t, err, gocrontick.ErrInvalidInput, "a second job of the same name")
	assert.Len(t, s.Jobs(), 1)
	_, err = l.Lock(context.Background(), "other")
	assert.ErrorIs(t, err, gocrontick.ErrUnknownJob)
	_, err = gocrontick.NewLocker[pgfence.Run](nil)
	assert.ErrorIs(t, err, gocrontick.ErrInvalidInput)
}
