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
	if os.Getenv(workerEnv) == "1" || os.Getenv(demoEnv) == "1" {
		os.Exit(run(os.Args[1:]))
	}
	testenv.Main(m)
}

// TestPauseScenario runs a shortened "pause" scenario with real worker
// processes, a real SIGSTOP and real servers, and checks the outcome counted
// in the database: without guard the paused worker's late writes duplicate
// rows; with guard they are rejected and every SKU is written exactly once.
func TestPauseScenario(t *testing.T) {
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
	var pause scenario
	for _, sc := range scenarios {
		if sc.name == "pause" {
			pause = sc
		}
	}
	results, err := runDemo(ctx, s, []scenario{pause})
	require.NoError(t, err)
	require.Len(t, results, 2)

	off, on := results[0], results[1]
	require.False(t, off.Guard)
	require.True(t, on.Guard)
	assert.Positive(t, off.Duplicates, "guard off: the paused worker's late writes must duplicate rows")
	assert.True(t, off.Overlap, "guard off: a stale holder's write must have committed")

	assert.Zero(t, on.Duplicates, "guard on: no duplicate rows")
	assert.Equal(t, int64(s.skus), on.Rows, "guard on: every SKU written exactly once")
	assert.Positive(t, on.StaleRejected, "guard on: the paused worker's late write must be rejected")
	assert.False(t, on.Overlap, "guard on: no stale write may commit")
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

var _ io.Writer = testWriter{}
