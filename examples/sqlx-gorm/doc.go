// Package inventory is the stock sync of examples/inventory-sync written
// the way services that use sqlx or GORM write it: through database/sql,
// fenced by sqlfence. It is its own module so that sqlx, GORM and lib/pq
// never enter the library's go.mod.
//
// Both workers write one batch of stock rows per guard.Exec with the
// batch's ID as idempotency key:
//
//   - [SQLXWorker] binds named parameters with sqlx and runs on lib/pq;
//   - [GORMWorker] creates the rows with GORM and runs on pgx's
//     database/sql driver.
//
// Their tests show what the fence does for them: a batch is written once,
// a late holder (its lease expired while it was paused) is refused by the
// database, and a batch whose key was applied is skipped by whoever holds
// the lock next. The tests also run guard's store contract (guardtest) on
// sqlfence over lib/pq.
package inventory
