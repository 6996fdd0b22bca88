// Package pgfence is the Postgres (pgx v5) backend of guard: *[Store]
// implements guard.Store[pgx.Tx]. It is a driver over package pgstore, the
// seam it shares with sqlfence: pgstore owns the options, the methods both
// stores have (Advance, Prune, Observers, MapError), resumable runs and the
// schema's rules; pgfence owns what pgx does (its pipelines, prepared
// statements, the pgx.Tx fn gets, [Store.Protect]). The commit queue that
// package outbox writes to travels with that pgx.Tx. So
//
//	store, err := pgfence.New(pool, pgstore.WithLockTimeout(5*time.Second)) // *pgxpool.Pool or *pgx.Conn
//	...
//	_, err = guard.Exec(ctx, store, lock, func(ctx context.Context, tx pgx.Tx) error {
//		_, err := tx.Exec(ctx, "INSERT INTO stock ...")
//		return err
//	}, guard.WithKey("batch-7"))
//
// # The transaction
//
// pgfence owns it. fn gets a pgx.Tx implemented here: its statements go
// straight to the connection, but its Commit and Rollback return
// [guard.ErrTxOwned] and touch nothing, and its Begin makes a savepoint.
// fn returns nil to commit, an error to roll back. If fn ends the
// transaction anyway (a raw COMMIT or ROLLBACK through Exec), the commit
// finds the connection no longer in pgfence's transaction, sends nothing,
// and Exec says the writes may have committed without the fence check
// ([guard.ErrTxEnded]). Once Exec returns, the tx is closed.
//
// It is READ COMMITTED and costs no round trip over the same writes in a
// plain transaction. Each step is one pipeline of bound parameters:
//
//   - begin: fencelock.advance(resource, token, holder), Sync (its own
//     implicit transaction commits there: the token is recorded before fn
//     reads anything, so an older holder that read before it froze cannot
//     commit over what fn reads; a stale token fails, [guard.ErrStaleToken];
//     a Store that has already seen this lease's token stored skips it),
//     then BEGIN and the check, Sync: a plain statement that reads the
//     fence row (and the key and the run, if any) and calls
//     fencelock.open only when something is to refuse. It locks nothing: a
//     stale token, an applied key ([guard.ErrAlreadyApplied]) or a finished
//     run ([guard.ErrRunFinished]) fails there, before fn writes anything,
//     and so does a read-only transaction ([guard.ErrReadOnly]: a read-only
//     database or role default, a hot standby; pgfence never overrides it).
//   - commit: the claim, COMMIT, Sync. For a write without a key or a run
//     the claim is the resource's shared fence lock (a transaction-level
//     advisory lock; a new token is stored only under its exclusive lock)
//     and, in a statement of its own so that it reads what is committed
//     once the lock is held, the stored token checked again; otherwise
//     fencelock.close, which does the same, records the key and moves the
//     run's cursor. Anything to refuse or to store goes to fencelock.close;
//     if it refuses, Postgres skips the COMMIT and the transaction is
//     rolled back. A connection lost once the commit is sent gives
//     [guard.ErrUnknownOutcome].
//
// Because every commit checks its token under the fence lock in the
// committing transaction, committed tokens per resource never decrease in
// commit order. And because the lock is held only while advance or a
// commit runs, a holder frozen in the middle of its transaction (SIGSTOP,
// GC pause, VM freeze) holds up no one: the next holder's [Store.Advance]
// and writes go through, and the frozen one's commit is refused when it
// wakes up. A refused or failed transaction still leaves its token
// recorded, as Advance would. The application role needs no write
// privilege on the fence tables; the migrations let it read them.
//
// One exception: a write to a table protected with [Store.Protect] claims
// right away (its trigger holds the fence lock until the transaction ends),
// so a holder frozen after such a write delays the next holder's claim
// until its transaction ends. [pgstore.WithIdleTimeout] lets the database
// end such a transaction, [pgstore.WithLockTimeout] bounds the wait.
//
// # Poolers
//
// pgfence's own statements are bound parameters, never literals. On a
// connection that goes straight to Postgres they are prepared once per
// connection, under names of their own (fencelock_open_..., visible in
// pg_prepared_statements), and bound by name afterwards: the server
// parses and plans them once, not in every transaction. Behind a pooler
// they go out as
// unnamed statements of the extended protocol (pgx's QueryExecModeExec),
// whatever the pool's default_query_exec_mode, so they work through
// PgBouncer in transaction pooling mode, where a named statement may not
// exist on the server connection the next transaction gets. pgfence tells
// the two apart once per connection: pg_backend_pid() is the process
// id of the connection's cancel key only when nothing sits in between (a
// pooler hands out a key of its own). [WithoutPreparedStatements] keeps
// them unnamed everywhere. A DEALLOCATE ALL in fn fails that transaction
// (nothing is written; the next one prepares again); a DISCARD ALL between
// transactions costs the next one a second try.
//
// fn's statements use the pool's mode: behind a transaction
// pooler use QueryExecModeExec, QueryExecModeCacheDescribe or
// QueryExecModeSimpleProtocol (default_query_exec_mode=exec in the
// connection string), because pgx's default, QueryExecModeCacheStatement,
// prepares named statements on whichever server connection the pooler
// lent, and the next transaction may get another one (26000, 42P05).
//
// # Limits
//
// Resource and holder names and keys are checked before anything is sent
// ([guard.MaxResourceLen], [guard.MaxHolderLen], [guard.MaxKeyLen]: they are btree keys).
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
//   - [MapError] translates the fencelock SQLSTATEs of raw SQL into
//     guard's errors, the same values sqlfence returns.
//
// The fencelock schema must be installed first (package migrations), at
// the version of the last migration: without it every call returns an
// error matching [guard.ErrSchemaMissing], and with an older one
// [guard.ErrSchemaOutdated] (checked once per Store, on its first call);
// either names the database and the command to run. Every error message
// is one line. A connection the pool cannot make (a wrong password, a
// missing database, an unreachable server) is reported with the server's
// answer first, the server, user and database it came from, and the fix;
// errors.As still finds pgx's *pgconn.ConnectError and the server's
// *pgconn.PgError.
package pgfence
