// Package guard holds the store-agnostic semantics of a fenced, idempotent
// write: [Exec] runs a lease holder's writes in one transaction that commits
// only if the lease's token is still the newest the store has seen for the
// lease's resource, and, with [WithKey], only once per idempotency key.
//
// A lease is anything with Name, Token and Holder ([Lease]); a *fence.Lock
// is one, without either package importing the other. The store decides
// (package pgfence is the Postgres store): a holder whose lease expired
// during a pause is rejected by the database itself with a
// [*StaleTokenError], not by a client-side check that races.
//
// In one transaction, Exec
//
//  1. claims the fence for lease.Name(): accepted if the stored token is
//     lower (the new one is stored) or equal with the same holder;
//     otherwise [ErrStaleToken];
//  2. with [WithKey], records the key; if it was recorded before, fn does
//     not run and Exec returns [ErrAlreadyApplied];
//  3. runs fn; an error, a panic or a cancelled ctx rolls back;
//  4. commits.
//
// If the lease has a Done() <-chan struct{} method (a *fence.Lock has) and
// it is closed, Exec neither starts nor commits ([ErrLeaseLost]). That is a
// fast path only: the store's check is the guarantee.
package guard
