// Package ticktest holds what the tests, the chaos trials and the demo of
// scheduled jobs share: a job whose every step writes an effect row, the
// same job under a lock alone (the guard-off control), and the count of
// committed runs, duplicates and missed ticks read back from the rows.
package ticktest

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/tick"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Schema creates the table of effects: one row per step a job committed.
// No unique constraint: a step applied twice must show as two rows.
const Schema = `CREATE TABLE IF NOT EXISTS tick_effects (
    id       bigserial   PRIMARY KEY,
    job      text        NOT NULL,
    tick     timestamptz NOT NULL,
    step     int         NOT NULL,
    steps    int         NOT NULL,
    token    bigint      NOT NULL,
    instance text        NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
)`

// Job is a job of Steps steps (at least 1): step i is one fenced step of
// the tick's run, with cursor i, that writes one effect row.
type Job struct {
	Instance string
	Steps    int
	// StepDelay is slept before each step (ctx ends it): the time a step's
	// work takes, in which a fault lands mid-run.
	StepDelay time.Duration
	// BeforeStep, when set, is called before each step with its number
	// (from 1): a test pauses, kills or fails the instance there. An
	// error ends the job with it.
	BeforeStep func(ctx context.Context, t *tick.Tick[pgfence.Run], step int) error
}

// Func is the job as a tick.Func: it resumes after the tick's cursor.
func (j Job) Func() tick.Func[pgfence.Run] {
	return func(ctx context.Context, t *tick.Tick[pgfence.Run]) error {
		from := 1
		if t.Cursor != "" {
			n, err := strconv.Atoi(t.Cursor)
			if err != nil {
				return fmt.Errorf("ticktest: cursor %q is not a step number", t.Cursor)
			}
			from = n + 1
		}
		for step := from; step <= j.Steps; step++ {
			if err := j.delay(ctx); err != nil {
				return err
			}
			if j.BeforeStep != nil {
				if err := j.BeforeStep(ctx, t, step); err != nil {
					return err
				}
			}
			err := t.Run.Step(ctx, strconv.Itoa(step), func(ctx context.Context, tx pgx.Tx) error {
				return insert(ctx, tx, t.Job, t.At, step, j.Steps, t.Lock.Token(), j.Instance)
			})
			if err != nil {
				return err
			}
		}
		return nil
	}
}

func insert(ctx context.Context, tx pgx.Tx, job string, at time.Time, step, steps int, token int64, instance string) error {
	_, err := tx.Exec(ctx, `INSERT INTO tick_effects (job, tick, step, steps, token, instance) VALUES ($1, $2, $3, $4, $5, $6)`,
		job, at, step, steps, token, instance)
	return err
}

func (j Job) delay(ctx context.Context) error {
	if j.StepDelay <= 0 {
		return nil
	}
	t := time.NewTimer(j.StepDelay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// LockOnly runs j for the tick at under the job's lock alone, as a
// scheduler's distributed locker does: the lock, then plain transactions,
// no run and no fence check. It is the guard-off control: offset clocks
// and paused holders make it run ticks twice. A lock held elsewhere skips
// the tick (nil error).
func LockOnly(ctx context.Context, locks *fence.Client, pool *pgxpool.Pool, job string, at time.Time, j Job, opts ...fence.LockOption) error {
	lock, err := locks.TryAcquire(ctx, job, opts...)
	if err != nil {
		return nil // held elsewhere: this instance skips the tick
	}
	defer func() { _ = lock.Release(context.WithoutCancel(ctx)) }()
	t := &tick.Tick[pgfence.Run]{Job: job, At: at.UTC(), Key: tick.Key(at), Lock: lock}
	for step := 1; step <= j.Steps; step++ {
		if err := j.delay(ctx); err != nil {
			return err
		}
		if j.BeforeStep != nil {
			if err := j.BeforeStep(ctx, t, step); err != nil {
				return err
			}
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return insert(ctx, tx, job, t.At, step, j.Steps, lock.Token(), j.Instance)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// TickCount is what the effect rows say of one tick.
type TickCount struct {
	Tick time.Time
	// Runs counts the committed runs: rows of the last step.
	Runs int
	// Duplicates counts the rows beyond one per step.
	Duplicates int
	// Holders counts the tokens that wrote its rows (2 or more: resumed
	// by another holder).
	Holders int
}

// Count reads the effect rows of job, per tick, oldest first.
func Count(ctx context.Context, pool *pgxpool.Pool, job string) ([]TickCount, error) {
	rows, err := pool.Query(ctx, `
SELECT tick, count(*) FILTER (WHERE step = steps), count(*) - count(DISTINCT step), count(DISTINCT token)
FROM tick_effects WHERE job = $1 GROUP BY tick ORDER BY tick`, job)
	if err != nil {
		return nil, fmt.Errorf("ticktest: count %q: %w", job, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (TickCount, error) {
		var c TickCount
		err := r.Scan(&c.Tick, &c.Runs, &c.Duplicates, &c.Holders)
		c.Tick = c.Tick.UTC()
		return c, err
	})
}

// Tally sums counts over the ticks of want (the ticks that fell while an
// instance ran): ticks with exactly one run, with more (duplicated), with
// none (missed), duplicated rows, and ticks resumed by another holder.
type Tally struct {
	Ticks, Once, Duplicated, Missed, DuplicateRows, Resumed int
	// MissedTicks and DuplicatedTicks name the first few of each.
	MissedTicks, DuplicatedTicks []time.Time
}

// Sum tallies counts over want.
func Sum(counts []TickCount, want []time.Time) Tally {
	by := make(map[time.Time]TickCount, len(counts))
	for _, c := range counts {
		by[c.Tick] = c
	}
	sort.Slice(want, func(i, j int) bool { return want[i].Before(want[j]) })
	var t Tally
	for _, w := range want {
		c := by[w.UTC()]
		t.Ticks++
		t.DuplicateRows += c.Duplicates
		if c.Holders > 1 {
			t.Resumed++
		}
		switch {
		case c.Runs == 1 && c.Duplicates == 0:
			t.Once++
		case c.Runs == 0:
			t.Missed++
			if len(t.MissedTicks) < 5 {
				t.MissedTicks = append(t.MissedTicks, w)
			}
		default:
			t.Duplicated++
			if len(t.DuplicatedTicks) < 5 {
				t.DuplicatedTicks = append(t.DuplicatedTicks, w)
			}
		}
	}
	return t
}

// Ticks lists the ticks of s in [from, to].
func Ticks(s tick.Schedule, from, to time.Time) []time.Time {
	var out []time.Time
	t := tick.Prev(s, from.Add(-time.Nanosecond))
	if t.IsZero() {
		t = from.Add(-time.Nanosecond)
	}
	for {
		t = s.Next(t)
		if t.IsZero() || t.After(to) {
			return out
		}
		if !t.Before(from) {
			out = append(out, t.UTC())
		}
	}
}
