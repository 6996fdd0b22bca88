package tick_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/tick"
	"github.com/fencelock/fencelock/tick/ticktest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stuck is a schedule whose Next does not move forward.
type stuck struct{}

func (stuck) Next(t time.Time) time.Time { return t }

func TestBadInputTakesNothing(t *testing.T) {
	env := ticktest.NewEnv(t)
	ctx := testCtx(t)
	a := env.NewInstance(t)
	at := past()
	ran := false
	fn := func(context.Context, *tick.Tick[pgfence.Run]) error { ran = true; return nil }
	cases := []struct {
		name string
		job  string
		s    tick.Schedule
		at   time.Time
		fn   tick.Func[pgfence.Run]
		opts []tick.Option
		want error
		says string
	}{
		{"empty job name", "", minute, at, fn, nil, tick.ErrInvalidInput, "empty job name"},
		{"nil schedule", "j", nil, at, fn, nil, tick.ErrInvalidInput, "nil schedule"},
		{"zero period", "j", tick.Every(0), at, fn, nil, tick.ErrInvalidInput, "tick.Every(0s)"},
		{"nil func", "j", minute, at, nil, nil, tick.ErrInvalidInput, "nil func"},
		{"zero tick", "j", minute, time.Time{}, fn, nil, tick.ErrInvalidInput, "zero instant"},
		{"far from a tick", "j", minute, at.Add(20 * time.Second), fn, nil, tick.ErrInvalidInput,
			"is 20s from the nearest tick of the schedule (" + tick.Key(at) + "), more than the tolerance 1s"},
		{"in the future", "j", minute, tick.Prev(minute, time.Now()).Add(time.Hour), fn, nil, tick.ErrInvalidInput, "in the future of this instance's clock"},
		{"tolerance above the period", "j", minute, at, fn, []tick.Option{tick.WithTolerance(2 * time.Minute)}, tick.ErrInvalidOption,
			"WithTolerance(2m0s) is not less than half the gap 1m0s"},
		{"tolerance of half the period", "j", minute, at, fn, []tick.Option{tick.WithTolerance(30 * time.Second)}, tick.ErrInvalidOption, "pass a tolerance below 30s"},
		{"negative tolerance", "j", minute, at, fn, []tick.Option{tick.WithTolerance(-time.Second)}, tick.ErrInvalidOption, "must be positive"},
		{"zero wait", "j", minute, at, fn, []tick.Option{tick.WithWait(0)}, tick.ErrInvalidOption, "WithWait(0s)"},
		{"nil option", "j", minute, at, fn, []tick.Option{nil}, tick.ErrInvalidOption, "nil Option"},
		{"observer of nothing", "j", minute, at, fn, []tick.Option{tick.WithObserver(42)}, tick.ErrInvalidOption, "implements neither"},
		{"nil clock", "j", minute, at, fn, []tick.Option{tick.WithClock(nil)}, tick.ErrInvalidOption, "WithClock(nil)"},
		{"schedule stuck", "j", stuck{}, at, fn, nil, tick.ErrInvalidSchedule, "not a later instant"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := a.Runner.Run(ctx, c.job, c.s, c.at, c.fn, c.opts...)
			require.ErrorIs(t, err, c.want)
			assert.Contains(t, err.Error(), c.says)
			assert.Equal(t, 1, strings.Count(err.Error(), "tick: "), "one prefix: %v", err)
			assert.NotContains(t, err.Error(), "\n")
		})
	}
	assert.False(t, ran)
	keys, err := env.Redis.Client().Keys(ctx, env.Redis.Prefix+"*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys, "no lock was taken")
	var runs int
	require.NoError(t, env.DB.Pool.QueryRow(ctx, "SELECT count(*) FROM fencelock.runs").Scan(&runs))
	assert.Zero(t, runs, "nothing was written")

	_, err = tick.New[*pgfence.Store](nil, a.Store)
	require.ErrorIs(t, err, tick.ErrInvalidInput)
	_, err = tick.New(a.Locks, (*pgfence.Store)(nil))
	require.ErrorIs(t, err, tick.ErrInvalidInput)
}

// An instant within the tolerance either way names the nearest tick.
func TestFiringTimeWithinToleranceNamesTheTick(t *testing.T) {
	env := ticktest.NewEnv(t)
	ctx := testCtx(t)
	at := past()
	a := env.NewInstance(t)
	for _, d := range []time.Duration{-1500 * time.Millisecond, 0, 1900 * time.Millisecond} {
		var got time.Time
		out, err := a.Runner.Run(ctx, "sync", minute, at.Add(d), func(_ context.Context, tk *tick.Tick[pgfence.Run]) error {
			got = tk.At
			return nil
		}, tick.WithTolerance(2*time.Second))
		require.NoError(t, err, "offset %v", d)
		assert.True(t, out.Tick.Equal(at), "offset %v: tick %s, want %s", d, out.Tick, at)
		if d == -1500*time.Millisecond {
			assert.Equal(t, tick.Ran, out.Result)
			assert.Equal(t, time.UTC, got.Location())
			assert.True(t, got.Equal(at))
		} else {
			assert.Equal(t, tick.AlreadyDone, out.Result, "offset %v", d)
		}
	}
}
