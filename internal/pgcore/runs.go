package pgcore

import (
	"context"

	"github.com/fencelock/fencelock/guard"
)

// RunOp is what a transaction does to a resumable run: nothing (Key ""),
// move its cursor, or finish it.
type RunOp struct {
	Key    string
	Cursor string
	Finish bool
}

// OpenKey is the run key open checks at begin: only a step's (finishing a
// finished run is a no-op, not an error).
func (r RunOp) OpenKey() string {
	if r.Finish {
		return ""
	}
	return r.Key
}

// BeginFunc opens a store's checked transaction for c and op.
type BeginFunc[Tx any] func(ctx context.Context, c guard.Claim, op RunOp) (guard.Txn[Tx], error)

// OpStore is a store whose transactions also do op: a guard.Store with the
// store's error mapping and observers.
type OpStore[Tx any] struct {
	core  *Core
	begin BeginFunc[Tx]
	op    RunOp
}

// NewOpStore is the store of begin with op.
func NewOpStore[Tx any](core *Core, begin BeginFunc[Tx], op RunOp) OpStore[Tx] {
	return OpStore[Tx]{core: core, begin: begin, op: op}
}

var (
	_ guard.Store[any]    = OpStore[any]{}
	_ guard.ErrorMapper   = OpStore[any]{}
	_ guard.ObservedStore = OpStore[any]{}
)

// Begin implements guard.Store.
func (s OpStore[Tx]) Begin(ctx context.Context, c guard.Claim) (guard.Txn[Tx], error) {
	return s.begin(ctx, c, s.op)
}

// MapError implements guard.ErrorMapper: a protect trigger's refusal
// inside fn comes back typed.
func (s OpStore[Tx]) MapError(err error) error { return Map(err) }

// Observers implements guard.ObservedStore.
func (s OpStore[Tx]) Observers() []guard.Observer { return s.core.Observers() }

// Run is the stores' resumable run.
type Run[Tx any] struct {
	core  *Core
	begin BeginFunc[Tx]
	lease guard.Lease
	key   string
}

// NewRun is the run key of lease's resource; bad input is reported by its
// methods.
func NewRun[Tx any](core *Core, begin BeginFunc[Tx], lease guard.Lease, key string) Run[Tx] {
	return Run[Tx]{core: core, begin: begin, lease: lease, key: key}
}

func (r Run[Tx]) check() (guard.Claim, error) {
	c, err := guard.NewClaim(r.lease)
	if err != nil {
		return c, err
	}
	if err := CheckRunKey(r.key); err != nil {
		return c, err
	}
	return c, CheckClaim(c)
}

// Resume reads where the run stands: the cursor of its last committed step
// ("" before the first) and whether it is finished. It does not claim.
func (r Run[Tx]) Resume(ctx context.Context) (cursor string, finished bool, err error) {
	c, err := r.check()
	if err != nil {
		return "", false, err
	}
	if err := r.core.CheckSchema(ctx, "resume"); err != nil {
		return "", false, err
	}
	found, err := r.core.Driver.QueryRow(ctx, "SELECT cursor, finished FROM fencelock.run_state($1, $2)",
		[]any{c.Resource, r.key}, &cursor, &finished)
	if err != nil {
		return "", false, Map(r.core.ConnError("resume", err))
	}
	if !found {
		return "", false, nil
	}
	return cursor, finished, nil
}

// Step runs fn in one fenced transaction that also sets the run's cursor
// to newCursor: checked at begin (a finished run does not run fn), moved
// at commit with the claim (close refuses a run finished in between). A
// nil fn only moves the cursor.
func (r Run[Tx]) Step(ctx context.Context, newCursor string, fn func(ctx context.Context, tx Tx) error) error {
	if _, err := r.check(); err != nil {
		return err
	}
	if err := CheckCursor(newCursor); err != nil {
		return err
	}
	if fn == nil {
		fn = func(context.Context, Tx) error { return nil }
	}
	_, err := guard.Exec(ctx, NewOpStore(r.core, r.begin, RunOp{Key: r.key, Cursor: newCursor}), r.lease, fn)
	return err
}

// Finish marks the run finished in a fenced transaction; finishing a
// finished run is a no-op.
func (r Run[Tx]) Finish(ctx context.Context) error {
	if _, err := r.check(); err != nil {
		return err
	}
	_, err := guard.Exec(ctx, NewOpStore(r.core, r.begin, RunOp{Key: r.key, Finish: true}), r.lease,
		func(context.Context, Tx) error { return nil })
	return err
}
