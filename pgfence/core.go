package pgfence

// What the Store takes from the Postgres core it shares with sqlfence:
// its options, methods and runs are package pgstore's; this file adds the
// driver the core runs its own statements with, and the names that moved.

import (
	"context"
	"errors"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/fencelock/fencelock/pgstore"
	"github.com/jackc/pgx/v5"
)

// Run is a resumable run of a Store (see pgstore.Run); Store.Run makes one.
type Run = pgstore.Run[pgx.Tx]

// Run returns the resumable run runKey of lease's resource. Bad input (an
// empty key, a bad lease) is reported by the Run's methods.
func (s *Store) Run(lease guard.Lease, runKey string) Run {
	return pgcore.NewRun(&s.core, s.beginOp, lease, runKey)
}

// Option is pgstore.Option.
//
// Deprecated: use pgstore.Option; this alias goes in v0.3.0.
type Option = pgstore.Option

// WithLockTimeout is pgstore.WithLockTimeout.
//
// Deprecated: use pgstore.WithLockTimeout; this alias goes in v0.3.0.
func WithLockTimeout(d time.Duration) Option { return pgstore.WithLockTimeout(d) }

// WithIdleTimeout is pgstore.WithIdleTimeout.
//
// Deprecated: use pgstore.WithIdleTimeout; this alias goes in v0.3.0.
func WithIdleTimeout(d time.Duration) Option { return pgstore.WithIdleTimeout(d) }

// WithObserver is pgstore.WithObserver.
//
// Deprecated: use pgstore.WithObserver; this alias goes in v0.3.0.
func WithObserver(o guard.Observer) Option { return pgstore.WithObserver(o) }

// driver runs the core's statements on db, each on its own, unnamed
// (they are not on the hot path).
type driver struct{ db DB }

func (d driver) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := d.db.Exec(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...)
	return err
}

func (d driver) QueryRow(ctx context.Context, sql string, args []any, dest ...any) (bool, error) {
	err := d.db.QueryRow(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}
