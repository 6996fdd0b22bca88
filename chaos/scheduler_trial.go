package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/fencelock/fencelock/tick"
	"github.com/fencelock/fencelock/tick/ticktest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// schedTrial is one scheduler trial.
type schedTrial struct {
	cfg   *SchedulerConfig
	n     int
	rng   *rand.Rand
	redis *testenv.Redis
	procs []*ticktest.Process
	confs []ticktest.InstanceConfig
	// all are every process the trial started, killed ones included, and
	// their configurations; faults say what the nemesis did, when.
	all      []*ticktest.Process
	allConfs []ticktest.InstanceConfig
	faults   []string
	// ready says when the instances started first said ready.
	ready  []string
	pauses int
	kills  int
}

func (t *schedTrial) run(ctx context.Context, pg *testenv.Postgres) (ticktest.Tally, error) {
	url, pool, drop, err := trialDB(ctx, pg)
	if err != nil {
		return ticktest.Tally{}, err
	}
	defer drop()
	if _, err := pool.Exec(ctx, ticktest.Schema); err != nil {
		return ticktest.Tally{}, err
	}
	c := t.cfg
	every := tick.Every(c.Period)
	// Far enough ahead for the processes to start, each up to half a
	// period after the one before.
	from := every.Next(time.Now().Add(time.Second + time.Duration(c.Instances)*c.Period/2))
	last := from.Add(time.Duration(c.Ticks-1) * c.Period)
	prefix := fmt.Sprintf("%schaos-sched%d-%d:", t.redis.Prefix, t.cfg.Seed, t.n)
	if err := t.seed(ctx, pool, prefix, from.Add(-c.Period)); err != nil {
		return ticktest.Tally{}, err
	}
	defer func() {
		for _, p := range t.all {
			p.Kill()
		}
	}()
	for i := range c.Instances {
		ic := ticktest.InstanceConfig{Name: fmt.Sprintf("s%d", i), RedisURL: t.redis.URL, Prefix: prefix,
			DBURL: url, Job: "sync", Period: c.Period, Lease: c.Lease, Wait: c.Wait, Steps: c.Steps, StepDelay: c.StepDelay, From: from, Ticks: c.Ticks, Guard: c.Guard,
			Offset: time.Duration(t.rng.Int64N(int64(2*c.MaxOffset+1))) - c.MaxOffset}
		if err := pause(ctx, time.Duration(t.rng.Int64N(int64(c.Period/2)))); err != nil {
			return ticktest.Tally{}, err
		}
		if err := t.start(ic); err != nil {
			return ticktest.Tally{}, err
		}
	}
	if err := t.nemesis(ctx, from, last); err != nil {
		return ticktest.Tally{}, err
	}
	// Every instance exits once its last tick's call returned.
	done := time.NewTimer(time.Until(last) + c.Wait + time.Minute)
	defer done.Stop()
	for _, p := range t.procs {
		select {
		case <-p.Done():
		case <-done.C:
			return ticktest.Tally{}, fmt.Errorf("instance %d did not finish", p.Cmd.Process.Pid)
		case <-ctx.Done():
			return ticktest.Tally{}, ctx.Err()
		}
	}
	counts, err := ticktest.Count(ctx, pool, "sync")
	if err != nil {
		return ticktest.Tally{}, err
	}
	sum := ticktest.Sum(counts, ticktest.Ticks(every, from, last))
	if c.Guard && (sum.Missed > 0 || sum.Duplicated > 0) {
		t.history(append(sum.MissedTicks, sum.DuplicatedTicks...))
	}
	return sum, nil
}

// seed runs the job's tick before the trial's first, at once, so that
// the trial starts from a job that has run before: its ledger's newest
// tick finished. The trial checks the steady state. A job's first tick
// starts its history (tick's doc, "A job's first tick"): had the trial
// begun on an empty ledger, an instance that started late fires its past
// ticks together, and when the call that held the lock for the first of
// them lost it before recording the tick started (a SIGSTOP), a call for
// a later one started the history there and the first tick was
// superseded, by design, and counted missed here.
func (t *schedTrial) seed(ctx context.Context, pool *pgxpool.Pool, prefix string, at time.Time) error {
	locks, err := fence.New(t.redis.Client(), fence.WithPrefix(prefix))
	if err != nil {
		return err
	}
	defer func() { _ = locks.Close(context.WithoutCancel(ctx)) }()
	store, err := pgfence.New(pool)
	if err != nil {
		return err
	}
	r, err := tick.New(locks, store, tick.WithClock(func() time.Time { return at }))
	if err != nil {
		return err
	}
	out, err := r.Run(ctx, "sync", tick.Every(t.cfg.Period), at, func(context.Context, *tick.Tick[pgfence.Run]) error { return nil })
	if err != nil {
		return fmt.Errorf("seeding the job's ledger: %w", err)
	}
	if out.Result != tick.Ran {
		return fmt.Errorf("seeding the job's ledger: tick %s: %v, want ran", tick.Key(at), out.Result)
	}
	return nil
}

// history prints what each instance said of the ticks that broke.
func (t *schedTrial) history(bad []time.Time) {
	var keys []string
	for _, b := range bad {
		keys = append(keys, tick.Key(b))
	}
	fmt.Fprintf(t.cfg.Out, "scheduler trial %d (seed %d): the instances' lines about its bad ticks %s:\n", t.n, t.cfg.Seed, strings.Join(keys, ", "))
	for _, l := range t.ready {
		fmt.Fprintf(t.cfg.Out, "  start: %s\n", l)
	}
	for _, l := range t.faults {
		fmt.Fprintf(t.cfg.Out, "  nemesis: %s\n", l)
	}
	for i, p := range t.all {
		for _, l := range p.Lines() {
			for _, b := range bad {
				if strings.Contains(l, tick.Key(b)) {
					fmt.Fprintf(t.cfg.Out, "  instance %d (%s, offset %v): %s\n", i, t.allConfs[i].Name, t.allConfs[i].Offset, l)
				}
			}
		}
	}
}

func (t *schedTrial) start(ic ticktest.InstanceConfig) error {
	p, err := ticktest.StartInstance(t.cfg.Command(), ic)
	if err != nil {
		return err
	}
	if _, err := p.Await("ready", time.Minute); err != nil {
		p.Kill()
		return err
	}
	t.procs, t.confs = append(t.procs, p), append(t.confs, ic)
	t.all, t.allConfs = append(t.all, p), append(t.allConfs, ic)
	d, rel := time.Since(ic.From).Round(time.Millisecond), "after"
	if d < 0 {
		d, rel = -d, "before"
	}
	t.ready = append(t.ready, fmt.Sprintf("%s %s ready, %v %s the trial's first tick", time.Now().UTC().Format("05.000"), ic.Name, d, rel))
	return nil
}

// nemesis injects the trial's faults at random ticks: a SIGSTOP of 2 to 4
// leases, or a SIGKILL followed by a new instance of the same
// configuration (it fires the ticks still to come). A fault comes two
// steps and a half into its tick by the victim's clock (between its
// job's second and third steps); half the time the victim
// is the instance whose clock is most ahead, which runs most ticks: the
// fault then lands mid-run.
func (t *schedTrial) nemesis(ctx context.Context, from, last time.Time) error {
	c := t.cfg
	n := max(1, int(last.Sub(from)/c.Period)-int(4*c.Lease/c.Period))
	ticks := make([]int, c.Faults)
	for i := range ticks {
		ticks[i] = t.rng.IntN(n)
	}
	slices.Sort(ticks)
	for _, k := range ticks {
		v := t.victim()
		at := from.Add(time.Duration(k)*c.Period - t.confs[v].Offset + 5*c.StepDelay/2)
		if err := pause(ctx, time.Until(at)); err != nil {
			return err
		}
		if t.rng.IntN(2) == 0 {
			hold := time.Duration(2+t.rng.IntN(3)) * c.Lease
			t.faults = append(t.faults, fmt.Sprintf("%s SIGSTOP %s for %v", time.Now().UTC().Format("05.000"), t.confs[v].Name, hold))
			_ = t.procs[v].Cmd.Process.Signal(syscall.SIGSTOP)
			t.pauses++
			if err := pause(ctx, hold); err != nil {
				return err
			}
			_ = t.procs[v].Cmd.Process.Signal(syscall.SIGCONT)
			continue
		}
		t.faults = append(t.faults, fmt.Sprintf("%s SIGKILL %s", time.Now().UTC().Format("05.000"), t.confs[v].Name))
		t.procs[v].Kill()
		t.kills++
		ic := t.confs[v]
		next := tick.Every(c.Period).Next(time.Now().Add(ic.Offset))
		if next.After(last) {
			continue
		}
		ic.Ticks -= int(next.Sub(ic.From) / c.Period)
		ic.From = next
		p, err := ticktest.StartInstance(t.cfg.Command(), ic)
		if err != nil {
			return err
		}
		t.procs[v] = p
		t.all, t.allConfs = append(t.all, p), append(t.allConfs, ic)
	}
	return nil
}

// victim is the instance whose clock is most ahead, or any, at even odds.
func (t *schedTrial) victim() int {
	if t.rng.IntN(2) == 0 {
		return t.rng.IntN(len(t.procs))
	}
	v := 0
	for i, ic := range t.confs {
		if ic.Offset > t.confs[v].Offset {
			v = i
		}
	}
	return v
}
