// Package pgfence is the Postgres (pgx v5) backend of guard: *[Store]
// implements guard.Store[pgx.Tx], so
//
//	store, err := pgfence.New(pool)
//	...
//	_, err = guard.Exec(ctx, store, lock, func(ctx context.Context, tx pgx.Tx) error {
//		_, err := tx.Exec(ctx, "INSERT INTO stock ...")
//		return err
//	}, guard.WithKey("batch-7"))
//
// The transaction is READ COMMITTED. Its BEGIN, the claim
// and the idempotency key (both in one call of fencelock.claim) travel
// in one round trip, so a guarded write costs no round trip over the same
// writes in a plain transaction. The claim locks only the fence row of the
// resource, until the transaction ends.
//
// Also here: [Store.Advance] (claim right after acquiring, so a paused
// previous holder is rejected even before the first write),
// [Store.Protect] (a trigger that fences every writer of a table, raw SQL
// included), resumable runs ([Store.Run]) and [Store.Prune].
//
// The fencelock schema must be installed first (package migrations);
// without it every call returns [ErrSchemaMissing], which names the
// command to run.
package pgfence
