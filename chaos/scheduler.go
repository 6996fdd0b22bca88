package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os/exec"
	"time"

	"github.com/fencelock/fencelock/testenv"
	"github.com/fencelock/fencelock/tick"
	"github.com/fencelock/fencelock/tick/ticktest"
)

// SchedulerConfig configures RunScheduler: trials in which several
// scheduler processes, their clocks offset, fire the same schedule and run
// each tick through tick.Runner (guard off: under the job's lock alone),
// while a nemesis stops them mid-run for longer than their lease and kills
// them (a killed instance is started again).
type SchedulerConfig struct {
	// Trials is the number of trials (default 1), numbered from
	// FirstTrial (a trial's number and the seed make its schedule: rerun
	// one alone with Trials 1 and its number).
	Trials     int
	FirstTrial int
	// Seed drives the offsets, the starts, and the faults' timing, kinds
	// and victims.
	Seed int64
	// Instances per trial (default 4).
	Instances int
	// Ticks per trial (default 12), every Period (default 300ms).
	Ticks  int
	Period time.Duration
	// Lease is the job lock's lease (default 300ms): a stop lasts 2 to 4
	// leases.
	Lease time.Duration
	// Wait is the instances' tick.WithWait (default 30 periods): a tick
	// is missed only when no instance could run it for that long.
	Wait time.Duration
	// MaxOffset bounds each instance's clock offset, either way (default
	// Period/5: a 1 s offset on a 5 s period).
	MaxOffset time.Duration
	// Steps per tick's job (default 3), each taking StepDelay (default
	// Period/6: a tick's job runs half its period, so that faults land
	// mid-run).
	Steps     int
	StepDelay time.Duration
	// Faults per trial (default 2): each a SIGSTOP or a SIGKILL.
	Faults int
	// Guard off runs the ticks under the lock alone: the control, which
	// must find duplicates (with a StepDelay shorter than the offsets,
	// the instances whose clocks are behind run each tick again).
	Guard bool
	// Command returns the command an instance runs (SelfCommand), whose
	// main runs ticktest.InstanceMain when ticktest.IsInstance.
	Command func() *exec.Cmd
	// Postgres and Redis, when set, are the servers the trials use
	// (a database and a key prefix of their own each); by default
	// RunScheduler starts its own.
	Postgres *testenv.Postgres
	Redis    *testenv.Redis
	// Out receives one line per trial when Verbose.
	Out     io.Writer
	Verbose bool
}

// SchedulerReport is what the scheduler trials found, counted per tick in
// the database: committed runs (a tick's last step committed), duplicated
// steps, ticks without a run.
type SchedulerReport struct {
	Seed   int64 `json:"seed"`
	Guard  bool  `json:"guard"`
	Trials int   `json:"trials"`
	Ticks  int   `json:"ticks"`
	// Once counts ticks with exactly one committed run and no step twice.
	Once int `json:"once"`
	// Duplicated and Missed must be 0 with guard on.
	Duplicated    int `json:"duplicated"`
	Missed        int `json:"missed"`
	DuplicateRows int `json:"duplicate_rows"`
	// Resumed counts ticks finished by a holder other than the one that
	// started them: a fault that landed mid-run.
	Resumed  int     `json:"resumed"`
	PeriodMS int64   `json:"period_ms"`
	OffsetMS int64   `json:"max_offset_ms"`
	Pauses   int     `json:"pauses"`
	Kills    int     `json:"kills"`
	ElapsedS float64 `json:"elapsed_s"`
	// FirstBad names the first duplicated or missed tick and its trial.
	FirstBad string `json:"first_bad,omitempty"`
}

// Failed reports whether guard-on trials broke the promise: a tick run
// twice, or not at all.
func (r *SchedulerReport) Failed() bool { return r.Guard && (r.Duplicated > 0 || r.Missed > 0) }

func (c *SchedulerConfig) setDefaults() error {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Trials, 1)
	def(&c.Instances, 4)
	def(&c.Ticks, 12)
	def(&c.Steps, 3)
	def(&c.Faults, 2)
	if c.Period <= 0 {
		c.Period = 300 * time.Millisecond
	}
	if c.Lease <= 0 {
		c.Lease = 300 * time.Millisecond
	}
	if c.Wait <= 0 {
		c.Wait = 30 * c.Period
	}
	if c.StepDelay <= 0 {
		c.StepDelay = c.Period / 6
	}
	if c.MaxOffset <= 0 {
		c.MaxOffset = c.Period / 5
	}
	if c.Command == nil {
		return errors.New("chaos: Command is required (re-execute the binary: see SelfCommand)")
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	return nil
}

// RunScheduler runs the scheduler trials on a Redis and a Postgres of
// their own.
func RunScheduler(ctx context.Context, cfg SchedulerConfig) (*SchedulerReport, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	start := time.Now()
	pg, rd := cfg.Postgres, cfg.Redis
	var err error
	if pg == nil {
		if pg, err = testenv.StartPostgres(); err != nil {
			return nil, err
		}
		defer func() { _ = pg.Stop() }()
	}
	if rd == nil {
		if rd, err = testenv.StartRedis(); err != nil {
			return nil, err
		}
		defer func() { _ = rd.Stop() }()
	}
	rep := &SchedulerReport{Seed: cfg.Seed, Guard: cfg.Guard, PeriodMS: cfg.Period.Milliseconds(), OffsetMS: cfg.MaxOffset.Milliseconds()}
	for i := cfg.FirstTrial; i < cfg.FirstTrial+cfg.Trials; i++ {
		st := &schedTrial{cfg: &cfg, n: i, rng: rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(i)+1<<32)), redis: rd}
		t, err := st.run(ctx, pg)
		if err != nil {
			return nil, fmt.Errorf("chaos: scheduler trial %d: %w", i, err)
		}
		rep.add(t, i)
		rep.Pauses += st.pauses
		rep.Kills += st.kills
		if cfg.Verbose {
			fmt.Fprintf(cfg.Out, "scheduler trial %d: %d ticks, once %d, duplicated %d, missed %d, resumed %d; %d pauses, %d kills\n",
				i, t.Ticks, t.Once, t.Duplicated, t.Missed, t.Resumed, st.pauses, st.kills)
		}
	}
	rep.ElapsedS = time.Since(start).Round(100 * time.Millisecond).Seconds()
	return rep, nil
}

func (r *SchedulerReport) add(t ticktest.Tally, trial int) {
	r.Trials++
	r.Ticks += t.Ticks
	r.Once += t.Once
	r.Duplicated += t.Duplicated
	r.Missed += t.Missed
	r.DuplicateRows += t.DuplicateRows
	r.Resumed += t.Resumed
	if r.FirstBad == "" {
		switch {
		case len(t.DuplicatedTicks) > 0:
			r.FirstBad = fmt.Sprintf("trial %d: tick %s duplicated", trial, tick.Key(t.DuplicatedTicks[0]))
		case len(t.MissedTicks) > 0:
			r.FirstBad = fmt.Sprintf("trial %d: tick %s missed", trial, tick.Key(t.MissedTicks[0]))
		}
	}
}
