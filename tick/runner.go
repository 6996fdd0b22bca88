package tick

import (
	"context"
	"reflect"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
)

// Run is what a tick run needs of a store's resumable run: pgfence's and
// sqlfence's *Run are ones (Tx is pgx.Tx and *sql.Tx).
type Run[Tx any] interface {
	Resume(ctx context.Context) (cursor string, finished bool, err error)
	Step(ctx context.Context, newCursor string, fn func(ctx context.Context, tx Tx) error) error
	Finish(ctx context.Context) error
}

// Store is what a tick run needs of a Postgres store: *pgfence.Store and
// *sqlfence.Store are ones. Advance claims the fence for a lease (so that a
// paused previous holder can no longer move a run this holder reads); Run
// is the resumable run key of the lease's resource.
type Store[R Run[Tx], Tx any] interface {
	Advance(ctx context.Context, lease guard.Lease) error
	Run(lease guard.Lease, runKey string) R
}

// Func is a job's work for one tick. It returns nil when the tick's work
// is done: Run then finishes the tick's run. ctx ends when Run's ctx does
// or the job's lock is lost; write through t.Run's steps (or guard.Exec
// with t.Lock), so that a holder that lost the lock is refused.
type Func[R any] func(ctx context.Context, t *Tick[R]) error

// Tick is one tick handed to a job's [Func].
type Tick[R any] struct {
	// Job is the job's name; At its tick, the scheduled instant, in UTC.
	Job string
	At  time.Time
	// Key is the tick's run key ([Key] of At).
	Key string
	// Lock is the job's lock, held for this tick: a guard.Lease whose
	// Context ends when it is lost.
	Lock *fence.Lock
	// Run is the store's resumable run keyed by the tick, of the job's
	// resource: commit the work in its steps (Run.Step), each with the
	// cursor to resume from. Run finishes it when Func returns nil.
	Run R
	// Cursor is the cursor of the run's last committed step ("" for a
	// tick that starts); Resumed says a holder before this one started
	// it and died or failed.
	Cursor  string
	Resumed bool
}

// Result is what a Run call did for its tick.
type Result uint8

const (
	// Ran: this call ran the job for the tick and finished the tick's run.
	Ran Result = iota + 1
	// AlreadyDone: the tick was finished before, by [Outcome.Token].
	AlreadyDone
	// HeldElsewhere: another holder kept the job's lock for the whole wait
	// ([WithWait]): it runs this tick, or a tick before it that ran long.
	HeldElsewhere
	// Superseded: a newer tick of the job has started, and this one did
	// not run (or ran and was pruned): it never runs now. A tick that no
	// instance ran is reported missed when the next one starts.
	Superseded
)

var resultNames = [...]string{"", "ran", "already done", "held elsewhere", "superseded"}

func (r Result) String() string {
	if int(r) < len(resultNames) && r != 0 {
		return resultNames[r]
	}
	return "unknown"
}

// Outcome says what a [Runner.Run] call did.
type Outcome struct {
	Result Result
	// Tick is the tick the call was for, in UTC.
	Tick time.Time
	// Token: for Ran, the token of the lock this call held; for
	// AlreadyDone, the token that finished the tick (0 when the ledger no
	// longer remembers it: it keeps the last 32); for HeldElsewhere, the
	// holder's when it could be read.
	Token int64
	// Holder is who held the lock, for HeldElsewhere, when it could be
	// read.
	Holder string
	// Resumed, for Ran: the tick had been started by a holder that died
	// or failed, and this call resumed it at its cursor.
	Resumed bool
	// Earlier are the ticks this call ran before its own, oldest first: a
	// tick left in flight (resumed at its cursor) and ticks still due that
	// no holder had started (see "Ticks in order" in the package
	// documentation).
	Earlier []time.Time
	// Newest, for Superseded: the job's newest tick.
	Newest time.Time
	// Missed counts the ticks this call found missed when its tick
	// started (they are also reported to MissObservers).
	Missed int64
}

// Runner runs scheduled jobs' ticks: one per tick across every instance
// that calls [Runner.Run] with the same locks (Redis) and store (Postgres).
// It is safe for concurrent use.
type Runner[R Run[Tx], Tx any] struct {
	locks *fence.Client
	store Store[R, Tx]
	cfg   config
}

// New returns a Runner that takes jobs' locks from locks and keeps their
// ticks' runs in store (a *pgfence.Store or a *sqlfence.Store); opts are
// the defaults of every Run call.
func New[S Store[R, Tx], R Run[Tx], Tx any](locks *fence.Client, store S, opts ...Option) (*Runner[R, Tx], error) {
	if locks == nil {
		return nil, invalid("New: nil *fence.Client: pass the client whose locks the jobs take")
	}
	if v := reflect.ValueOf(store); !v.IsValid() || (v.Kind() == reflect.Pointer && v.IsNil()) {
		return nil, invalid("New: nil store: pass a *pgfence.Store or a *sqlfence.Store")
	}
	cfg := defaultConfig()
	if err := cfg.applyAll(opts); err != nil {
		return nil, err
	}
	return &Runner[R, Tx]{locks: locks, store: store, cfg: cfg}, nil
}

// call is one Run call once its input is checked.
type call[R Run[Tx], Tx any] struct {
	r     *Runner[R, Tx]
	ctx   context.Context
	job   string
	s     Schedule
	tick  time.Time
	fn    Func[R]
	cfg   config
	start time.Time
	lock  *fence.Lock
	// heldInfo is the lock's state when the wait ended without it.
	heldInfo fence.LockInfo
	waited   time.Duration
}
