package pgfence_test

import (
	"testing"

	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/pgstore"
	"github.com/jackc/pgx/v5"
)

// The common failure paths (msgtest.Walk): each message names its cause
// once, with one prefix per layer.
func TestMessagesNameEachCauseOnce(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	s := newStore(t, db.Pool)
	locks, _ := newFence(t)
	tg := msgtest.StoreTarget[pgx.Tx, pgfence.Run](s)
	tg.Write = insertStock("m", 1)
	tg.BadOption = func() error {
		_, err := pgfence.New(db.Pool, pgstore.WithLockTimeout(0))
		return err
	}
	msgtest.Walk(t, testCtx(t), locks, tg)
}
