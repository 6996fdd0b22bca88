package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/pgstore"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type execRecorder struct {
	mu  sync.Mutex
	evs []guard.ExecEvent
}

func (r *execRecorder) OnExec(_ context.Context, e guard.ExecEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, e)
}

func (r *execRecorder) last(t *testing.T) guard.ExecEvent {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	require.NotEmpty(t, r.evs, "no event reached the store's observer")
	return r.evs[len(r.evs)-1]
}

// An observer set once on the Store hears every Exec and every run step
// through it, with the outcome and reason of real refusals by the database.
func TestStoreObserver(t *testing.T) {
	ctx := testCtx(t)
	_, db := newDB(t)
	mustExec(t, db, "CREATE TABLE stock (sku text, writer text)")
	rec := &execRecorder{}
	s := newStore(t, db, pgstore.WithObserver(rec))

	_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 5, Who: "h"}, insert("a"), guard.WithKey("k1"))
	require.NoError(t, err)
	e := rec.last(t)
	assert.Equal(t, guard.Committed, e.Outcome)
	assert.Equal(t, "r", e.Resource)
	assert.Equal(t, int64(5), e.Token)
	assert.Equal(t, "k1", e.Key)

	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 6, Who: "h"}, insert("b"), guard.WithKey("k1"))
	require.ErrorIs(t, err, guard.ErrAlreadyApplied)
	e = rec.last(t)
	assert.Equal(t, guard.Rejected, e.Outcome)
	assert.Equal(t, guard.ReasonAlreadyApplied, e.Reason)

	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 4, Who: "old"}, insert("c"))
	require.ErrorIs(t, err, guard.ErrStaleToken)
	e = rec.last(t)
	assert.Equal(t, guard.Rejected, e.Outcome)
	assert.Equal(t, guard.ReasonStaleToken, e.Reason)

	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 6, Who: "h"}, func(context.Context, *sql.Tx) error { return errors.New("boom") })
	require.Error(t, err)
	assert.Equal(t, guard.Failed, rec.last(t).Outcome)

	run := s.Run(guardtest.Lease{Resource: "run", Tok: 1, Who: "h"}, "batch-1")
	require.NoError(t, run.Step(ctx, "1", insert("run")))
	assert.Equal(t, guard.Committed, rec.last(t).Outcome, "a run's step reports to the store's observer")
	require.NoError(t, run.Finish(ctx))
	err = run.Step(ctx, "2", insert("run"))
	require.ErrorIs(t, err, guard.ErrRunFinished)
	e = rec.last(t)
	assert.Equal(t, guard.Rejected, e.Outcome)
	assert.Equal(t, guard.ReasonRunFinished, e.Reason, "a finished run is named as such, not as an applied key")
	assert.Equal(t, int64(2), count(t, db, "SELECT count(*) FROM stock"), "only the committed writes are there")
}

func TestWithObserverValidates(t *testing.T) {
	_, db := newDB(t)
	_, err := sqlfence.New(db, pgstore.WithObserver(nil))
	require.ErrorIs(t, err, guard.ErrInvalidOption)
	_, err = sqlfence.New(db, pgstore.WithObserver(struct{}{}))
	require.ErrorIs(t, err, guard.ErrInvalidOption)
}

type advanceRecorder struct {
	mu  sync.Mutex
	evs []guard.AdvanceEvent
}

func (r *advanceRecorder) OnAdvance(_ context.Context, e guard.AdvanceEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, e)
}

// An observer of Advance alone is accepted, and hears each Advance that got
// past input validation: recorded, refused as stale.
func TestStoreAdvanceObserver(t *testing.T) {
	ctx := testCtx(t)
	_, db := newDB(t)
	rec := &advanceRecorder{}
	s := newStore(t, db, pgstore.WithObserver(rec))

	require.NoError(t, s.Advance(ctx, guardtest.Lease{Resource: "r", Tok: 5, Who: "h"}))
	require.ErrorIs(t, s.Advance(ctx, guardtest.Lease{Resource: "r", Tok: 4, Who: "old"}), guard.ErrStaleToken)
	require.ErrorIs(t, s.Advance(ctx, guardtest.Lease{Resource: "", Tok: 6, Who: "h"}), guard.ErrInvalidLease)
	require.ErrorIs(t, s.Advance(ctx, guardtest.Lease{Resource: strings.Repeat("x", guard.MaxResourceLen+1), Tok: 6, Who: "h"}), guard.ErrInvalidInput)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Len(t, rec.evs, 2, "bad input is an error, not an event")
	assert.Equal(t, guard.Committed, rec.evs[0].Outcome)
	assert.Equal(t, "r", rec.evs[0].Resource)
	assert.Equal(t, int64(5), rec.evs[0].Token)
	assert.Positive(t, rec.evs[0].Duration)
	assert.NoError(t, rec.evs[0].Err)
	assert.Equal(t, guard.Rejected, rec.evs[1].Outcome)
	assert.Equal(t, guard.ReasonStaleToken, rec.evs[1].Reason)
	assert.ErrorIs(t, rec.evs[1].Err, guard.ErrStaleToken)
}
