package migrations

import "errors"

// ErrNilDB is returned by Up, Down and Status when db is nil.
var ErrNilDB = errors.New("migrations: nil *sql.DB: open one with sql.Open(\"pgx\", url) or stdlib.OpenDBFromPool(pool)")

// ErrUnrecorded is returned by Up when the fencelock schema exists but
// VersionTable does not record it, typically because the goose CLI was
// run without -table fencelock_db_version (it then records the versions
// in goose_db_version).
var ErrUnrecorded = errors.New("migrations: schema fencelock exists but is not recorded in " + VersionTable +
	": if it was installed with the goose CLI, run it with -table " + VersionTable +
	" (goose -dir migrations -table " + VersionTable + " postgres \"$DATABASE_URL\" up), or drop the schema and run Up again")
