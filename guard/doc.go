// Package guard holds the store-agnostic semantics of a fenced, idempotent
// write: Exec runs a lease holder's writes in one transaction that commits
// only if the lease's token is still the newest the store has seen.
package guard
