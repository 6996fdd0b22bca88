package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// workerProc is a worker running as its own OS process.
type workerProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startWorker(ctx context.Context, exe, name string, args []string, ev *eventLog) (*workerProc, error) {
	return startProc(ctx, exe, name, args, workerEnv, ev)
}

// startProc starts exe as a process marked by the variable mode (workerEnv
// or schedulerEnv).
func startProc(_ context.Context, exe, name string, args []string, mode string, ev *eventLog) (*workerProc, error) {
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), mode+"=1")
	// Die with the demo: Ctrl-C or a crash leaves no worker behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker %s: %w", name, err)
	}
	w := &workerProc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		ev.consume(stdout)
		w.err = cmd.Wait()
		close(w.done)
	}()
	return w, nil
}

// wait waits for the worker to exit; a worker that exits with a
// rejection or lock-loss code has done what it should.
func (w *workerProc) wait(ctx context.Context, limit time.Duration) error {
	select {
	case <-w.done:
	case <-ctx.Done():
		w.kill()
		return ctx.Err()
	case <-time.After(limit):
		w.kill()
		return fmt.Errorf("did not finish within %v", limit)
	}
	var ee *exec.ExitError
	if errors.As(w.err, &ee) {
		switch ee.ExitCode() {
		case exitStale, exitLockLost:
			return nil
		}
	}
	return w.err
}

func (w *workerProc) kill() {
	select {
	case <-w.done:
		return
	default:
	}
	_ = w.cmd.Process.Signal(syscall.SIGCONT)
	_ = w.cmd.Process.Kill()
	<-w.done
}

// workerEvent is a line a worker prints on stdout.
type workerEvent struct {
	Worker string `json:"worker"`
	Event  string `json:"event"`
	Chunk  int    `json:"chunk"`
	Token  int64  `json:"token"`
	Detail string `json:"detail"`
}

// eventLog collects worker events for waiting and prints live progress.
type eventLog struct {
	out   io.Writer
	start time.Time

	// quiet are events kept but not printed.
	quiet map[string]bool

	mu     sync.Mutex
	events []workerEvent
	cond   chan struct{} // closed and replaced on every event
}

func newEventLog(out io.Writer, start time.Time) *eventLog {
	return &eventLog{out: out, start: start, cond: make(chan struct{})}
}

func (l *eventLog) consume(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var e workerEvent
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		l.mu.Lock()
		l.events = append(l.events, e)
		close(l.cond)
		l.cond = make(chan struct{})
		l.mu.Unlock()
		l.print(e)
	}
}

func (l *eventLog) print(e workerEvent) {
	if l.quiet[e.Event] {
		return
	}
	at := time.Since(l.start).Seconds()
	if e.Detail != "" && strings.HasPrefix(e.Detail, "20") { // a scheduler's tick
		fmt.Fprintf(l.out, "   %5.2fs  %s  tick %s: %s\n", at, e.Worker, e.Detail, e.Event)
		return
	}
	switch e.Event {
	case "committed":
		fmt.Fprintf(l.out, "   %5.2fs  %s  chunk %d committed\n", at, e.Worker, e.Chunk)
	case "acquired":
		fmt.Fprintf(l.out, "   %5.2fs  %s  acquired the lock, token %d\n", at, e.Worker, e.Token)
	default:
		d := ""
		if e.Detail != "" {
			d = " (" + e.Detail + ")"
		}
		fmt.Fprintf(l.out, "   %5.2fs  %s  %s%s\n", at, e.Worker, e.Event, d)
	}
}

func (l *eventLog) note(who, what string) {
	fmt.Fprintf(l.out, "   %5.2fs  %s  %s\n", time.Since(l.start).Seconds(), who, what)
}

// waitFor waits until worker has reported event (for chunk >= minChunk when
// minChunk >= 0).
// waitUntil waits until worker reports event (true) or until the time
// given has come (false).
func (l *eventLog) waitUntil(ctx context.Context, worker, event string, until time.Time) (bool, error) {
	err := l.waitFor(ctx, worker, event, -1, time.Until(until))
	switch {
	case err == nil:
		return true, nil
	case ctx.Err() != nil:
		return false, ctx.Err()
	}
	return false, nil
}

func (l *eventLog) waitFor(ctx context.Context, worker, event string, minChunk int, limit time.Duration) error {
	deadline := time.After(limit)
	for {
		l.mu.Lock()
		for _, e := range l.events {
			if e.Worker == worker && e.Event == event && (minChunk < 0 || e.Chunk >= minChunk) {
				l.mu.Unlock()
				return nil
			}
		}
		ch := l.cond
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("worker %s did not report %q within %v", worker, event, limit)
		}
	}
}
