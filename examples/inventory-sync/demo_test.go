package main

import (
	"context"
	"io"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/testenv"
)

func TestMain(m *testing.M) {
	// The demo re-executes its own binary as a worker; under `go test` that
	// binary is this test binary.
	if os.Getenv(workerEnv) == "1" || os.Getenv(schedulerEnv) == "1" || os.Getenv(demoEnv) == "1" {
		os.Exit(run(os.Args[1:]))
	}
	testenv.Main(m)
}

// runShortScenario runs a shortened scenario with real worker processes,
// real faults and real servers, and returns its guard-off and guard-on
// results, counted in the database.
func runShortScenario(t *testing.T, name string) (off, on Result, skus int) {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	s := demoSettings{
		lease:     time.Second,
		skus:      120,
		chunkSize: 10,
		out:       testWriter{t},
		exe:       exe,
	}
	s.chunkDelay = s.lease * 3 / 2 / 12
	s.faultAfter = 3
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var sc scenario
	for _, c := range scenarios {
		if c.name == name {
			sc = c
		}
	}
	require.Equal(t, name, sc.name)
	results, _, err := runDemo(ctx, s, []scenario{sc})
	require.NoError(t, err)
	require.Len(t, results, 2)
	off, on = results[0], results[1]
	require.False(t, off.Guard)
	require.True(t, on.Guard)
	return off, on, s.skus
}

// The "pause" scenario: without guard the paused worker's late writes
// duplicate rows; with guard they are rejected and every SKU is written
// exactly once.
func TestPauseScenario(t *testing.T) {
	off, on, skus := runShortScenario(t, "pause")
	assert.Positive(t, off.Duplicates, "guard off: the paused worker's late writes must duplicate rows")
	assert.True(t, off.Overlap, "guard off: a stale holder's write must have committed")

	assert.Zero(t, on.Duplicates, "guard on: no duplicate rows")
	assert.Equal(t, int64(skus), on.Rows, "guard on: every SKU written exactly once")
	assert.Positive(t, on.StaleRejected, "guard on: the paused worker's late write must be rejected")
	assert.False(t, on.Overlap, "guard on: no stale write may commit")
	requireEffects(t, off, on)
}

// requireEffects: guard off, the receiver gets pushes from the stale
// holder and chunks pushed twice; guard on, through the outbox, every
// chunk's push exactly once and none from a stale transaction.
func requireEffects(t *testing.T, off, on Result) {
	t.Helper()
	assert.Positive(t, off.EffectsStale+off.EffectsDuplicate, "guard off: stale or duplicate pushes must reach the receiver")
	assert.GreaterOrEqual(t, off.EffectsSent, int64(off.EffectsExpected), "guard off: every chunk pushed at least once")
	assert.Zero(t, on.EffectsStale, "guard on: no push from a stale transaction")
	assert.Zero(t, on.EffectsDuplicate, "guard on: no chunk pushed twice")
	assert.Equal(t, int64(on.EffectsExpected), on.EffectsSent, "guard on: every chunk's push delivered once")
}

// The "precommit" scenario: A freezes after every client-side check, just
// before its COMMIT goes out. Without guard that commit duplicates rows;
// with guard Postgres itself refuses it (stale token).
func TestPrecommitScenario(t *testing.T) {
	off, on, skus := runShortScenario(t, "precommit")
	assert.Positive(t, off.Duplicates, "guard off: the frozen worker's commit must duplicate rows")
	assert.True(t, off.Overlap, "guard off: a stale holder's commit must have gone through")

	assert.Zero(t, on.Duplicates, "guard on: no duplicate rows")
	assert.Equal(t, int64(skus), on.Rows, "guard on: every SKU written exactly once")
	assert.GreaterOrEqual(t, on.RejectedByDB, int64(1), "guard on: Postgres must refuse the frozen worker's commit")
	assert.False(t, on.Overlap, "guard on: no stale write may commit")
	requireEffects(t, off, on)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

var _ io.Writer = testWriter{}

// The scheduled scenario, shortened: guard off, instances whose clocks are
// behind run ticks again; guard on, every tick runs once, and the ticks
// whose runner was killed or stopped mid-run are resumed by another.
func TestScheduledScenario(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	ss := schedSettings{period: time.Second, ticks: 4, lease: 500 * time.Millisecond, chunks: 4}
	s := demoSettings{out: testWriter{t}, exe: exe, sched: &ss}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, sched, err := runDemo(ctx, s, nil)
	require.NoError(t, err)
	require.Len(t, sched, 2)
	off, on := sched[0], sched[1]
	require.False(t, off.Guard)
	// Guard off, the lock alone fails the job both ways: an instance whose
	// clock is behind runs a tick again once the one ahead has released it
	// (when the run is shorter than the offset: not on a loaded machine),
	// and a tick whose holder was killed or stopped is left half-done or
	// its lock held past the next tick, which no one runs then.
	assert.Positive(t, off.Faults, "guard off: no instance was killed or stopped mid-run")
	assert.Positive(t, off.Duplicated+off.Missed, "guard off: no tick ran twice or was missed: %+v", off.PerTick)
	assert.Equal(t, ss.ticks, on.Once, "guard on: every tick runs once: %+v", on.PerTick)
	assert.Zero(t, on.Duplicated+on.Missed+on.DuplicateChunks)
	// Each fault needs its instance to start a tick from the beginning,
	// which a loaded machine may give to the others: at least one comes
	// (the instance most ahead starts the ticks), and each fault's tick is
	// resumed by another instance.
	assert.Positive(t, on.Faults, "guard on: no instance was killed or stopped mid-run")
	assert.GreaterOrEqual(t, on.Resumed, on.Faults, "guard on: the killed and the stopped instance's ticks resumed by another")
}
