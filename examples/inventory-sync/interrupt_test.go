package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// demoEnv makes the test binary run the demo itself (see TestMain).
const demoEnv = "INVENTORY_SYNC_TEST_DEMO"

// Ctrl-C in the middle of a scenario stops the demo, its worker processes
// (one of them SIGSTOPped) and its throwaway servers.
func TestDemoCleansUpOnInterrupt(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-scenario", "pause")
	cmd.Env = append(os.Environ(), demoEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	var addrs []string
	frozen := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		once := false
		for sc.Scan() {
			line := sc.Text()
			if i := strings.Index(line, " on 127.0.0.1:"); i >= 0 && (strings.HasPrefix(line, "Redis:") || strings.HasPrefix(line, "Postgres:")) {
				addrs = append(addrs, strings.TrimSpace(line[i+len(" on "):]))
			}
			if !once && strings.Contains(line, "SIGSTOPped mid-transaction") {
				once = true
				close(frozen)
			}
		}
	}()
	select {
	case <-frozen:
	case <-time.After(2 * time.Minute):
		t.Fatal("the demo did not reach the frozen worker")
	}
	require.Len(t, addrs, 2, "the demo names its Redis and Postgres addresses")

	require.NotEmpty(t, workersOf(t, exe), "the worker processes are running before the interrupt")
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the demo did not stop on SIGINT")
	}
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "an interrupted demo exits non-zero: %v", err)
	assert.Equal(t, exitInterrupt, ee.ExitCode())

	for _, a := range addrs {
		c, err := net.DialTimeout("tcp", a, time.Second)
		if err == nil {
			c.Close()
		}
		assert.Error(t, err, "server on %s still accepts connections after the demo stopped", a)
	}
	assert.Empty(t, workersOf(t, exe), "worker processes outlived the demo")
}

// workersOf lists live processes running exe as a demo worker.
func workersOf(t *testing.T, exe string) []string {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var found []string
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 1 && args[0] == exe && strings.Contains(string(b), "-freeze-at-chunk") {
			stat, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "stat"))
			if strings.Contains(string(stat), ") Z ") {
				continue // a zombie is not running
			}
			found = append(found, p)
		}
	}
	return found
}

// -json prints the JSON result and nothing else; its counts come from the
// database (the watchdog scenario: no duplicates either way).
func TestDemoJSONOnly(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-json", "-scenario", "watchdog")
	cmd.Env = append(os.Environ(), demoEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, 1, "only the JSON line:\n%s", out)
	var res struct {
		Scenarios []Result `json:"scenarios"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &res))
	require.Len(t, res.Scenarios, 2)
	for _, r := range res.Scenarios {
		assert.Equal(t, "watchdog", r.Name)
		assert.EqualValues(t, r.Expected, r.Rows, "guard=%v", r.Guard)
		assert.Zero(t, r.Duplicates, "guard=%v", r.Guard)
	}
}
