// Package migrations holds the goose SQL migrations that install the
// fencelock schema into a target database, embedded ([FS]), and thin
// [Up], [Down] and [Status] helpers built on goose's Provider with
// Postgres's session advisory lock (two processes migrating at once take
// turns).
//
// The same files apply with the operator CLI, or with the goose CLI in a
// module that requires fencelock (the files of the version it uses), with
// DATABASE_URL set to the database's URL:
//
//	fencectl migrate up --db "$DATABASE_URL"
//	goose -dir "$(go list -m -f '{{.Dir}}' github.com/fencelock/fencelock)/migrations" \
//	  -table fencelock_db_version postgres "$DATABASE_URL" up
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
// an adoption at Info, goose's own messages at Debug. An error is one
// line; when the connection to Postgres fails it starts with the
// server's answer (or the network's), then names the server, user and
// database.
//
// Run as an application role (USAGE and EXECUTE only, not the schema's
// owner), as when every instance calls Up at start-up, [Up] does nothing
// when the schema is current and returns a [NotOwnerError] naming the
// owner when a migration is pending.
//
// A role that lacks what migrating needs (CREATE on the database and on
// the schema where the version table goes, to install the schema; the
// schema's ownership, to change or drop it; the version table, to read
// it) gets from [Up], [Down] and [Status] an error matching
// guard.ErrPermission, worded as every fencelock call words a refused
// privilege: the role, what it lacks on which object, and the SQL that
// mends it with whom to run it as and in which database (a psql command
// line), or the one role that may do it when no grant can.
//
// # Schema
//
// Everything lives in the Postgres schema "fencelock": 00001 creates the
// tables (fence: newest token per resource; applied: idempotency keys;
// runs: resumable runs) and schema_version, 00002 the functions (CREATE
// OR REPLACE), 00003 the outbox, 00004 brings a database whose 00001
// and 00002 came from the earlier files (released at 88937a5, before
// they were edited in place) to the same schema: the fence lock's
// functions, the read grant, schema_version(); and 00005 bounds the
// outbox's reads for operators: an index of dead rows, outbox_backlog
// (counts by state up to a limit, over indexes), outbox_list through the
// index. Every table and function carries a COMMENT (\d+ and \df+ in
// psql). pgfence, sqlfence and outbox relays need the schema of the last
// migration and refuse an older one with an error that says how to
// migrate it.
//
// A released migration never changes: databases have applied it, and
// goose never applies a version twice. A change is a new migration that
// repeats each changed function whole (CREATE OR REPLACE), and whose Down
// restores what it replaced; every migration redefines
// fencelock.schema_version() to its own version (STABLE), and its Down
// restores the previous one. It defines it with a string body,
//
//	CREATE OR REPLACE FUNCTION fencelock.schema_version() RETURNS bigint
//	  LANGUAGE sql STABLE AS $$ SELECT <n>::bigint $$;
//
// never a BEGIN ATOMIC body: the stores and Up read the version from the
// function's source in the catalog (pg_proc.prosrc), which needs no
// EXECUTE grant, and a BEGIN ATOMIC function's prosrc is empty: the
// schema would read as having no version and the stores would refuse it.
// The tests pin each released file's SHA-256, check at every version
// that the version read from the catalog is the one the function
// returns, and that every Down gives back the catalog its Up found.
//
// 00004's header says that a later migration's Down restores what it
// replaced. 00004's own Down restores only schema_version(): on a
// database that came from 88937a5's files it leaves the function bodies
// and grants 00004 installed, the state that the files 1 to 3 define
// now, not the row-lock functions that database had before. (00004 is
// released and pinned, so this is said here rather than in the file.)
//
// The functions that callers use are SECURITY DEFINER and not executable
// by PUBLIC: an application role needs USAGE on the schema and EXECUTE on
// its functions, and nothing of its own on the tables (the migrations let
// PUBLIC read them; it cannot lower a token by hand). The grants, and the
// functions as an API for raw SQL and other languages with their SQLSTATEs (class FL), are in docs/operations.md and
// docs/sql-api.md
// (https://github.com/fencelock/fencelock/tree/main/docs); pgfence.MapError
// and sqlfence.MapError turn those SQLSTATEs into guard's errors.
package migrations
