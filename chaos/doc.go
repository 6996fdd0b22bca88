// Package chaos is fencelock's fault-injection suite: seeded trials of
// worker processes doing fenced work while a nemesis injects a real fault,
// and a checker that verifies the recorded history. The method, the faults,
// the checks and the committed results are in README.md
// (https://github.com/fencelock/fencelock/blob/main/chaos/README.md).
//
// [Run] runs a series of trials as [Config] says: each starts fresh worker
// processes ([Config.WorkerCommand]; [SelfCommand] re-executes the running
// binary, which then sees [IsWorker] and runs [WorkerMain], as marked by
// [WorkerEnv]) that reach Redis and Postgres through a testenv.Proxy each,
// injects one fault from [FaultKinds] (or, with [Config.Cluster], from
// [ClusterFaultKinds] on a Redis Cluster of 3 masters with a replica
// each), and checks the trial. [Config.Guard] off gives the control run
// that must find violations; [Config.BareLeases] hands half of the
// workers' guard.Exec calls a bare lease (no Done channel), so that only
// the database can stop their stale writes.
//
// Every trial adds contenders ([Config.Contenders]): worker processes that
// wait for the same locks with short random limits, so that waits end
// while handovers race them, and waiters in several processes queue, die
// in the queue (a SIGKILLed contender) and leave it.
//
// Workers report their operations as JSON lines ([Event], folded into
// [Op]s by [Ops]); [Check] verifies them against what the database holds
// ([DBState]) and returns a [CheckResult] with the [Violation]s. The
// [Report] prints a per-fault
// table and, last, one JSON line ([Report.Summary]); a trial with
// violations prints its seed and the offending slice of history.
//
// The module of its own (github.com/fencelock/fencelock/chaos, with a
// replace to the library in the checkout) keeps the checker's dependency
// out of the library's go.mod. `make chaos` runs cmd/chaos; `cd chaos &&
// go test ./...`, part of `make test`, runs the short version, every fault
// kind once on each topology.
package chaos
