package crontick_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/fencelock/fencelock/tick"
	"github.com/fencelock/fencelock/tick/crontick"
	"github.com/fencelock/fencelock/tick/ticktest"
	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// outcomes collects the reports of every instance.
type outcomes struct {
	mu   sync.Mutex
	by   map[string][]tick.Result
	errs []error
}

func (o *outcomes) report(_ string, out tick.Outcome, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		o.errs = append(o.errs, err)
		return
	}
	o.by[tick.Key(out.Tick)] = append(o.by[tick.Key(out.Tick)], out.Result)
}

func (o *outcomes) reported(key string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.by[key])
}

// Four robfig schedulers, each with its own fence client, fire the same
// per-second spec; one's Redis is cut in the middle of a tick, so its lock
// is lost and another instance resumes the tick at its cursor. Each tick
// runs once.
func TestCronRunsEachTickOnce(t *testing.T) {
	env := ticktest.NewEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec, err := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow).Parse("* * * * * *")
	require.NoError(t, err)
	rec := &outcomes{by: map[string][]tick.Result{}}
	proxy, err := testenv.NewProxy(env.Redis.Addr)
	require.NoError(t, err)
	defer proxy.Close()

	var cutOnce sync.Once
	cut := make(chan string, 1)
	start := time.Now()
	for i := range 4 {
		addr := env.Redis.Addr
		job := ticktest.Job{Instance: string(rune('a' + i)), Steps: 2}
		if i == 0 { // its Redis is cut at step 2 of a tick a few seconds in
			addr = proxy.Addr
			job.BeforeStep = func(ctx context.Context, tk *tick.Tick[pgfence.Run], step int) error {
				if step == 2 && time.Since(start) > 2*time.Second {
					cutOnce.Do(func() {
						proxy.Blackhole()
						cut <- tk.Key
						<-ctx.Done() // the lock is lost: its ctx ends
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
		r, err := tick.New(locks, store, tick.WithLockOptions(fence.WithLease(300*time.Millisecond)),
			tick.WithWait(5*time.Second))
		require.NoError(t, err)
		c := cron.New()
		_, err = crontick.Add(c, r, "sync", spec, job.Func(), crontick.WithContext(ctx), crontick.WithReport(rec.report))
		require.NoError(t, err)
		c.Start()
		t.Cleanup(func() { <-c.Stop().Done() })
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
	require.Eventually(t, func() bool { return rec.reported(tick.Key(last)) >= 3 }, time.Minute, 20*time.Millisecond,
		"the live instances reported tick %s", tick.Key(last))
	proxy.Restore() // the cut instance's calls end quickly at cleanup
	counts, err := ticktest.Count(ctx, env.DB.Pool, "sync")
	require.NoError(t, err)
	first := counts[0].Tick
	sum := ticktest.Sum(counts, ticktest.Ticks(tick.Every(time.Second), first, last))
	assert.Equal(t, sum.Ticks, sum.Once, "every tick once: %+v", sum)
	for _, c := range counts {
		if c.Tick.Equal(cutAt) {
			assert.Equal(t, ticktest.TickCount{Tick: cutAt, Runs: 1, Holders: 2}, c, "the cut tick resumed by another holder")
		}
	}
}

// A spec with a zone names instants: on the night Paris's clocks go back,
// 02:30 happens twice and both are ticks with keys of their own; on the
// night they go forward, 02:30 does not happen.
func TestZonedSpecNamesInstants(t *testing.T) {
	s, err := cron.ParseStandard("CRON_TZ=Europe/Paris 30 2 * * *")
	require.NoError(t, err)
	var keys []string
	for at := s.Next(time.Date(2025, 10, 25, 12, 0, 0, 0, time.UTC)); len(keys) < 3; at = s.Next(at) {
		keys = append(keys, tick.Key(at))
	}
	assert.Equal(t, []string{"2025-10-26T00:30:00Z", "2025-10-26T01:30:00Z", "2025-10-27T01:30:00Z"}, keys)
	spring := s.Next(time.Date(2025, 3, 29, 12, 0, 0, 0, time.UTC))
	assert.Equal(t, "2025-03-31T00:30:00Z", tick.Key(spring), "no 02:30 on 2025-03-30")
	// An instance in New York that passes the instant in its own zone
	// names the same tick.
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	second := time.Date(2025, 10, 26, 1, 30, 0, 0, time.UTC)
	assert.Equal(t, "2025-10-26T01:30:00Z", tick.Key(second.In(ny)))
	assert.Equal(t, second, tick.Prev(s, second.Add(time.Hour)).UTC(), "Prev over a robfig schedule")
}

func TestAddRefusesBadInput(t *testing.T) {
	env := ticktest.NewEnv(t)
	inst := env.NewInstance(t)
	c := cron.New()
	fn := func(context.Context, *tick.Tick[pgfence.Run]) error { return nil }
	s, err := cron.ParseStandard("*/5 * * * *")
	require.NoError(t, err)
	every, err := cron.ParseStandard("@every 5m")
	require.NoError(t, err)
	for name, err := range map[string]error{
		"empty name": func() error { _, err := crontick.Add(c, inst.Runner, "", s, fn); return err }(),
		"nil sched":  func() error { _, err := crontick.Add(c, inst.Runner, "j", nil, fn); return err }(),
		"nil func":   func() error { _, err := crontick.Add(c, inst.Runner, "j", s, nil); return err }(),
		"@every":     func() error { _, err := crontick.Add(c, inst.Runner, "j", every, fn); return err }(),
		"nil ctx": func() error {
			var nilCtx context.Context // the bad input under test
			_, err := crontick.Add(c, inst.Runner, "j", s, fn, crontick.WithContext(nilCtx))
			return err
		}(),
	} {
		assert.ErrorIs(t, err, crontick.ErrInvalidInput, name)
	}
	assert.Empty(t, c.Entries(), "nothing scheduled")
}
