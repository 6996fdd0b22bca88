package sqlfence_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/pgstore"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/fencelock/fencelock/testenv"
)

// The common failure paths (msgtest.Walk): each message names its cause
// once, with one prefix per layer.
func TestMessagesNameEachCauseOnce(t *testing.T) {
	_, db := newDB(t)
	mustExec(t, db, "CREATE TABLE stock (sku text, writer text)")
	s := newStore(t, db)
	rds := testenv.NewRedis(t)
	locks, err := fence.New(rds.Client(), fence.WithPrefix(rds.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = locks.Close(ctx)
	})
	tg := msgtest.StoreTarget[*sql.Tx, sqlfence.Run](s)
	tg.Write = insert("m")
	tg.BadOption = func() error {
		_, err := sqlfence.New(db, pgstore.WithLockTimeout(0))
		return err
	}
	msgtest.Walk(t, testCtx(t), locks, tg)
}
