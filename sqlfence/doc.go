// Package sqlfence is the database/sql backend of guard, for code that
// writes to Postgres through sqlx, GORM, sqlc's database/sql output or
// plain database/sql, with any driver (pgx's github.com/jackc/pgx/v5/stdlib
// and github.com/lib/pq are tested): *[Store] implements
// guard.Store[*sql.Tx]. It is a driver over package pgstore, the seam it
// shares with pgfence: pgstore owns the options, the methods both stores
// have (Advance, Prune, Observers, MapError), resumable runs and the
// schema's rules; sqlfence owns what database/sql does. fn's plain *sql.Tx
// reaches the commit queue (package outbox) through the context
// guard.Exec gives fn (guard.OpenTxn), so sqlx, GORM and sqlc code keeps
// its *sql.Tx. So
//
//	store, err := sqlfence.New(db) // db *sql.DB
//	...
//	_, err = guard.Exec(ctx, store, lock, func(ctx context.Context, tx *sql.Tx) error {
//		_, err := tx.ExecContext(ctx, "INSERT INTO stock ...")
//		return err
//	}, guard.WithKey("batch-7"))
//
// It keeps pgfence's semantics, with the same fencelock SQL functions and
// the same errors: a stale token is a *guard.StaleTokenError, an applied
// key guard.ErrAlreadyApplied, a finished run [guard.ErrRunFinished], a
// read-only database [guard.ErrReadOnly], whatever the driver (errors are
// recognised by SQLSTATE). A connection the driver cannot make is one
// line too, with the server's answer first, the server, user and database,
// and the fix; the driver's errors stay in the chain for errors.As
// (*pgconn.PgError, lib/pq's *pq.Error). Both stores pass guard's contract
// suite (package guard/guardtest).
//
// # The transaction
//
// READ COMMITTED. database/sql sends BEGIN and COMMIT on its own (fn's
// *sql.Tx can come only from BeginTx, and commits only through Commit), so
// the fence costs two statements over a plain transaction, one after BEGIN
// and one before COMMIT, each a round trip:
//
//   - fencelock.advance, on its own before BEGIN, the first time this
//     Store sees a token (it records the token at once: an older holder
//     can no longer commit over what fn reads; a stale token fails here);
//   - BEGIN, then the check: one plain statement that locks nothing and
//     reads the fence row (with the key and the run when given) and
//     whether the transaction may write; it calls fencelock.open only to
//     refuse, so a stale token, an applied key, a finished run or a
//     read-only database (transaction_read_only or
//     default_transaction_read_only on) fail there, before fn runs;
//   - fn;
//   - fencelock.close, which takes the resource's fence lock (a shared
//     transaction-level advisory lock, held until COMMIT), checks the
//     token against the fence row under it, records the key and the run's
//     cursor, and makes the outbox effects fn recorded live; then COMMIT.
//
// A plain one-row write is BEGIN, INSERT, COMMIT: 3 round trips; guarded
// it is 5, and 6 for a token the Store has not seen yet (counted on the
// wire in TestRoundTrips). The bench's sqlfence row gives the time ratio.
//
// # What fn must not do, and what happens if it does
//
// fn gets a plain *sql.Tx; its Commit and Rollback cannot be intercepted.
// If fn commits or rolls back (through the *sql.Tx, or by sending COMMIT
// or ROLLBACK as SQL), the transaction the fence checked is gone: Exec
// finds out before it claims (the claim runs only inside the transaction
// the check marked) and returns an error wrapping guard.ErrTxEnded, which
// says fn's writes may have committed without the fence check; it never
// reports such a transaction as refused. The effects fn added with
// package outbox's Add are not among those writes: the commit writes
// them, after its claim, and it does not run. To roll back, return an
// error from fn.
//
// A commit whose connection breaks while COMMIT is in flight has an
// unknown outcome: guard.ErrUnknownOutcome (use guard.WithKey: a retry
// then tells, with guard.ErrAlreadyApplied).
//
// # Also here
//
//   - [Store.Advance] claims right after acquiring;
//   - [Store.Run]: resumable runs, a long batch in fenced steps;
//   - [Store.Prune] deletes old idempotency keys and finished runs;
//   - [MapError] translates the fencelock SQLSTATEs of raw SQL, through
//     any driver, into guard's errors, the same values pgfence returns.
//
// Tables protected with pgfence's Protect accept writes through sqlfence
// (the check sets the claim their trigger reads). The fencelock schema
// must be installed first (package migrations), at the version of the
// last migration: without it every call returns an error matching
// [guard.ErrSchemaMissing], and with an older one [guard.ErrSchemaOutdated]
// (checked once per Store, on its first call); either names the database
// and the command to run.
package sqlfence
