package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/testenv"
)

// TestSchedulerTrials is the short version of make chaos's scheduler
// kind: four instances, clocks offset, stopped and killed mid-run; every
// tick runs exactly once; the guard-off control (the lock alone) runs
// ticks twice.
func TestSchedulerTrials(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pg, err := testenv.SharedPostgres()
	if err != nil {
		t.Fatal(err)
	}
	rd := testenv.NewRedis(t)
	rep, err := RunScheduler(ctx, SchedulerConfig{Trials: 1, Seed: *flagSeed, Ticks: 8, Guard: true, Command: SelfCommand,
		Postgres: pg, Redis: rd})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("guard on: %+v", *rep)
	if rep.Failed() || rep.Once != rep.Ticks || rep.Ticks != 8 {
		t.Errorf("guard on: each tick must run once: %+v", *rep)
	}
	if rep.Pauses+rep.Kills != 2 {
		t.Errorf("the trial did not inject its faults: %+v", *rep)
	}
	// Three control trials: on a loaded machine one trial of four ticks
	// ran each once (the lagging instance's fire came after the tick was
	// due no more), and the control must show a duplicate to prove the
	// checker sees one.
	ctl, err := RunScheduler(ctx, SchedulerConfig{Trials: 3, Seed: *flagSeed, Ticks: 4, Faults: 1, Guard: false, Command: SelfCommand,
		StepDelay: time.Millisecond, // shorter than the clocks' offsets: the case of a lock alone
		Postgres:  pg, Redis: rd})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("guard off: %+v", *ctl)
	if ctl.Duplicated == 0 {
		t.Errorf("the guard-off control found no duplicated tick: the checker proves nothing: %+v", *ctl)
	}
}
