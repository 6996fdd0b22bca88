package migrations

import "errors"

// ErrNilDB is returned by Up, Down and Status when db is nil.
var ErrNilDB = errors.New("migrations: nil *sql.DB: open one with sql.Open(\"pgx\", url) or stdlib.OpenDBFromPool(pool)")
