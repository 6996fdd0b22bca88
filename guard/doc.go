// Package guard holds the store-agnostic semantics of a fenced, idempotent
// write: [Exec] runs a lease holder's writes in one transaction that commits
// only if the lease's token is still the newest the store has seen for the
// lease's resource, and, with [WithKey], only once per idempotency key.
// guard owns that contract and nothing of any database: a store is a
// [Store] of its own transaction type Tx, and the seam between them is
// typed end to end, from Exec to fn's tx and to code fn calls, which finds
// the open transaction through fn's context ([OpenTxn]).
//
// A lease is anything with Name, Token and Holder ([Lease]); a *fence.Lock
// is one, without either package importing the other. The store decides
// (pgfence and sqlfence, drivers over package pgstore, are the Postgres
// stores): a holder whose lease expired during a pause is rejected by the
// database itself with a [*StaleTokenError], not by a client-side check
// that races.
//
// In one transaction, Exec
//
//  1. checks the lease at begin, holding no lock past it: if the store has
//     seen a higher token for lease.Name(), or the same token from another
//     holder, fn does not run and Exec returns a [*StaleTokenError]
//     ([ErrStaleToken]); otherwise the store records the token right away
//     (as pgfence's Advance does), so that an older holder can no longer
//     commit over what fn reads; with [WithKey], if the key was applied
//     before, fn does not run and Exec returns [ErrAlreadyApplied];
//  2. runs fn with a tx that the store implements: fn writes through it,
//     but cannot commit or roll back (its Commit and Rollback return
//     [ErrTxOwned]); an error, a panic or a cancelled ctx rolls back;
//  3. claims the fence and commits, together: the claim is accepted if the
//     stored token is lower (the new one is stored) or equal with the same
//     holder, and records the key; otherwise nothing is committed and Exec
//     returns [ErrStaleToken] or [ErrAlreadyApplied].
//
// Whatever happens, err == nil if and only if fn's writes are committed,
// with two errors that say the outcome is not known: [ErrUnknownOutcome]
// (the connection was lost while the commit was in flight) and
// [ErrTxEnded] (fn ended the transaction itself, with a raw COMMIT or
// ROLLBACK). A lost lease is named whenever it ends a call: the error is a
// [*LeaseLostError], matching [ErrLeaseLost] and the lease's own cause.
// Every message is one line.
//
// Claiming at commit rather than at begin is what keeps a frozen holder
// (SIGSTOP, GC pause, VM freeze in the middle of fn) from holding up the
// next one: pgfence locks its fence only while it records a new token at
// begin or while a commit runs (and, for writes to a table it protects,
// until the transaction ends). The
// invariant is the same either way: every commit checks its token under
// the fence's lock in the committing transaction, so the tokens of
// committed transactions never decrease in commit order.
//
// If the lease has a Done() <-chan struct{} method (a *fence.Lock has) and
// it is closed, Exec neither starts nor commits ([ErrLeaseLost]), and fn's
// context is cancelled (with the lease's Context, for a *fence.Lock, its
// cause is the lock's). That is a fast path only: the store's check is the
// guarantee. Once the commit is sent, a lease lost meanwhile does not
// interrupt it (that would make its outcome unknown); the store decides.
package guard
