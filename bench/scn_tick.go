package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-redsync/redsync/v4"

	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/tick"
)

// runTick times a tick run of an empty job (tick.Runner.Run, each call a
// new tick) against its floor: the same calls made bare, in the same
// order, on a job of their own: the lock's acquire and release, the
// store's Advance, the two reads of the job's ledger, its two steps (a
// cursor of the ledger's size) and the tick run's Finish. The peer is a
// per-tick lock as gocron's Redis locker takes one: a redsync mutex with
// one try, around the empty job, with no database at all.
func runTick(ctx context.Context, e *env, res *results) error {
	s := res.scenario("tick")
	db, err := e.newPGDB(ctx, false)
	if err != nil {
		return err
	}
	defer db.close(ctx, e)
	store, err := pgfence.New(db.direct)
	if err != nil {
		return err
	}
	runner, err := tick.New(e.fence.c, store)
	if err != nil {
		return err
	}
	every := tick.Every(time.Millisecond)
	next := tick.Prev(every, time.Now().Add(-time.Hour))
	empty := func(context.Context, *tick.Tick[pgfence.Run]) error { return nil }
	f := &tickFloor{e: e, store: store, db: db}
	var rs *redsync.Redsync
	for _, l := range e.libs {
		if r, ok := l.(*redsyncLocker); ok {
			rs = r.rs
		}
	}
	if rs == nil {
		return errors.New("no redsync peer")
	}
	ops := []op{
		{"tick run", func(ctx context.Context) error {
			next = next.Add(time.Millisecond)
			out, err := runner.Run(ctx, "tick-bench", every, next, empty)
			if err == nil && out.Result != tick.Ran {
				err = fmt.Errorf("tick %s: %s, want ran", tick.Key(next), out.Result)
			}
			return err
		}},
		{"floor", f.once},
		{"redsync per-tick lock", func(ctx context.Context) error {
			m := rs.NewMutex("tick-bench-redsync", redsync.WithTries(1))
			if err := m.LockContext(ctx); err != nil {
				return err
			}
			ok, err := m.UnlockContext(ctx)
			if err == nil && !ok {
				err = errors.New("redsync: unlock reported not held")
			}
			return err
		}},
	}
	repMed, pooled, err := interleaved(ctx, e.cfg.Reps, e.cfg.GuardTxDirect, ops)
	if err != nil {
		return err
	}
	for _, o := range ops {
		s.set(o.name, "latency_us", newFigure("µs", repMed[o.name], pooled[o.name]))
	}
	s.Ratios["tick/floor"] = pairedRatio(repMed["tick run"], repMed["floor"])
	s.Ratios["tick/redsync"] = pairedRatio(repMed["tick run"], repMed["redsync per-tick lock"])
	s.Notes = append(s.Notes,
		"tick run = tick.Runner.Run of an empty job, a new tick each call, uncontended: acquire, ledger read, Advance, ledger read, ledger step (started), Finish, ledger step (finished), release. floor = those calls bare, on a job of their own, the ledger's cursor as long as the tick's. redsync per-tick lock = a redsync mutex with one try around the empty job, as gocron's Redis locker runs a tick: no tick identity, no run, no database. Variants interleave in blocks of 50 within each repetition.")
	return nil
}

// tickFloor is the floor of a tick run: its calls bare.
type tickFloor struct {
	e      *env
	store  *pgfence.Store
	db     *pgDB
	n      int
	cursor string // as long as the tick job's ledger
}

func (f *tickFloor) once(ctx context.Context) error {
	if f.cursor == "" {
		var n int
		if err := f.db.direct.QueryRow(ctx, `SELECT coalesce(max(length(cursor)), 64) FROM fencelock.runs WHERE resource = 'tick-bench' AND run_key = $1`,
			tick.LedgerKey).Scan(&n); err != nil {
			return err
		}
		f.cursor = strings.Repeat("x", n)
	}
	lock, err := f.e.fence.c.Acquire(ctx, "tick-bench-floor")
	if err != nil {
		return err
	}
	defer func() { _ = lock.Release(ctx) }()
	led := f.store.Run(lock, "ledger")
	if _, _, err := led.Resume(ctx); err != nil {
		return err
	}
	if err := f.store.Advance(ctx, lock); err != nil {
		return err
	}
	if _, _, err := led.Resume(ctx); err != nil {
		return err
	}
	if err := led.Step(ctx, f.cursor, nil); err != nil {
		return err
	}
	f.n++
	if err := f.store.Run(lock, fmt.Sprintf("run-%d", f.n)).Finish(ctx); err != nil {
		return err
	}
	return led.Step(ctx, f.cursor, nil)
}
