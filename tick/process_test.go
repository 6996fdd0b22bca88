package tick_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock/tick"
	"github.com/fencelock/fencelock/tick/ticktest"
	"github.com/stretchr/testify/require"
)

// startInstance starts this test binary as a scheduler instance
// (ticktest.InstanceMain, see TestMain).
func startInstance(t *testing.T, c ticktest.InstanceConfig) *ticktest.Process {
	t.Helper()
	p, err := ticktest.StartInstance(exec.Command(os.Args[0], "-test.run=^$"), c)
	require.NoError(t, err)
	t.Cleanup(p.Kill)
	return p
}

func await(t *testing.T, p *ticktest.Process, prefix string) string {
	t.Helper()
	l, err := p.Await(prefix, time.Minute)
	require.NoError(t, err)
	return l
}

// Four scheduler processes on one schedule, started apart, with clocks
// offset from each other: one is stopped mid-run for longer than its
// lease, one is killed mid-run. Every tick is run exactly once; the two
// interrupted ticks are finished by another instance, resumed at their
// cursors; the stopped instance's late step is refused.
//
// Scaled for make test: a 100 ms period, clocks up to 20 ms apart (the
// period/clock ratio of a 5 s period and a 1 s offset), 200 ticks; the
// chaos suite's scheduler kind runs the long version.
func TestTicksAcrossProcesses(t *testing.T) {
	env := ticktest.NewEnv(t)
	const period, lease, ticks = 100 * time.Millisecond, 300 * time.Millisecond, 200
	every := tick.Every(period)
	base := ticktest.InstanceConfig{RedisURL: env.Redis.URL, Prefix: env.Redis.Prefix + "fence:", DBURL: env.DB.URL,
		Job: "sync", Period: period, Lease: lease, Steps: 3, Guard: true, Wait: 20 * time.Second}
	offsets := []time.Duration{0, 20 * time.Millisecond, -10 * time.Millisecond, 10 * time.Millisecond}
	insts := make([]*ticktest.Process, len(offsets))
	start := time.Now()
	for i, off := range offsets {
		c := base
		c.Name, c.Offset = fmt.Sprintf("i%d", i), off
		if i == 1 {
			// The clock most ahead: it runs most ticks. Stopped mid-run,
			// then killed mid-run.
			c.HangAt = []time.Time{start.Add(5 * time.Second), start.Add(10 * time.Second)}
		}
		insts[i] = startInstance(t, c)
		await(t, insts[i], "ready")
		if i < len(offsets)-1 {
			time.Sleep(600 * time.Millisecond) // started apart: this is the fault, not a wait for an event
		}
	}
	from := every.Next(time.Now().Add(period))
	to := from.Add((ticks - 1) * period)

	stopped := insts[1]
	hung := strings.Fields(await(t, stopped, "hang"))[1]
	require.NoError(t, stopped.Cmd.Process.Signal(syscall.SIGSTOP))
	time.Sleep(3 * lease) // the fault: stopped for longer than its lease
	require.NoError(t, stopped.Cmd.Process.Signal(syscall.SIGCONT))
	require.NoError(t, stopped.Continue())
	refused := await(t, stopped, "error "+hung)

	died := strings.Fields(await(t, stopped, "hang"))[1]
	require.NoError(t, stopped.Cmd.Process.Kill())

	ctx := testCtx(t)
	require.Eventually(t, func() bool {
		c, err := ticktest.Count(ctx, env.DB.Pool, "sync")
		return err == nil && len(c) > 0 && !c[len(c)-1].Tick.Before(to)
	}, 2*time.Minute, 50*time.Millisecond, "the instances did not reach tick %s", tick.Key(to))

	// The newest tick having an effect does not make every tick up to it
	// finished: the instance that runs the last one may be between its
	// first and its last step (a fresh clone's make test beside make chaos
	// read the last tick as missed so, while its instance said it ran).
	// Every tick is given until the instances' wait (20 s) to finish; one
	// without a finished run then is missed.
	var (
		counts []ticktest.TickCount
		sum    ticktest.Tally
	)
	for finish := time.Now().Add(base.Wait); ; time.Sleep(50 * time.Millisecond) {
		var err error
		counts, err = ticktest.Count(ctx, env.DB.Pool, "sync")
		require.NoError(t, err)
		sum = ticktest.Sum(counts, ticktest.Ticks(every, from, to))
		if sum.Missed == 0 || time.Now().After(finish) {
			break
		}
	}
	t.Logf("ticks %d: once %d, duplicated %d, missed %d, resumed %d; stopped at %s, killed at %s", sum.Ticks, sum.Once,
		sum.Duplicated, sum.Missed, sum.Resumed, hung, died)
	if sum.Missed+sum.Duplicated > 0 {
		logHistory(t, insts, append(sum.MissedTicks, sum.DuplicatedTicks...))
	}
	require.Equal(t, ticks, sum.Ticks)
	require.Zero(t, sum.Duplicated, "duplicated ticks %v", sum.DuplicatedTicks)
	require.Zero(t, sum.Missed, "missed ticks %v", sum.MissedTicks)
	require.Equal(t, ticks, sum.Once)
	for _, key := range []string{hung, died} {
		c := countOf(t, counts, key)
		require.Equal(t, ticktest.TickCount{Tick: c.Tick, Runs: 1, Holders: 2}, c,
			"tick %s: finished once, by a second holder that resumed it after step 1", key)
	}
	// The stopped instance's step after it woke is refused: by its lock's
	// loss (guard's fast path) or by the database (a stale token).
	require.True(t, strings.Contains(refused, "guard: lease lost") || strings.Contains(refused, "guard: stale fencing token"),
		"the stopped instance's step after it woke: %s", refused)
}

func countOf(t *testing.T, counts []ticktest.TickCount, key string) ticktest.TickCount {
	t.Helper()
	for _, c := range counts {
		if tick.Key(c.Tick) == key {
			return c
		}
	}
	t.Fatalf("no effect of tick %s", key)
	return ticktest.TickCount{}
}

// logHistory logs what every instance said of the ticks bad.
func logHistory(t *testing.T, insts []*ticktest.Process, bad []time.Time) {
	for i, p := range insts {
		p.Kill()
		for _, l := range p.Lines() {
			for _, b := range bad {
				if strings.Contains(l, tick.Key(b)) {
					t.Logf("instance %d: %s", i, l)
				}
			}
		}
	}
}
