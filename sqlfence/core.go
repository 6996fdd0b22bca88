package sqlfence

// The driver the Postgres core (package pgstore's options, methods and
// runs) runs its own statements with, and the Store's runs.

import (
	"context"
	"database/sql"
	"errors"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/fencelock/fencelock/pgstore"
)

// Run is a resumable run of a Store (see pgstore.Run); Store.Run makes one.
type Run = pgstore.Run[*sql.Tx]

// Run returns the resumable run runKey of lease's resource; its methods
// report bad input (an empty key, a bad lease).
func (s *Store) Run(lease guard.Lease, runKey string) Run {
	return pgcore.NewRun(&s.core, s.beginOp, lease, runKey)
}

// driver runs the core's statements on db, each on its own.
type driver struct{ db *sql.DB }

func (d driver) Exec(ctx context.Context, q string, args ...any) error {
	_, err := d.db.ExecContext(ctx, q, args...)
	return err
}

func (d driver) QueryRow(ctx context.Context, q string, args []any, dest ...any) (bool, error) {
	err := d.db.QueryRowContext(ctx, q, args...).Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}
