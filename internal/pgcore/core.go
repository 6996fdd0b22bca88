package pgcore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock/guard"
)

// Driver is what the core needs of a store's database handle: one
// statement run on its own, outside any transaction (it commits on its
// own). Arguments are strings, int64s and nils.
type Driver interface {
	// Exec runs sql and discards its result.
	Exec(ctx context.Context, sql string, args ...any) error
	// QueryRow runs sql and scans its one row into dest; found is false
	// when it returned no row.
	QueryRow(ctx context.Context, sql string, args []any, dest ...any) (found bool, err error)
}

// Core is what a Store is made of besides its driver's transactions.
type Core struct {
	Settings
	// Name is the store's package, the prefix of its messages.
	Name   string
	Driver Driver
	// Claims lets a transaction skip advance when this Store has already
	// seen its claim stored.
	Claims Cache
	// Autocommits reports whether Driver's statements commit on their own
	// (nil: they always do). Only then does Advance record its claim in
	// Claims.
	Autocommits func() bool
	// Target is where Driver's connections go, for the fix of a missing
	// or outdated schema (nil: the server's view, see CheckSchema).
	Target *Target
	// schema remembers that CheckSchema found what the Store needs.
	schema schemaChecked
}

// Observers implements guard.ObservedStore for the Store.
func (c *Core) Observers() []guard.Observer { return c.Settings.Observers }

// Advance is the stores' Advance: fencelock.claim in a transaction of its
// own. A lease that says it is lost, released or closed is refused as
// guard.Exec refuses it (a *guard.LeaseLostError), before anything is
// sent.
func (c *Core) Advance(ctx context.Context, lease guard.Lease) (err error) {
	cl, err := guard.NewClaim(lease)
	if err != nil {
		return err
	}
	if obs := c.advanceObservers(); obs != nil {
		start := time.Now()
		defer func() { reportAdvance(ctx, obs, cl, start, err) }()
	}
	if err := guard.LeaseLost(lease, nil); err != nil {
		return err
	}
	if err := CheckClaim(cl); err != nil {
		return err
	}
	if err := c.CheckSchema(ctx, "advance"); err != nil {
		return err
	}
	if err := c.Driver.Exec(ctx, "SELECT fencelock.claim($1, $2, $3)", cl.Resource, cl.Token, cl.Holder); err != nil {
		err = c.Explain(ctx, c.ConnError("advance", err))
		if lerr := guard.LeaseLost(lease, err); lerr != nil {
			return lerr
		}
		return err
	}
	if c.Autocommits == nil || c.Autocommits() {
		c.Claims.Add(cl.Resource, cl.Token, cl.Holder)
	}
	return nil
}

// advanceObservers are the Store's observers that want Advance events;
// nil for none (then Advance does not read the clock).
func (c *Core) advanceObservers() []guard.AdvanceObserver {
	var out []guard.AdvanceObserver
	for _, o := range c.Settings.Observers {
		if a, ok := o.(guard.AdvanceObserver); ok {
			out = append(out, a)
		}
	}
	return out
}

// reportAdvance hands the outcome of one Advance to obs; bad input is an
// error returned at once, not an event (as for Exec).
func reportAdvance(ctx context.Context, obs []guard.AdvanceObserver, cl guard.Claim, start time.Time, err error) {
	if errors.Is(err, guard.ErrInvalidInput) {
		return
	}
	e := guard.AdvanceEvent{Resource: cl.Resource, Token: cl.Token, Holder: cl.Holder, Duration: time.Since(start), Err: err}
	e.Outcome, e.Reason = guard.Classify(err)
	ctx = context.WithoutCancel(ctx)
	for _, o := range obs {
		o.OnAdvance(ctx, e)
	}
}

// Prune is the stores' Prune.
func (c *Core) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("%w: Prune: negative age %v: pass how old an applied key or a finished run must be to go, e.g. 30*24*time.Hour", guard.ErrInvalidInput, olderThan)
	}
	if err := c.CheckSchema(ctx, "prune"); err != nil {
		return 0, err
	}
	var n int64
	if _, err := c.Driver.QueryRow(ctx, "SELECT fencelock.prune($1 * interval '1 microsecond')", []any{olderThan.Microseconds()}, &n); err != nil {
		return 0, c.Explain(ctx, c.ConnError("prune", err))
	}
	return n, nil
}

// ConnError is ConnError with the Store's name: a failed connection under
// op's err, in one line.
func (c *Core) ConnError(op string, err error) error { return ConnError(c.Name, op, err) }

// MapError is Map, the stores' guard.ErrorMapper (pgstore.Core).
func (c *Core) MapError(err error) error { return Map(err) }

// Explain is Map, except that a write refused as read-only asks the
// server why (one more round trip, on that failure path only), to name the
// setting, and a refusal of a privilege on the fencelock schema reads the
// role, the database and the owner, to name the grant
// (ExplainPermission).
func (c *Core) Explain(ctx context.Context, err error) error {
	switch Code(err) {
	case ReadOnly:
		return c.ExplainReadOnly(ctx)
	case InsufficientPrivilege:
		return c.ExplainPermission(ctx, err)
	}
	return Map(err)
}

// ExplainReadOnly asks the server why it refuses writes and returns
// guard.ErrReadOnly naming the setting.
func (c *Core) ExplainReadOnly(ctx context.Context) error {
	var why string
	if _, err := c.Driver.QueryRow(ctx, "SELECT "+ReadOnlySQL, nil, &why); err != nil {
		why = "transaction"
	}
	return ReadOnlyError(why)
}

// ReadOnlySQL is 'standby', 'default', 'transaction' when the database
// does not accept writes, the empty string when it does: the transaction is read-only (a
// hot standby, or the default), or the default says so while the driver
// began READ WRITE explicitly (lib/pq always does): the database's setting
// is honoured either way.
const ReadOnlySQL = "CASE WHEN pg_catalog.pg_is_in_recovery() THEN 'standby' WHEN pg_catalog.current_setting('default_transaction_read_only') = 'on' THEN 'default' WHEN pg_catalog.current_setting('transaction_read_only') = 'on' THEN 'transaction' ELSE '' END"

// ReadOnlyError says why the database does not accept writes, given what
// ReadOnlySQL returned.
func ReadOnlyError(why string) error {
	switch why {
	case "standby":
		return fmt.Errorf("%w: the server is a hot standby (pg_is_in_recovery() is true): nothing was written; connect to the primary", guard.ErrReadOnly)
	case "default":
		return fmt.Errorf("%w: default_transaction_read_only is on (set for the database, the role or the session): nothing was written; turn it off or connect to a writable database", guard.ErrReadOnly)
	}
	return fmt.Errorf("%w (transaction_read_only is on): nothing was written", guard.ErrReadOnly)
}
