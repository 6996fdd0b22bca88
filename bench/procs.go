package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fencelock/fencelock/fence"
)

// The cross-process scenarios run their other processes from the bench's
// own binary: started with roleEnv set to a role (JSON), it plays that
// role, talking to the parent in lines on stdin and stdout, and exits.

const roleEnv = "FENCE_BENCH_ROLE"

// role is what a child process does and with what.
type role struct {
	Kind       string        `json:"kind"` // waiter, subscriber, etcdwatch, contender, relay, headkill, leader, observers, subscribers
	Lib        string        `json:"lib,omitempty"`
	Redis      string        `json:"redis,omitempty"`
	Etcd       string        `json:"etcd,omitempty"`
	Postgres   string        `json:"postgres,omitempty"`
	Name       string        `json:"name,omitempty"`
	Holder     string        `json:"holder,omitempty"`
	Goroutines int           `json:"goroutines,omitempty"`
	Hold       time.Duration `json:"hold,omitempty"`
	Liveness   time.Duration `json:"liveness,omitempty"`
	Lease      time.Duration `json:"lease,omitempty"`
	Shared     bool          `json:"shared,omitempty"`
}

// childMain plays the role in the environment, if any, and exits; it
// returns when the process is not a child.
func childMain() {
	spec := os.Getenv(roleEnv)
	if spec == "" {
		return
	}
	var r role
	if err := json.Unmarshal([]byte(spec), &r); err != nil {
		fmt.Printf("error bad role %q: %v\n", spec, err)
		os.Exit(2)
	}
	out := &lineWriter{w: bufio.NewWriter(os.Stdout)}
	in := bufio.NewScanner(os.Stdin)
	var err error
	switch r.Kind {
	case "waiter":
		err = waiterRole(r, in, out)
	case "subscriber":
		err = subscriberRole(r, in, out)
	case "etcdwatch":
		err = etcdWatchRole(r, in, out)
	case "contender":
		err = contenderRole(r, in, out)
	case "relay":
		err = relayRole(r, in, out)
	case "headkill":
		err = headKillRole(r, in, out)
	case "leader":
		err = leaderRole(r, in, out)
	case "observers":
		err = observersRole(r, in, out)
	case "subscribers":
		err = subscribersRole(r, in, out)
	default:
		err = fmt.Errorf("unknown role %q", r.Kind)
	}
	if err != nil {
		out.say("error %s", strings.ReplaceAll(err.Error(), "\n", " "))
		os.Exit(1)
	}
	os.Exit(0)
}

// lineWriter writes whole lines to the parent, one goroutine at a time.
type lineWriter struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (o *lineWriter) say(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprintf(o.w, format+"\n", args...)
	_ = o.w.Flush()
}

// child is a running child process, seen from the parent.
type child struct {
	kind   string
	cmd    *exec.Cmd
	in     io.WriteCloser
	lines  chan string
	stderr *bytes.Buffer
	done   chan struct{}
}

// startChild starts a child playing r and waits for its "ready" line.
func startChild(ctx context.Context, r role) (*child, error) {
	spec, _ := json.Marshal(r)
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), roleEnv+"="+string(spec), "GOMAXPROCS="+strconv.Itoa(runtime.GOMAXPROCS(0)))
	// Killed with the bench; it inherits the bench's CPU affinity.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	c := &child{kind: r.Kind, cmd: cmd, lines: make(chan string, 1024), stderr: &bytes.Buffer{}, done: make(chan struct{})}
	cmd.Stderr = &limitedBuffer{b: c.stderr, max: 8 << 10}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c.in = in
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s process: %w", r.Kind, err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		_ = cmd.Wait()
		close(c.done)
	}()
	if _, err := c.expect(ctx, "ready", 60*time.Second); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

func (c *child) send(format string, args ...any) error {
	if _, err := fmt.Fprintf(c.in, format+"\n", args...); err != nil {
		return fmt.Errorf("%s process: %w%s", c.kind, err, c.errText())
	}
	return nil
}

// next reads the child's next line; an "error" line is its failure.
func (c *child) next(ctx context.Context, limit time.Duration) (string, error) {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case l, ok := <-c.lines:
		if !ok {
			<-c.done
			return "", fmt.Errorf("%s process exited (%v)%s", c.kind, c.cmd.ProcessState, c.errText())
		}
		if rest, ok := strings.CutPrefix(l, "error "); ok {
			return "", fmt.Errorf("%s process: %s", c.kind, rest)
		}
		return l, nil
	case <-t.C:
		return "", fmt.Errorf("%s process: silent for %v%s", c.kind, limit, c.errText())
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// expect reads the next line, which must start with word, and returns the
// rest of it.
func (c *child) expect(ctx context.Context, word string, limit time.Duration) (string, error) {
	l, err := c.next(ctx, limit)
	if err != nil {
		return "", fmt.Errorf("waiting for %q: %w", word, err)
	}
	if l == word {
		return "", nil
	}
	if rest, ok := strings.CutPrefix(l, word+" "); ok {
		return rest, nil
	}
	return "", fmt.Errorf("%s process: said %q, want %q", c.kind, l, word)
}

// expectInt is expect for a line carrying one integer (a time in Unix ns).
func (c *child) expectInt(ctx context.Context, word string, limit time.Duration) (int64, error) {
	s, err := c.expect(ctx, word, limit)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s process: %q after %q: %w", c.kind, s, word, err)
	}
	return n, nil
}

func (c *child) errText() string {
	if s := strings.TrimSpace(c.stderr.String()); s != "" {
		return "; its stderr: " + s
	}
	return ""
}

// stop closes the child's stdin (its cue to close its clients and exit)
// and kills it if it has not exited within 10 s.
func (c *child) stop() {
	_ = c.in.Close()
	go func() {
		for range c.lines { // drain
		}
	}()
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

func stopAll(cs []*child) {
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() { defer wg.Done(); c.stop() }()
	}
	wg.Wait()
}

type limitedBuffer struct {
	mu  sync.Mutex
	b   *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := l.max - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// waitFunc adapts a function to fence's WaitObserver.
type waitFunc func(ctx context.Context)

type fenceWaitObs struct{ f waitFunc }

func (o fenceWaitObs) OnWait(ctx context.Context, _ fence.WaitEvent) { o.f(ctx) }

// openLib makes the role's library, as a process of its own would: its
// own go-redis client and lock client (or etcd client). onWait, when not
// nil, is told when an Acquire starts waiting (only the libraries
// saysWhenWaiting names: etcd's Mutex and the polling peers do not say).
func openLib(r role, onWait waitFunc) (locker, error) {
	switch r.Lib {
	case "fence":
		var opts []fence.ClientOption
		if onWait != nil {
			opts = append(opts, fence.WithObserver(fenceWaitObs{onWait}))
		}
		return newFenceLocker(r.Redis, opts...)
	case "redislock":
		return newRedislockLocker(r.Redis, redislockBackoff, "redislock"), nil
	case "redsync":
		return newRedsyncLocker(r.Redis), nil
	case etcdName:
		return newEtcdLocker(r.Etcd)
	case electionName:
		var opts []fence.ClientOption
		if onWait != nil {
			opts = append(opts, fence.WithObserver(fenceWaitObs{onWait}))
		}
		return newElectionLocker(r.Redis, opts...)
	case etcdElectionName:
		return newEtcdElectionLocker(r.Etcd)
	}
	return nil, fmt.Errorf("no library %q in the cross-process scenarios", r.Lib)
}

// saysWhenWaiting reports a library whose Acquire tells a WaitObserver
// that it starts waiting: the order of grants can be checked against it.
func saysWhenWaiting(lib string) bool {
	return lib == "fence" || lib == electionName
}

// waitForEOF blocks until the parent closes stdin.
func waitForEOF(in *bufio.Scanner) {
	for in.Scan() {
	}
}

// serveCommands hands each of the parent's lines to handle, in order,
// until the parent closes stdin (nil) or handle or the read fails.
func serveCommands(in *bufio.Scanner, handle func(cmd string) error) error {
	for in.Scan() {
		if err := handle(in.Text()); err != nil {
			return err
		}
	}
	return in.Err()
}

// parseInts parses space-separated integers.
func parseInts(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Fields(s) {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}
