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
// It is READ COMMITTED, and it costs no round trip over the same writes
// in a plain transaction:
//
//   - the BEGIN round trip first runs fencelock.advance in a transaction of
//     its own (a stale token fails there, [guard.ErrStaleToken]; a newer
//     one is stored and committed at once, so an older holder that read
//     before it froze cannot commit over what fn reads; a Store that has
//     already seen this lease's token stored skips it), then BEGIN and
//     fencelock.open, which locks nothing: a stale token, an applied key
//     ([guard.ErrAlreadyApplied]) or a finished run ([ErrRunFinished])
//     fails there, before fn writes anything;
//   - the COMMIT round trip runs fencelock.close, then COMMIT: close
//     locks the fence row of the resource, checks the token (stores it if
//     it is not yet), records the key, moves a run's cursor, and the
//     transaction commits only if it was accepted. A refused close rolls
//     everything back.
//
// Because every commit takes the fence row lock and checks its token in
// the committing transaction, committed tokens per resource never decrease
// in commit order. And because the lock is held only while advance or a
// commit runs, a holder frozen in the middle of its transaction (SIGSTOP,
// GC pause, VM freeze) holds up no one: the next holder's [Store.Advance]
// and writes go through, and the frozen one's commit is refused when it
// wakes up. A refused or failed transaction still leaves its token
// recorded, as Advance would.
//
// One exception: a write to a table protected with [Store.Protect] claims
// right away (its trigger locks the fence row until the transaction ends),
// so a holder frozen after such a write delays the next holder's claim
// until its transaction ends. [WithIdleTimeout] lets the database end such
// a transaction, [WithLockTimeout] bounds the wait.
//
// # Also here
//
//   - [Store.Advance] claims right after acquiring, so a paused previous
//     holder is rejected even before the new holder's first write.
//   - [Store.Protect] installs a trigger that fences every writer of a
//     table, raw SQL and other languages included: they call
//     SELECT fencelock.claim(resource, token, holder) first in the same
//     transaction (a writer that only calls fencelock.precheck is fenced
//     too: the trigger claims for it). [ForResource] binds the table to
//     one lock name.
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
