// Package guardtest is the contract every guard.Store must keep, as a test
// suite any store can run against a real database: [Run] checks stale
// rejection with two tokens, the same token from another holder, key
// dedupe, resumable runs, rollback on error, panic, cancellation and lease
// loss, the commit-order invariant under 12 concurrent writers, misuse (fn
// committing the transaction itself, a read-only database), bad input,
// and, for a store with a commit queue ([Harness.OnCommit]), statements
// queued for the commit. It imports no store and no driver: what differs
// between stores reaches it through the [Harness].
//
// pgfence (pgx.Tx) and sqlfence (*sql.Tx) run it in their tests; a
// third-party store runs it the same way, with a [Harness] that tells the
// suite how to open a database with the store's schema, make a store over
// it, run a statement in the store's transaction handle, and read what the
// store recorded ([Facts]: the suite knows no store's schema):
//
//	func TestContract(t *testing.T) {
//		guardtest.Run(t, guardtest.Harness[*sql.Tx]{
//			Open: func(t testing.TB) guardtest.Database[*sql.Tx] { ... },
//			...
//		})
//	}
//
// The suite asserts what the database holds after each step, through the
// harness's own connection, never what the store says about itself. Its
// own statements (the tables fn writes to, and its rows) are plain SQL with
// $1-style placeholders and UPDATE … RETURNING; a Database for a dialect
// without them rewrites them.
package guardtest
