package ticktest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/tick"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// instanceEnv carries an instance process's configuration (JSON).
const instanceEnv = "FENCELOCK_TICKTEST_INSTANCE"

// InstanceConfig is what a scheduler instance process is told.
type InstanceConfig struct {
	Name, RedisURL, Prefix, DBURL, Job string
	// Period is the schedule (tick.Every); Offset the instance's clock
	// offset from the machine's.
	Period, Offset, Lease time.Duration
	Steps                 int
	StepDelay             time.Duration
	// From and Ticks: the ticks it fires (and then exits once each call
	// returned); Ticks 0: every tick from the next one, until SIGTERM.
	From  time.Time
	Ticks int
	// Guard off runs the ticks under the lock alone (LockOnly): the
	// control.
	Guard bool
	// Wait is tick.WithWait's (default: 10 periods).
	Wait time.Duration
	// HangAt: at step 2 of the first tick at or after each that this
	// instance runs, it says "hang <tick>" and waits for a line on stdin
	// (a test stops or kills it there, mid-run, holding the lock).
	HangAt []time.Time
}

// IsInstance reports whether this process was started as an instance
// (StartInstance): its main must then call InstanceMain and exit.
func IsInstance() bool { return os.Getenv(instanceEnv) != "" }

// Command makes cmd an instance process of c.
func (c InstanceConfig) Command(cmd *exec.Cmd) (*exec.Cmd, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	cmd.Env = append(os.Environ(), instanceEnv+"="+string(b))
	return cmd, nil
}

// InstanceMain is a scheduler instance: every tick of its clock, in a
// goroutine of its own, it runs the ticktest job through a tick.Runner
// (or under the lock alone), and says what happened on stdout, one line
// each: "ready", "hang <tick>", "out <tick> <result>", "error <tick> <err>".
func InstanceMain() int {
	var c InstanceConfig
	if err := json.Unmarshal([]byte(os.Getenv(instanceEnv)), &c); err != nil {
		fmt.Println("error conf", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	in, err := newInstance(ctx, c)
	if err != nil {
		fmt.Println("error setup", err)
		return 2
	}
	defer in.close()
	in.say("ready")
	every := tick.Every(c.Period)
	fctx := ctx
	if c.Ticks > 0 {
		var cancel context.CancelFunc
		fctx, cancel = context.WithCancel(ctx)
		defer cancel()
		last := c.From.Add(time.Duration(c.Ticks-1) * c.Period)
		go func() { // stop firing after the last tick
			t := time.NewTimer(last.Sub(in.clock()) + c.Period/2)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			cancel()
		}()
	}
	var wg sync.WaitGroup
	// From c.From even when it is past: an instance that started late
	// (a loaded machine) still calls every tick, late.
	FireFrom(fctx, every, in.clock, c.From, func(_ context.Context, at time.Time) {
		if c.Ticks > 0 && (at.Before(c.From) || at.After(c.From.Add(time.Duration(c.Ticks-1)*c.Period))) {
			return
		}
		wg.Go(func() { in.fire(ctx, every, at) }) // calls outlive the firing loop
	})
	wg.Wait()
	return 0
}

// instance is an instance process's state.
type instance struct {
	c      InstanceConfig
	rdb    *redis.Client
	pool   *pgxpool.Pool
	locks  *fence.Client
	runner *tick.Runner[pgfence.Run, pgx.Tx]
	job    Job
	mu     sync.Mutex // stdout, hangs
	stdin  *bufio.Reader
}

func newInstance(ctx context.Context, c InstanceConfig) (*instance, error) {
	opts, err := redis.ParseURL(c.RedisURL)
	if err != nil {
		return nil, err
	}
	in := &instance{c: c, rdb: redis.NewClient(opts), stdin: bufio.NewReader(os.Stdin)}
	if in.locks, err = fence.New(in.rdb, fence.WithPrefix(c.Prefix), fence.WithLiveness(c.Lease)); err != nil {
		return nil, err
	}
	if in.pool, err = pgxpool.New(ctx, c.DBURL); err != nil {
		return nil, err
	}
	store, err := pgfence.New(in.pool)
	if err != nil {
		return nil, err
	}
	wait := c.Wait
	if wait == 0 {
		wait = 10 * c.Period
	}
	in.runner, err = tick.New(in.locks, store, tick.WithClock(in.clock), tick.WithWait(wait),
		tick.WithLockOptions(fence.WithLease(c.Lease)))
	in.job = Job{Instance: c.Name, Steps: c.Steps, StepDelay: c.StepDelay, BeforeStep: in.hang}
	return in, err
}

func (in *instance) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = in.locks.Close(ctx)
	in.pool.Close()
	_ = in.rdb.Close()
}

func (in *instance) clock() time.Time { return time.Now().Add(in.c.Offset) }

func (in *instance) say(format string, args ...any) {
	in.mu.Lock()
	defer in.mu.Unlock()
	fmt.Printf(format+"\n", args...)
}

// hang stops the job at step 2 of the first tick at or after HangAt[0]
// that this instance runs, until a line comes on stdin.
func (in *instance) hang(_ context.Context, t *tick.Tick[pgfence.Run], step int) error {
	in.mu.Lock()
	if step != 2 || len(in.c.HangAt) == 0 || t.At.Before(in.c.HangAt[0]) {
		in.mu.Unlock()
		return nil
	}
	in.c.HangAt = in.c.HangAt[1:]
	fmt.Printf("hang %s\n", t.Key)
	in.mu.Unlock()
	_, _ = in.stdin.ReadString('\n')
	return nil
}

func (in *instance) fire(ctx context.Context, every tick.Every, at time.Time) {
	if !in.c.Guard {
		if err := LockOnly(ctx, in.locks, in.pool, in.c.Job, at, in.job, fence.WithLease(in.c.Lease)); err != nil {
			in.say("error %s %v", tick.Key(at), err)
			return
		}
		in.say("out %s lock_only", tick.Key(at))
		return
	}
	o, err := in.runner.Run(ctx, in.c.Job, every, at, in.job.Func())
	if err != nil {
		in.say("error %s %v", tick.Key(at), err)
		return
	}
	in.say("out %s %s", tick.Key(at), strings.ReplaceAll(o.Result.String(), " ", "_"))
}

// Process is a running instance process, its lines on a channel.
type Process struct {
	Cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	done  chan struct{}
}

// StartInstance starts cmd (a re-execution of the running binary, whose
// main calls InstanceMain when IsInstance) as an instance of c.
func StartInstance(cmd *exec.Cmd, c InstanceConfig) (*Process, error) {
	cmd, err := c.Command(cmd)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{Cmd: cmd, stdin: stdin, lines: make(chan string, 1<<14), done: make(chan struct{})}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default: // nobody reads that far: drop
			}
		}
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Await returns the first line from p that starts with prefix, or an
// error when p exits or within passes first.
func (p *Process) Await(prefix string, within time.Duration) (string, error) {
	timeout := time.NewTimer(within)
	defer timeout.Stop()
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return "", fmt.Errorf("ticktest: the instance exited before saying %q", prefix)
			}
			if strings.HasPrefix(l, "error conf") || strings.HasPrefix(l, "error setup") {
				return "", fmt.Errorf("ticktest: the instance failed: %s", l)
			}
			if strings.HasPrefix(l, prefix) {
				return l, nil
			}
		case <-timeout.C:
			return "", fmt.Errorf("ticktest: no line %q from the instance within %v", prefix, within)
		}
	}
}

// Lines returns the lines p said that nobody awaited, once p exited.
func (p *Process) Lines() []string {
	<-p.done
	var out []string
	for l := range p.lines {
		out = append(out, l)
	}
	return out
}

// Continue lets a hung instance go on.
func (p *Process) Continue() error {
	_, err := io.WriteString(p.stdin, "go\n")
	return err
}

// Done is closed when the process exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Kill SIGCONTs (a stopped process keeps a SIGKILL pending) and kills p,
// and waits for it.
func (p *Process) Kill() {
	_ = p.Cmd.Process.Signal(syscall.SIGCONT)
	_ = p.Cmd.Process.Kill()
	<-p.done
}
