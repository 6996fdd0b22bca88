package pgfence_test

import (
	"context"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/jackc/pgx/v5"
)

// The common failure paths (msgtest.Walk): each message names its cause
// once, with one prefix per layer.
func TestMessagesNameEachCauseOnce(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	s := newStore(t, db.Pool)
	locks, _ := newFence(t)
	msgtest.Walk(t, testCtx(t), locks, msgtest.Target[pgx.Tx]{
		Store:   s,
		Advance: s.Advance,
		Prune:   s.Prune,
		Step: func(ctx context.Context, l guard.Lease, key, cursor string) error {
			return s.Run(l, key).Step(ctx, cursor, nil)
		},
		Write: insertStock("m", 1),
		BadOption: func() error {
			_, err := pgfence.New(db.Pool, pgfence.WithLockTimeout(0))
			return err
		},
	})
}
