// Package pgstore is the seam between guard and the two Postgres stores:
// what pgfence (pgx) and sqlfence (database/sql) do the same way, written
// once. It owns the stores' options ([Option], [WithLockTimeout] and the
// others), the methods every Store has ([Core]: Advance, Prune, Observers,
// MapError) and resumable runs ([Run]); a store package owns only its
// driver: how it begins, checks and commits a guarded transaction on its
// kind of connection, and the transaction type fn gets (pgx.Tx or
// *sql.Tx), known at compile time from guard.Exec to outbox.Add. So
//
//	store, err := pgfence.New(pool, pgstore.WithLockTimeout(5*time.Second), pgstore.WithLogger(logger))
//	...
//	run := store.Run(lock, "stock-sync/2026-12-06") // a pgstore.Run[pgx.Tx]
//
// # What the schema decides
//
// Both stores keep their state in the fencelock schema (package
// migrations) and talk to it through its SQL functions, so they refuse,
// accept and report alike: a stale token, an applied key, a finished run,
// a read-only database are the same guard errors whichever store returned
// them. A database without the schema, or with an older one, fails every
// call with an error matching guard.ErrSchemaMissing that names the
// database and the command that migrates it:
//
//	go run github.com/fencelock/fencelock/cmd/fencectl@latest migrate up --db "$DATABASE_URL"
//
// A role refused a privilege on the schema (SQLSTATE 42501: USAGE on it,
// EXECUTE on its functions, INSERT on the outbox) gets an error matching
// guard.ErrPermission that names the role, what it lacks on which object,
// and the GRANT the schema's owner runs, in which database; the
// migrations' Up, Down and Status say the same of what migrating needs.
//
// # Length limits
//
// guard.MaxResourceLen, guard.MaxHolderLen and guard.MaxKeyLen are what
// these stores can index. The resource is the fence table's primary key,
// and (resource, key) and (resource, run key) are the primary keys of the
// applied keys and of the runs. A Postgres btree entry must fit in a third
// of a page (2,704 bytes on 8 kB pages), so each part is capped at 1 KiB,
// which leaves room for both parts of a key and the tuple's overhead. A
// cursor (guard.MaxCursorLen) is not indexed. The stores check the lengths
// before they send anything.
//
// # Protected tables
//
// pgfence's Protect installs a trigger that refuses a write to a table from
// a transaction that neither checked nor claimed the resource's fence
// (guard.ErrNotClaimed); a claim made that way holds the resource's fence
// lock until the transaction ends, which is what [WithLockTimeout] and
// [WithIdleTimeout] bound (guard.ErrFenceBusy).
package pgstore
