// Package pgfence is the Postgres (pgx v5) backend of guard: *[Store]
// implements guard.Store[pgx.Tx], so
//
//	store, err := pgfence.New(pool) // *pgxpool.Pool or *pgx.Conn
//	...
//	_, err = guard.Exec(ctx, store, lock, func(ctx context.Context, tx pgx.Tx) error {
//		_, err := tx.Exec(ctx, "INSERT INTO stock ...")
//		return err
//	}, guard.WithKey("batch-7"))
//
// # The transaction
//
// It is READ COMMITTED. Its BEGIN, the claim and the idempotency key (one
// call of fencelock.claim) travel in one round trip, so a guarded write
// costs no round trip over the same writes in a plain transaction. The
// claim locks only the fence row of the resource, until the transaction
// ends: a later holder's claim waits for it, so committed tokens per
// resource never decrease. A holder frozen in the middle of its
// transaction therefore holds up the next one; [WithIdleTimeout] lets the
// database end such a transaction, [WithLockTimeout] bounds the wait.
//
// # Also here
//
//   - [Store.Advance] claims right after acquiring, so a paused previous
//     holder is rejected even before the new holder's first write.
//   - [Store.Protect] installs a trigger that fences every writer of a
//     table, raw SQL and other languages included: they call
//     SELECT fencelock.claim(resource, token, holder) first in the same
//     transaction. [ForResource] binds the table to one lock name.
//   - [Store.Run]: resumable runs, a long batch in fenced steps with a
//     cursor.
//   - [Store.Prune] deletes old idempotency keys and finished runs.
//   - [MapError] translates the fencelock SQLSTATEs of raw SQL into the
//     errors of guard and this package.
//
// The fencelock schema must be installed first (package migrations);
// without it every call returns [ErrSchemaMissing], which names the
// command to run.
package pgfence
