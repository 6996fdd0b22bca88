// Package chaos is fencelock's fault-injection suite: it proves, the way
// lock services are tested, that with guard no stale write commits and no
// batch is applied twice, whatever happens to processes, Redis, Postgres or
// the network.
//
// A run is a series of trials. Each trial starts fresh worker processes
// (the running binary re-executed with [WorkerEnv]) that take fence locks
// on a few resources and, under each lock, do fenced work through
// guard.Exec: read-modify-write increments of a register row, and batches
// of business rows appended under an idempotency key (the table has no
// unique key: only fencing keeps duplicates out). Every worker talks to
// Redis and to Postgres through its own testenv.Proxy. While they work, a
// nemesis injects one fault chosen from the seed (see [FaultKinds]): a
// worker SIGSTOPped mid-operation beyond its lease, or SIGKILLed; Redis
// paused, restarted without its data, or flushed; a worker's Redis link
// blackholed or cut; Postgres restarted; a worker's Postgres link delayed.
//
// Workers report every operation (invoke and completion, token, resource,
// outcome) as JSON lines on stdout; every committed write also records
// itself, with its token, in a log row of its own transaction, so the
// database says what committed and in which order (a per-resource version
// bumped under the register's row lock). [Check] then verifies per
// resource: tokens never decrease in commit order; no write commits with a
// token lower than one acknowledged before it began; no idempotency key is
// applied twice; no business row is duplicated; no acknowledged write is
// lost and no rejected one is visible; the register equals the number of
// committed increments (no lost update); and the history is linearizable
// as a fenced register (porcupine). Operations whose outcome the worker
// never learned are resolved by the database.
//
// The same suite with guard off (plain transactions under the lock) must
// report violations; the tests assert it. [Run] prints a per-fault table
// and, last, one JSON line; a trial with violations prints the seed and
// the offending slice of history. It also measures lock-loss detection
// (fault to Lock.Context() cancellation) and takeover (fault to the next
// holder's first committed write).
//
// A cluster run ([Config.Cluster]) does the same on a Redis Cluster of 3
// masters with a replica each, one resource per master, each worker
// reaching every node through a proxy of its own; the nemesis hits one
// master ([ClusterFaultKinds]): killed (its replica promoted), stalled
// beyond the lease, lost with writes its replica missed (the replica takes
// over without the last lock), or cut off from every worker. The report
// adds, per kind, the locks lost on the masters the fault did not touch.
//
// Half of the workers of `make chaos` hand guard.Exec a bare lease (name,
// token, holder, no Done channel), so that the database's check alone must
// stop their stale writes, as the design promises; the others pass the
// *fence.Lock as applications do ([Config.BareLeases]).
//
// The suite is a module of its own (github.com/fencelock/fencelock/chaos,
// with a replace to the library in the checkout), so that its checker's
// dependency stays out of the library's go.mod. `make chaos` runs cmd/chaos
// (a guard-off control, then 200 trials; then on a cluster a guard-off
// control and 40 trials); `cd chaos && go test ./...`, part of `make test`,
// runs the short version, every fault kind once on each topology.
// finding_test.go (build tag chaosfinding) holds deterministic
// reproductions of what the suite found.
package chaos
