// Package migrations holds the goose SQL migrations that install the
// fencelock schema into a target database, embedded ([FS]), and thin
// [Up], [Down] and [Status] helpers built on goose's Provider with
// Postgres's session advisory lock (two processes migrating at once take
// turns).
//
// Everything lives in the Postgres schema "fencelock": the fence table
// (newest token per resource), applied idempotency keys, resumable runs,
// the claim function, the protect-trigger function, and the SQLSTATEs
// FL001 (stale token), FL002 (no fence claimed), FL003 (key already
// applied) and FL004 (run finished).
//
// The same files apply with the goose CLI:
//
//	goose -dir migrations -table fencelock_db_version postgres "$DATABASE_URL" up
//
// goose records fencelock's versions in its own table, [VersionTable], so
// they never mix with the application's goose migrations.
package migrations
