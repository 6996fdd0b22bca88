package sqlfence

import (
	"context"
	"database/sql"
	"errors"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
)

// Run is a resumable run: a long batch split into steps, each one fenced
// transaction that also advances the run's stored cursor. A new holder
// resumes from the cursor, a finished run is a no-op for every later
// holder, and a stale holder's step is rejected. Create it with Store.Run.
type Run struct {
	s     *Store
	lease guard.Lease
	key   string
}

// Run returns the resumable run runKey of lease's resource. Bad input (an
// empty key, a bad lease) is reported by the Run's methods.
func (s *Store) Run(lease guard.Lease, runKey string) *Run {
	return &Run{s: s, lease: lease, key: runKey}
}

func (r *Run) check() (guard.Claim, error) {
	c, err := guard.NewClaim(r.lease)
	if err != nil {
		return c, err
	}
	if err := pgcore.CheckRunKey(r.key); err != nil {
		return c, err
	}
	return c, checkClaim(c)
}

// Resume reads where the run stands: the cursor of its last committed step
// ("" before the first) and whether it is finished. It does not claim.
func (r *Run) Resume(ctx context.Context) (cursor string, finished bool, err error) {
	c, err := r.check()
	if err != nil {
		return "", false, err
	}
	err = r.s.db.QueryRowContext(ctx, "SELECT cursor, finished FROM fencelock.run_state($1, $2)",
		c.Resource, r.key).Scan(&cursor, &finished)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, mapError(err)
	}
	return cursor, finished, nil
}

// Step runs fn in one fenced transaction (as guard.Exec does) that also
// sets the run's cursor to newCursor. If the run is finished, fn does not
// run and Step returns guard.ErrRunFinished; a stale lease gets a
// *guard.StaleTokenError. fn may be nil to only move the cursor.
func (r *Run) Step(ctx context.Context, newCursor string, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if _, err := r.check(); err != nil {
		return err
	}
	if err := pgcore.CheckCursor(newCursor); err != nil {
		return err
	}
	if fn == nil {
		fn = func(context.Context, *sql.Tx) error { return nil }
	}
	// Checked at begin (a finished run does not run fn), moved at commit
	// with the claim (close refuses a run finished in between).
	_, err := guard.Exec(ctx, runStore{s: r.s, op: runOp{key: r.key, cursor: newCursor}}, r.lease, fn)
	return err
}

// Finish marks the run finished in a fenced transaction: later Steps, by
// any holder, are no-ops (guard.ErrRunFinished). Finishing a finished run is a
// no-op; a stale lease gets a *guard.StaleTokenError.
func (r *Run) Finish(ctx context.Context) error {
	if _, err := r.check(); err != nil {
		return err
	}
	_, err := guard.Exec(ctx, runStore{s: r.s, op: runOp{key: r.key, finish: true}}, r.lease,
		func(context.Context, *sql.Tx) error { return nil })
	return err
}

// runStore is the Store with a run's check at begin and its step or
// finish at commit.
type runStore struct {
	s  *Store
	op runOp
}

var (
	_ guard.Store[*sql.Tx] = runStore{}
	_ guard.ErrorMapper    = runStore{}
)

func (rs runStore) Begin(ctx context.Context, c guard.Claim) (guard.Txn[*sql.Tx], error) {
	t, err := rs.s.begin(ctx, c, rs.op)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// MapError maps fn's errors as the Store does (a protect trigger's
// refusal inside a step comes back typed).
func (rs runStore) MapError(err error) error { return mapError(err) }
