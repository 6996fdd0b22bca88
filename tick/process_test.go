package tick_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/tick"
	"github.com/fencelock/fencelock/tick/ticktest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

const instanceEnv = "TICK_TEST_INSTANCE"

// instanceConf is what a scheduler instance process is told.
type instanceConf struct {
	Name, RedisURL, Prefix, DBURL, Job string
	Period, Offset, Lease              time.Duration
	Steps                              int
	// HangAt: at step 2 of the first tick at or after each that this
	// instance runs, it says "hang <tick>" and waits for a line on stdin
	// (the test stops or kills it there, mid-run, holding the lock).
	HangAt []time.Time
}

func (c instanceConf) env() []string {
	return append(os.Environ(), instanceEnv+"="+c.Name,
		"TICK_TEST_REDIS="+c.RedisURL, "TICK_TEST_PREFIX="+c.Prefix, "TICK_TEST_DB="+c.DBURL, "TICK_TEST_JOB="+c.Job,
		"TICK_TEST_PERIOD="+c.Period.String(), "TICK_TEST_OFFSET="+c.Offset.String(), "TICK_TEST_LEASE="+c.Lease.String(),
		fmt.Sprintf("TICK_TEST_STEPS=%d", c.Steps), "TICK_TEST_HANG="+hangs(c.HangAt))
}

func hangs(ts []time.Time) string {
	var s []string
	for _, t := range ts {
		s = append(s, t.Format(time.RFC3339Nano))
	}
	return strings.Join(s, ",")
}

func readConf() (c instanceConf, err error) {
	g := os.Getenv
	c = instanceConf{Name: g(instanceEnv), RedisURL: g("TICK_TEST_REDIS"), Prefix: g("TICK_TEST_PREFIX"), DBURL: g("TICK_TEST_DB"), Job: g("TICK_TEST_JOB")}
	for k, d := range map[string]*time.Duration{"TICK_TEST_PERIOD": &c.Period, "TICK_TEST_OFFSET": &c.Offset, "TICK_TEST_LEASE": &c.Lease} {
		if *d, err = time.ParseDuration(g(k)); err != nil {
			return c, err
		}
	}
	if _, err = fmt.Sscan(g("TICK_TEST_STEPS"), &c.Steps); err != nil {
		return c, err
	}
	for _, h := range strings.Split(g("TICK_TEST_HANG"), ",") {
		if h == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, h)
		if err != nil {
			return c, err
		}
		c.HangAt = append(c.HangAt, t)
	}
	return c, nil
}

// instanceProcess is one scheduler instance: every tick of its clock
// (offset from the machine's), in a goroutine of its own, it runs the
// ticktest job through a Runner, and says what happened on stdout.
func instanceProcess() {
	c, err := readConf()
	if err != nil {
		fmt.Println("error conf", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	opts, err := redis.ParseURL(c.RedisURL)
	if err != nil {
		fmt.Println("error redis", err)
		os.Exit(2)
	}
	locks, err := fence.New(redis.NewClient(opts), fence.WithPrefix(c.Prefix), fence.WithLiveness(c.Lease))
	if err != nil {
		fmt.Println("error fence", err)
		os.Exit(2)
	}
	pool, err := pgxpool.New(ctx, c.DBURL)
	if err != nil {
		fmt.Println("error db", err)
		os.Exit(2)
	}
	store, _ := pgfence.New(pool)
	clock := func() time.Time { return time.Now().Add(c.Offset) }
	r, err := tick.New(locks, store, tick.WithClock(clock), tick.WithWait(20*time.Second),
		tick.WithLockOptions(fence.WithLease(c.Lease)))
	if err != nil {
		fmt.Println("error tick", err)
		os.Exit(2)
	}
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	var hangMu sync.Mutex
	stdin := bufio.NewReader(os.Stdin)
	job := ticktest.Job{Instance: c.Name, Steps: c.Steps, BeforeStep: func(_ context.Context, t *tick.Tick[*pgfence.Run], step int) error {
		hangMu.Lock()
		defer hangMu.Unlock()
		if step == 2 && len(c.HangAt) > 0 && !t.At.Before(c.HangAt[0]) {
			c.HangAt = c.HangAt[1:]
			say("hang %s", t.Key)
			_, _ = stdin.ReadString('\n')
		}
		return nil
	}}
	say("ready")
	ticktest.Fire(ctx, tick.Every(c.Period), clock, func(ctx context.Context, at time.Time) {
		o, err := r.Run(ctx, c.Job, tick.Every(c.Period), at, job.Func())
		if err != nil {
			say("error %s %v", tick.Key(at), err)
			return
		}
		say("out %s %s", tick.Key(at), strings.ReplaceAll(o.Result.String(), " ", "_"))
	})
}

// instance is a running instance process, its lines on a channel.
type instance struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func startInstance(t *testing.T, c instanceConf) *instance {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = c.env()
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	in := &instance{cmd: cmd, stdin: stdin, lines: make(chan string, 4096)}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	go func() {
		defer close(in.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case in.lines <- sc.Text():
			default: // the test reads only what it waits for
			}
		}
	}()
	return in
}

// await returns the first line of in that starts with prefix.
func (in *instance) await(t *testing.T, prefix string, within time.Duration) string {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case l, ok := <-in.lines:
			require.True(t, ok, "instance exited before saying %q", prefix)
			if strings.HasPrefix(l, "error conf") || strings.HasPrefix(l, "error fence") || strings.HasPrefix(l, "error db") {
				t.Fatalf("instance failed: %s", l)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timeout:
			t.Fatalf("no line %q from the instance within %v", prefix, within)
		}
	}
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
	base := instanceConf{RedisURL: env.Redis.URL, Prefix: env.Redis.Prefix + "fence:", DBURL: env.DB.URL,
		Job: "sync", Period: period, Lease: lease, Steps: 3}
	offsets := []time.Duration{0, 20 * time.Millisecond, -10 * time.Millisecond, 10 * time.Millisecond}
	insts := make([]*instance, len(offsets))
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
		insts[i].await(t, "ready", time.Minute)
		if i < len(offsets)-1 {
			time.Sleep(600 * time.Millisecond) // started apart: this is the fault, not a wait for an event
		}
	}
	from := every.Next(time.Now().Add(period))
	to := from.Add((ticks - 1) * period)

	stopped := insts[1]
	hung := strings.Fields(stopped.await(t, "hang", time.Minute))[1]
	require.NoError(t, stopped.cmd.Process.Signal(syscall.SIGSTOP))
	time.Sleep(3 * lease) // the fault: stopped for longer than its lease
	require.NoError(t, stopped.cmd.Process.Signal(syscall.SIGCONT))
	_, err := io.WriteString(stopped.stdin, "go\n")
	require.NoError(t, err)
	refused := stopped.await(t, "error "+hung, time.Minute)

	died := strings.Fields(stopped.await(t, "hang", time.Minute))[1]
	require.NoError(t, stopped.cmd.Process.Kill())

	ctx := testCtx(t)
	require.Eventually(t, func() bool {
		c, err := ticktest.Count(ctx, env.DB.Pool, "sync")
		return err == nil && len(c) > 0 && !c[len(c)-1].Tick.Before(to)
	}, 2*time.Minute, 50*time.Millisecond, "the instances did not reach tick %s", tick.Key(to))

	counts, err := ticktest.Count(ctx, env.DB.Pool, "sync")
	require.NoError(t, err)
	sum := ticktest.Sum(counts, ticktest.Ticks(every, from, to))
	t.Logf("ticks %d: once %d, duplicated %d, missed %d, resumed %d; stopped at %s, killed at %s", sum.Ticks, sum.Once,
		sum.Duplicated, sum.Missed, sum.Resumed, hung, died)
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
