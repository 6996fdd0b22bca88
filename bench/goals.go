package main

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// The issues the goals come from, each a table of latest.md.
const (
	issueLock   = "the lock against its peers"
	issueFair   = "a fair lock across processes"
	issueGuard  = "guarded writes"
	issueOutbox = "fenced side effects (the outbox)"
	issueLeader = "scheduled jobs: one leader at a time"
	issueTicks  = "scheduled jobs: each tick once"
)

// evaluateGoals turns the figures into the issue's goals, each met or not.
// Goals compare medians; comparisons use ratios paired per repetition.
func evaluateGoals(r *results) {
	nan := math.NaN()
	ratio := func(scn, key string) float64 {
		s, ok := r.Scenarios[scn]
		if !ok || s.Error != "" {
			return nan
		}
		v, ok := s.Ratios[key]
		if !ok {
			return nan
		}
		return v
	}
	med := func(scn, lib, metric string) float64 {
		s, ok := r.Scenarios[scn]
		if !ok || s.Error != "" {
			return nan
		}
		if f := s.get(lib, metric); f != nil {
			return f.Median
		}
		return nan
	}
	r.issue = issueLock
	if _, ok := r.Scenarios["uncontended"]; ok {
		r.addGoal("uncontended", "fence acquire+release ≤ 1.15 × 2×PING (ratio)", ratio("uncontended", "fence/2xPING"), 1.15, true, "")
		r.addGoal("uncontended", "fence ≤ fastest peer (fence/fastest peer)", ratio("uncontended", "fence/fastest_peer"), 1.0, true, strings.TrimPrefix(r.shapesNote("latency"), "; "))
	}
	if _, ok := r.Scenarios["parallel"]; ok {
		r.addGoal("parallel", "ops/s ≥ best peer (fence/best peer)", ratio("parallel", "fence/best_peer"), 1.0, false, strings.TrimPrefix(r.shapesNote("ops"), "; "))
	}
	if _, ok := r.Scenarios["handoff"]; ok {
		r.addGoal("handoff", "gap median ≤ 3 × PING (fence gap/PING)", ratio("handoff", "fence/PING"), 3.0, true, "")
		r.addGoal("handoff", "≥ 10× better than the best peer (best peer gap/fence gap)", ratio("handoff", "best_peer/fence"), 10.0, false, "peers at their documented retry settings")
	}
	if _, ok := r.Scenarios["contended"]; ok {
		r.addGoal("contended", "acquisitions/s ≥ best peer (fence/best peer)", ratio("contended", "acq_per_s fence/best_peer"), 1.0, false, "")
		r.addGoal("contended", "commands/acquisition ≤ ½ best peer (fence/best peer)", ratio("contended", "cmds_per_acq fence/best_peer"), 0.5, true, "INFO commandstats, script-internal commands included")
		r.addGoal("contended", "wait p99 ≤ ½ best peer (fence/best peer)", ratio("contended", "wait_p99 fence/best_peer"), 0.5, true, "")
		r.addGoal("contended", "per-goroutine min/max acquisitions ≥ 0.5", med("contended", "fence", "min_max"), 0.5, false, "")
	}
	if s, ok := r.Scenarios["renewal"]; ok {
		for _, n := range r.Config.RenewalLocks {
			lib := fmt.Sprintf("fence %d locks", n)
			limit := math.Ceil(float64(n) / renewBatchGoal)
			r.addGoal("renewal", fmt.Sprintf("%d locks: round trips/period ≤ ceil(%d/%d)", n, n, renewBatchGoal), med("renewal", lib, "round_trips_per_period"), limit, true, "")
			r.addGoal("renewal", fmt.Sprintf("%d locks: heap per held lock ≤ 1 KiB", n), med("renewal", lib, "heap_bytes_per_lock"), 1024, true, "")
			r.addGoal("renewal", fmt.Sprintf("%d locks: no lock lost by the watchdog (max over repetitions)", n), maxOf(r.Scenarios["renewal"].get(lib, "locks_lost")), 0, true, "not an issue goal: a correctness check")
		}
		big := r.Config.RenewalLocks[len(r.Config.RenewalLocks)-1]
		small := r.Config.RenewalLocks[0]
		r.addGoal("renewal", fmt.Sprintf("%d locks: renewal time/period ≤ 1.2 × hand-written pipeline", big), ratio("renewal", fmt.Sprintf("busy/floor %d", big)), 1.2, true, "busy = time per period with a renewal pipeline of fence in flight")
		r.addGoal("renewal", fmt.Sprintf("%d locks: ≥ 10× faster than redislock's Refresh loop", big), ratio("renewal", fmt.Sprintf("peer_loop/busy %d", big)), 10, false, "")
		r.addGoal("renewal", fmt.Sprintf("%d locks: client CPU < 10%% of one core", big), med("renewal", fmt.Sprintf("fence %d locks", big), "cpu_pct_core"), 10, true, "")
		if big != small {
			d := med("renewal", fmt.Sprintf("fence %d locks", big), "goroutines_added") - med("renewal", fmt.Sprintf("fence %d locks", small), "goroutines_added")
			r.addGoal("renewal", fmt.Sprintf("goroutines independent of locks (added at %d − added at %d)", big, small), d, 0, true, "")
		}
		_ = s
	}
	if s, ok := r.Scenarios["cluster"]; ok {
		for _, n := range r.Config.RenewalLocks {
			lib := fmt.Sprintf("fence %d locks", n)
			limit, _ := s.Extra[fmt.Sprintf("rt_per_node_limit_%d", n)].(float64)
			if limit == 0 {
				limit = math.NaN()
			}
			r.addGoal("cluster", fmt.Sprintf("%d locks on 3 masters: round trips per node per period ≤ ceil(locks on the node/%d) (worst node)", n, renewBatchGoal), med("cluster", lib, "round_trips_per_node_period_max"), limit, true, "")
			r.addGoal("cluster", fmt.Sprintf("%d locks on 3 masters: no lock lost by the watchdog (max over repetitions)", n), maxOf(s.get(lib, "locks_lost")), 0, true, "a correctness check")
		}
		big := r.Config.RenewalLocks[len(r.Config.RenewalLocks)-1]
		r.addGoal("cluster", fmt.Sprintf("%d locks on 3 masters: renewal time/period ≤ 1.2 × hand-written cluster pipeline", big), ratio("cluster", fmt.Sprintf("busy/floor %d", big)), 1.2, true, "busy = union of fence's renewal pipelines on all nodes")
	}
	r.issue = issueFair
	fairLockGoals(r, ratio, med)
	r.issue = issueGuard
	if _, ok := r.Scenarios["guard"]; ok {
		r.addGoal("guard", "guarded/plain ≤ 1.15, direct", ratio("guard", "guarded/plain direct"), 1.15, true, "")
		r.addGoal("guard", "guarded+key/plain ≤ 1.20, direct", ratio("guard", "guarded+key/plain direct"), 1.20, true, "")
		p := "proxied 1ms each way"
		r.addGoal("guard", "guarded/plain ≤ 1.02, "+p, ratio("guard", "guarded/plain "+p), 1.02, true, "")
		r.addGoal("guard", "guarded+key/plain ≤ 1.02, "+p, ratio("guard", "guarded+key/plain "+p), 1.02, true, "")
		r.addGoal("guard", "guarded/floor ≤ 1.08, direct", ratio("guard", "guarded/floor direct"), 1.08, true, "floor: the plain transaction with two prepared no-op statements in its BEGIN and COMMIT round trips")
		r.addGoal("guard", "guarded+key/floor ≤ 1.15, direct", ratio("guard", "guarded+key/floor direct"), 1.15, true, "")
		r.addGoal("guard", "guarded/floor ≤ 1.02, "+p, ratio("guard", "guarded/floor "+p), 1.02, true, "")
	}
	if _, ok := r.Scenarios["sqlfence"]; ok {
		r.addGoal("sqlfence", "guarded/plain database/sql ≤ 1.45, pgx driver", ratio("sqlfence", "guarded/plain pgx"), 1.45, true, "")
		r.addGoal("sqlfence", "guarded/plain database/sql ≤ 1.6, lib/pq", ratio("sqlfence", "guarded/plain postgres"), 1.6, true, "")
	}
	r.issue = issueOutbox
	outboxGoals(r, ratio)
	r.issue = issueLeader
	leaderGoals(r, ratio)
	r.issue = issueGuard
	if _, ok := r.Scenarios["sync"]; ok {
		r.addGoal("sync", "rows/s guard on / off ≥ 0.90", ratio("sync", "on/off"), 0.9, false, "")
	}
	r.issue = issueTicks
	if s, ok := r.Scenarios["tick"]; ok {
		note := ""
		if v, ok := s.Ratios["tick/redsync"]; ok {
			note = fmt.Sprintf("floor: the same calls bare (acquire+release, Advance, 2 ledger reads, 2 ledger steps, Finish); a redsync per-tick lock (no run, no database) costs %s× less", fmtNum(v))
		}
		r.addGoal("tick", "a tick run of an empty job ÷ its floor ≤ 1.2", ratio("tick", "tick/floor"), 1.2, true, note)
	}
}

// fairLockGoals are the rows of the performance table of issue "a fair
// lock across processes", each against a peer or a floor measured in the
// same run.
func fairLockGoals(r *results, ratio func(scn, key string) float64, med func(scn, lib, metric string) float64) {
	c := r.Config
	if s, ok := r.Scenarios["handoff2"]; ok {
		handoff2Goals(r, s, ratio)
	}
	if s, ok := r.Scenarios["fair"]; ok {
		who := fmt.Sprintf("%d processes × %d goroutines, %v hold", c.FairClients, c.FairGoroutines, c.FairHold)
		r.addGoal("fair", who+": min/max acquisitions per process ≥ 0.9", med("fair", "fence", "min_max"), 0.9, false, "")
		r.addGoal("fair", who+": grants out of arrival order = 0 (max over repetitions)", maxOf(s.get("fence", "out_of_order")), 0, true, "")
		peers := strings.Join(redisPeers, ", ")
		acqNote := fmt.Sprintf("the peers at their documented retry settings, in the same processes and window: they mostly serve the goroutine that just released (min/max per process %s) where fence serves the queue in turn", strings.Join(fairMinMax(s, redisPeers), ", "))
		cpuNote := "the Redis server's CPU (INFO cpu) over the window / acquisitions, polling included"
		if v, ok := s.Ratios["acq_per_s fence/"+etcdName]; ok {
			acqNote += fmt.Sprintf("; etcd's Mutex, a peer too: fence/etcd %s", fmtNum(v))
			cpuNote += fmt.Sprintf("; etcd's Mutex, its server's CPU: fence/etcd %s", fmtNum(s.Ratios["server_cpu fence/"+etcdName]))
		}
		r.addGoal("fair", fmt.Sprintf("contended acquisitions/s ≥ 0.95 × the best Redis peer (fence/best of %s)", peers), ratio("fair", "acq_per_s fence/best_redis_peer"), 0.95, false, acqNote)
		r.addGoal("fair", fmt.Sprintf("lock server CPU per contended acquisition ≤ the best Redis peer's (fence/best of %s)", peers), ratio("fair", "server_cpu fence/best_redis_peer"), 1, true, cpuNote)
	}
	if _, ok := r.Scenarios["parallel"]; ok {
		n := c.ParallelWorkers
		srvNote := "where it goes: the parallel scenario's redis_* columns" + r.shapesNote("redis_cpu")
		cliNote := "the bench process' CPU (getrusage) over the window / operations; the workers of both run in it"
		if p := r.Scenarios["parallel"]; p.get("fence", "client_switches_per_op") != nil {
			cliNote += fmt.Sprintf("; its context switches per acquire+release (all workers waiting on Redis at once): fence %s, redislock %s",
				medianOf(p.get("fence", "client_switches_per_op")), medianOf(p.get("redislock", "client_switches_per_op")))
		}
		cliNote += r.shapesNote("client_cpu")
		r.addGoal("parallel", fmt.Sprintf("Redis CPU per uncontended acquire+release (%d names) ÷ redislock ≤ 1.10 (fence/redislock)", n), ratio("parallel", "redis_cpu fence/redislock"), 1.10, true, srvNote)
		r.addGoal("parallel", fmt.Sprintf("client CPU per uncontended acquire+release (%d names) ÷ redislock ≤ 1.00 (fence/redislock)", n), ratio("parallel", "client_cpu fence/redislock"), 1, true, cliNote)
	}
	if s, ok := r.Scenarios["queue"]; ok {
		r.addGoal("queue", fmt.Sprintf("%d queued waiters: ≤ 200 B of Redis memory per waiter", c.QueueWaiters), med("queue", "fence", "memory_per_waiter_bytes"), 200, true, "INFO used_memory floor, before and with the queue")
		note := ""
		if f := s.get("fence", "release_slowlog_us"); f != nil {
			note = fmt.Sprintf("median of %d handovers; the longest %s µs", len(f.Reps), fmtNum(maxOf(f)))
		}
		r.addGoal("queue", fmt.Sprintf("%d queued waiters: median release ≤ 50 µs in SLOWLOG", c.QueueWaiters), med("queue", "fence", "release_slowlog_us"), 50, true, note)
	}
	if s, ok := r.Scenarios["headkill"]; ok {
		r.addGoal("headkill", fmt.Sprintf("5 waiters SIGKILLed at the head (liveness %v): the next live waiter holds within 4 s in total (the longest repetition)", c.HeadLiveness), maxOf(s.get("fence", "next_holder_s")), 4, true, "from the kill")
	}
}

// handoff2Goals: the handover between two processes against back-to-back
// PINGs (and a PING after the same idle), and against the least a
// handover carried by a message costs: a PUBLISH from one process to a
// subscriber in another, measured the same two ways in the same run.
func handoff2Goals(r *results, s *scenario, ratio func(scn, key string) float64) {
	hold := r.Config.HandoffHold
	r.addGoal("handoff2", "handoff (2 processes), released as soon as the waiter is queued: median ≤ 2 × PING (fence/PING)", ratio("handoff2", "fence/PING"), 2, true,
		fmt.Sprintf("aim 1.5; the PUBLISH floor (one process to another) is %s× PING here", fmtNum(s.Ratios["floor/PING"])))
	r.addGoal("handoff2", fmt.Sprintf("handoff (2 processes), released after a %v hold: median ≤ 2 × PING after the same idle", hold), ratio("handoff2", "fence/PING after hold"), 2, true,
		fmt.Sprintf("the PUBLISH floor after the same idle is %s× PING after idle", fmtNum(s.Ratios["floor/PING after hold"])))
	floor := func(m string) string {
		f, fl := s.get("fence", m), s.get(floorName, m)
		if f == nil || fl == nil || f.Pooled == nil || fl.Pooled == nil {
			return ""
		}
		note := fmt.Sprintf("the floor: a PUBLISH from this process received by a subscriber process, %s µs; fence %s µs", fmtNum(fl.Pooled.Median), fmtNum(f.Pooled.Median))
		if sf := s.get(scriptFloorName, m); sf != nil && sf.Pooled != nil {
			suffix, redis := "", redisAtOnce
			if m == gapAfterHold {
				suffix, redis = " after hold", redisAfterHold
			}
			note += fmt.Sprintf("; fence's release.lua handing over from a bare client to the same subscriber %s µs, %s× the PUBLISH floor; fence ÷ that %s", fmtNum(sf.Pooled.Median),
				fmtNum(s.Ratios["script floor/floor"+suffix]), fmtNum(s.Ratios["fence/script floor"+suffix]))
			if rs, rp := s.get(scriptFloorName, redis), s.get(floorName, redis); rs != nil && rp != nil {
				note += fmt.Sprintf("; Redis time per call (INFO commandstats): release.lua %s µs", fmtNum(rs.Median))
				for _, st := range handoverSteps {
					if f := s.get(st.row, redis); f != nil {
						note += fmt.Sprintf(", %s %s", stepName(st.row), fmtNum(f.Median))
					}
				}
				note += fmt.Sprintf(", PUBLISH %s µs", fmtNum(rp.Median))
			}
			if f := s.get(bareName, m); f != nil && f.Pooled != nil {
				note += fmt.Sprintf("; a handover with no guarantee beyond ownership and order (%s: GET, LPOP, SET, PUBLISH) %s× the PUBLISH floor", bareName, fmtNum(s.Ratios[bareName+"/floor"+suffix]))
			}
		}
		return note
	}
	r.addGoal("handoff2", "handoff (2 processes) ÷ the PUBLISH floor of the same run ≤ 1.15, released at once (fence/floor)", ratio("handoff2", "fence/floor"), 1.15, true, floor(gapAtOnce))
	r.addGoal("handoff2", fmt.Sprintf("handoff (2 processes) ÷ the PUBLISH floor after the same idle ≤ 1.15, released after a %v hold (fence/floor after hold)", hold), ratio("handoff2", "fence/floor after hold"), 1.15, true, floor(gapAfterHold))
}

// fairMinMax is the median min/max per process of each lib in fair.
func fairMinMax(s *scenario, libs []string) []string {
	var out []string
	for _, l := range libs {
		v := "–"
		if f := s.get(l, "min_max"); f != nil {
			v = fmtNum(f.Median)
		}
		out = append(out, l+" "+v)
	}
	return out
}

// outboxGoals are the rows of the performance table of issue "fenced side
// effects". Latency percentiles are over every sample of every
// repetition.
func outboxGoals(r *results, ratio func(scn, key string) float64) {
	s, ok := r.Scenarios["outbox"]
	if !ok {
		return
	}
	pct := func(lib string, q float64) float64 {
		f := s.get(lib, "latency_us")
		if f == nil || f.Pooled == nil || s.Error != "" {
			return math.NaN()
		}
		if q == 0.5 {
			return f.Pooled.Median / 1000
		}
		return f.Pooled.P99 / 1000
	}
	med := func(lib, metric string) float64 {
		if f := s.get(lib, metric); f != nil && s.Error == "" {
			return f.Median
		}
		return math.NaN()
	}
	in, poll := "commit → Sender, in-process wake-up", "commit → Sender, poll-only"
	r.addGoal("outbox", "commit → Sender called, in-process wake-up: p50 ≤ 1 ms", pct(in, 0.5), 1, true, "ms")
	r.addGoal("outbox", "commit → Sender called, in-process wake-up: p99 ≤ 5 ms", pct(in, 0.99), 5, true, "ms")
	r.addGoal("outbox", "commit → Sender called, poll-only: p50 ≤ 60 ms", pct(poll, 0.5), 60, true, "ms, at the default poll interval")
	r.addGoal("outbox", "guarded transaction + 1 effect ÷ guarded transaction ≤ 1.05, loopback", ratio("outbox", "guarded+effect/guarded direct"), 1.05, true, "")
	r.addGoal("outbox", "guarded transaction + 1 effect ÷ guarded transaction ≤ 1.05, 1 ms proxy", ratio("outbox", "guarded+effect/guarded proxied 1ms each way"), 1.05, true, "")
	r.addGoal("outbox", "one relay to a no-op Sender ≥ 5,000 effects/s", med("one relay", "effects_per_s"), 5000, false, "")
	r.addGoal("outbox", "two relays ≥ 1.6 × one (two relay processes / one)", ratio("outbox", "two relays/one relay"), 1.6, false, "")
	r.addGoal("outbox", "commit → Sender p50 ≤ ½ of River's InsertTx → worker p50, River at its defaults", ratio("outbox", "outbox in-process/River"), 0.5, true, "")
}

// leaderGoals are the leader rows of the performance table of issue
// "scheduled jobs": each a ratio in the same run, or a time against the
// term's lease.
func leaderGoals(r *results, ratio func(scn, key string) float64) {
	if s, ok := r.Scenarios["election"]; ok {
		note := ""
		if v, ok := s.Ratios["etcd election/election"]; ok {
			note = fmt.Sprintf("etcd's Election, resign → campaign, took %s× fence's in the same run", fmtRatio(v))
		}
		r.addGoal("election", "resign → the next candidate's Campaign returns: ≤ 1.1 × the fair lock's handoff (election/lock)", ratio("election", "election/fence"), 1.1, true, note)
	}
	if s, ok := r.Scenarios["leaderkill"]; ok {
		lease := r.Config.LeaderKillLease
		limit := (lease + lease/3).Round(time.Millisecond) // 4 s for the issue's 3 s
		r.addGoal("leaderkill", fmt.Sprintf("leader SIGKILLed → next leader, term lease %v: ≤ %v (the longest repetition)", lease, limit), maxOf(s.get(electionName, "next_leader_s")), limit.Seconds(), true, "from the kill, in seconds")
	}
	if s, ok := r.Scenarios["observe"]; ok {
		who := fmt.Sprintf("observe fan-out, %d observers, a resignation seen by all", r.Config.Observers)
		note := func(q string) string {
			return fmt.Sprintf("each observer on a client and connection of its own; the floor (a PUBLISH to as many go-redis subscribers in the same processes) is %s× PING here, fence %s× that floor; observers sharing one client per process: %s× PING",
				fmtNum(s.Ratios["floor "+q+"/PING"]), fmtNum(s.Ratios[q+"/floor "+q]), fmtNum(s.Ratios["shared "+q+"/PING"]))
		}
		r.addGoal("observe", who+": p50 ≤ 2 × PING", ratio("observe", "p50/PING"), 2, true, note("p50"))
		r.addGoal("observe", who+": p99 ≤ 10 × PING", ratio("observe", "p99/PING"), 10, true, note("p99"))
	}
}

func maxOf(f *figure) float64 {
	if f == nil || len(f.Reps) == 0 {
		return math.NaN()
	}
	m := f.Reps[0]
	for _, v := range f.Reps {
		m = math.Max(m, v)
	}
	return m
}
