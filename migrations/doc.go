// Package migrations holds the goose SQL migrations that install the
// fencelock schema into a target database, embedded ([FS]), and thin
// [Up], [Down] and [Status] helpers built on goose's Provider with
// Postgres's session advisory lock (two processes migrating at once take
// turns).
//
// The same files apply with the goose CLI:
//
//	goose -dir migrations -table fencelock_db_version postgres "$DATABASE_URL" up
//
// goose records fencelock's versions in its own table, [VersionTable], so
// they never mix with the application's goose migrations. The schema says
// which migration it implements: fencelock.schema_version(), redefined by
// every migration and restored by its Down. A schema installed without
// -table (recorded in goose_db_version) is therefore reported installed
// by [Status] and adopted by [Up] when its version is one of these
// migrations; otherwise both return [ErrUnrecorded] with the reason and
// the fix. [Down] refuses while tables protected by pgfence's Protect
// still have their trigger ([ProtectedError]) unless given [Force].
//
// Messages go to a *slog.Logger ([WithLogger], slog.Default() otherwise):
// an adoption at Info, goose's own messages at Debug.
//
// # Schema
//
// Everything lives in the Postgres schema "fencelock": 00001 creates the
// tables (fence: newest token per resource; applied: idempotency keys;
// runs: resumable runs) and schema_version, 00002 the functions (CREATE
// OR REPLACE). Every table and function carries a COMMENT (\d+ and \df+
// in psql).
//
// The functions that callers use are SECURITY DEFINER with a pinned
// search_path and are not executable by PUBLIC, so an application role
// needs exactly
//
//	GRANT USAGE ON SCHEMA fencelock TO app;
//	GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO app;
//
// and no privilege on the tables (it cannot lower a token by hand).
// Grant EXECUTE again after a migration that adds a function.
//
// # SQL API
//
// For writers that do not use Go's guard.Exec (other languages, raw SQL).
// resource is the lock name, token the fencing token of the lock (> 0),
// holder the holder id of the lock; empty strings and token <= 0 raise
// 22023.
//
//   - fencelock.claim(resource text, token bigint, holder text [, key text]) → bigint:
//     call it first in the transaction that writes. It stores token if it
//     is newer than the stored one and accepts it if it is the stored one
//     with the same holder; otherwise FL001. It locks the fence row until
//     the transaction ends, so commits of one resource happen in token
//     order. With key it also records that idempotency key (FL003 if it
//     was applied before, by anyone). Returns the previously stored token
//     (0 for a new resource). Writes to a table protected by pgfence's
//     Protect are accepted only after it (FL002 otherwise).
//   - fencelock.precheck(resource, token, holder [, key]) → bigint: the
//     same checks without a lock or a write (FL001, FL003), for a writer
//     that wants to fail before doing work. The claim still has to happen:
//     call claim before COMMIT, or write to a protected table (its trigger
//     claims).
//   - fencelock.run_state(resource, run_key) → TABLE(cursor text, finished boolean):
//     where a resumable run stands; no row before its first step.
//   - fencelock.schema_version() → bigint: the migration version the
//     schema implements.
//   - fencelock.prune(older_than interval) → bigint: deletes applied keys
//     and finished runs older than older_than; returns the rows deleted.
//
// pgfence itself calls fencelock.advance(resource, token, holder) before
// BEGIN, fencelock.open(resource, token, holder, key, run_key) after it and
// fencelock.close(resource, token, holder, key, run_key, cursor, finish)
// before COMMIT; their comments in 00002 describe them. open and close
// handle the common case themselves and hand anything else to
// fencelock.open_full and fencelock.close_full (internal, SECURITY
// INVOKER: called directly by an application role they fail with
// permission denied on the tables).
//
// # SQLSTATEs
//
// Class FL is not used by Postgres. Each code has one DETAIL shape, a JSON
// object:
//
//   - FL001 stale token: a higher token, or the same token with another
//     holder, has been seen for the resource. DETAIL
//     {"resource", "token", "current"}.
//   - FL002 write to a protected table without a current claim (or with a
//     claim for another resource than the table is bound to). DETAIL
//     {"table", "claimed", "required"} (claimed and required may be null).
//   - FL003 idempotency key already applied. DETAIL {"resource", "key",
//     "token"}, token being the one that applied it.
//   - FL004 resumable run already finished. DETAIL {"resource", "run_key",
//     "token"}, token being the one that finished it.
//   - 22023 invalid argument; the message names the function and the
//     argument.
//
// pgfence.MapError turns them into the errors of guard and pgfence.
package migrations
