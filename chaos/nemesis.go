package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"time"
)

// Fault kinds the nemesis injects.
const (
	FaultSigstop      = "sigstop"              // SIGSTOP a lock holder beyond its lease, then SIGCONT
	FaultSigkill      = "sigkill"              // SIGKILL a lock holder (a replacement worker starts)
	FaultRedisPause   = "redis-pause"          // SIGSTOP the Redis server beyond the lease
	FaultRedisRestart = "redis-restart-nodata" // restart Redis without its data: token counters lost
	FaultFlushAll     = "flushall"             // FLUSHALL: locks and token counters lost
	FaultRedisBlack   = "redis-blackhole"      // a holder's Redis link delivers nothing beyond the lease
	FaultRedisCut     = "redis-cut"            // a holder's Redis link is cut and refused beyond the lease
	FaultPGRestart    = "pg-restart"           // Postgres fast shutdown and start (connections cut)
	FaultPGDelay      = "pg-delay"             // a holder's Postgres link gets latency beyond the lease
)

// FaultKinds lists every fault kind, in report order.
var FaultKinds = []string{
	FaultSigstop, FaultSigkill, FaultRedisPause, FaultRedisRestart, FaultFlushAll,
	FaultRedisBlack, FaultRedisCut, FaultPGRestart, FaultPGDelay,
}

// Fault is one injected fault, as recorded by the nemesis.
type Fault struct {
	Kind   string `json:"kind"`
	At     int64  `json:"at"`      // injection time, Unix ns
	HealAt int64  `json:"heal_at"` // when it was undone (== At for instant faults)
	Victim int    `json:"victim"`  // worker id, or -1 for a server fault
	// Held is who held which lock when the fault began.
	Held []Holding `json:"held"`
	// Param is the fault's size (pause length, delay), for the report.
	Param time.Duration `json:"param"`
	// Node is the cluster node a cluster fault hit, and Resources the
	// trial's resources that node served when it began.
	Node      string   `json:"node,omitempty"`
	Resources []string `json:"resources,omitempty"`
	Err       string   `json:"err,omitempty"`
}

// Holding is one lock held at some moment.
type Holding struct {
	Resource string `json:"res"`
	Worker   int    `json:"w"`
	Token    int64  `json:"tok"`
}

// holders replays the events to find who holds what now.
func holders(events []Event) []Holding {
	cur := map[string]Holding{}
	for _, e := range events {
		switch e.Type {
		case evAcquire:
			cur[e.Resource] = Holding{Resource: e.Resource, Worker: e.Worker, Token: e.Token}
		case evRelease, evLost:
			if h, ok := cur[e.Resource]; ok && h.Token == e.Token && h.Worker == e.Worker {
				delete(cur, e.Resource)
			}
		}
	}
	out := make([]Holding, 0, len(cur))
	for _, h := range cur {
		out = append(out, h)
	}
	return out
}

// affected says which holders at the fault are expected to lose their lock
// (or whose writes are disturbed) because of it.
func (f Fault) affected() []Holding {
	if f.Node != "" {
		var out []Holding
		for _, h := range f.Held {
			if contains(f.Resources, h.Resource) {
				out = append(out, h)
			}
		}
		return out
	}
	if f.Victim < 0 {
		return f.Held
	}
	var out []Holding
	for _, h := range f.Held {
		if h.Worker == f.Victim {
			out = append(out, h)
		}
	}
	return out
}

// inject runs one fault of kind against the trial and heals it. It blocks
// for the fault's duration.
func (t *trial) inject(ctx context.Context, kind string, rng *rand.Rand) Fault {
	L := t.cfg.Lease
	scale := func(lo, hi float64) time.Duration {
		return time.Duration((lo + rng.Float64()*(hi-lo)) * float64(L))
	}
	f := Fault{Kind: kind, Victim: -1}
	held := holders(t.rec.Events())
	f.Held = held
	pickVictim := func() *proc {
		alive := t.alive()
		var holding []*proc
		for _, p := range alive {
			for _, h := range held {
				if h.Worker == p.id {
					holding = append(holding, p)
					break
				}
			}
		}
		switch {
		case len(holding) > 0:
			return holding[rng.IntN(len(holding))]
		case len(alive) > 0:
			return alive[rng.IntN(len(alive))]
		}
		return nil
	}
	now := func() int64 { return time.Now().UnixNano() }
	var err error
	switch kind {
	case FaultSigstop:
		// Stop a holder in the middle of an operation (between its read
		// and its write), the moment a stale write is born; wait a little
		// for one if nobody is inside an operation right now.
		p := t.waitInFlight(ctx, 2*L, rng)
		if p == nil {
			p = pickVictim()
		} else {
			f.Held = holders(t.rec.Events())
		}
		if p == nil {
			err = fmt.Errorf("no worker alive")
			break
		}
		f.Victim = p.id
		f.At = now()
		if err = p.cmd.Process.Signal(syscall.SIGSTOP); err == nil {
			// Beyond the lease, then resume at the worst moment: when a
			// new holder of one of the victim's resources is inside its
			// operation (after its read, before its commit), so that the
			// victim's late commit races it. Give up waiting at 4 leases.
			sleepCtx(ctx, scale(1.2, 1.6))
			t.waitTakeoverInFlight(ctx, f, time.Unix(0, f.At).Add(4*L), L/40)
			err = p.cmd.Process.Signal(syscall.SIGCONT)
		}
		f.HealAt = now()
		f.Param = time.Duration(f.HealAt - f.At)
	case FaultSigkill:
		p := pickVictim()
		if p == nil {
			err = fmt.Errorf("no worker alive")
			break
		}
		f.Victim = p.id
		f.At = now()
		err = p.cmd.Process.Signal(syscall.SIGKILL)
		f.HealAt = f.At
		<-p.done
		// Keep the pressure on: a new worker takes the dead one's place.
		if _, serr := t.spawn(ctx, p.contender); serr != nil && err == nil {
			err = serr
		}
	case FaultRedisPause:
		f.Param = scale(1.5, 3)
		f.At = now()
		if err = t.env.redis.Pause(); err == nil {
			sleepCtx(ctx, f.Param)
			err = t.env.redis.Resume()
		}
		f.HealAt = now()
	case FaultRedisRestart:
		f.At = now()
		err = t.env.redis.Restart(false)
		f.HealAt = now()
	case FaultFlushAll:
		f.At = now()
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = t.env.redis.Flush(fctx)
		cancel()
		f.HealAt = f.At
	case FaultRedisBlack, FaultRedisCut:
		p := pickVictim()
		if p == nil {
			err = fmt.Errorf("no worker alive")
			break
		}
		f.Victim, f.Param = p.id, scale(2, 3)
		f.At = now()
		if kind == FaultRedisBlack {
			p.redisProxy.Blackhole()
		} else {
			p.redisProxy.Cut()
		}
		sleepCtx(ctx, f.Param)
		p.redisProxy.Restore()
		f.HealAt = now()
	case FaultPGRestart:
		f.At = now()
		err = t.env.pg.Restart()
		f.HealAt = now()
	case FaultPGDelay:
		p := pickVictim()
		if p == nil {
			err = fmt.Errorf("no worker alive")
			break
		}
		f.Victim, f.Param = p.id, scale(1.5, 2.5)
		f.At = now()
		p.pgProxy.Delay(f.Param)
		sleepCtx(ctx, scale(2, 3))
		p.pgProxy.Restore()
		f.HealAt = now()
	case FaultClusterKill, FaultClusterStall, FaultClusterLossy, FaultClusterCut, FaultClusterReplicaStall:
		err = t.injectCluster(ctx, &f, rng)
	default:
		err = fmt.Errorf("unknown fault kind %q", kind)
	}
	if err != nil {
		f.Err = err.Error()
	}
	return f
}

// waitInFlight returns an alive worker (chosen by rng among those) with an
// operation invoked and not completed, polling for up to limit; nil if
// none showed up.
func (t *trial) waitInFlight(ctx context.Context, limit time.Duration, rng *rand.Rand) *proc {
	end := time.Now().Add(limit)
	for ctx.Err() == nil && time.Now().Before(end) {
		open := map[int]int{}
		for _, e := range t.rec.Events() {
			switch e.Type {
			case evInvoke:
				open[e.Worker]++
			case evComplete:
				open[e.Worker]--
			}
		}
		var busy []*proc
		for _, p := range t.alive() {
			if open[p.id] > 0 {
				busy = append(busy, p)
			}
		}
		if len(busy) > 0 {
			return busy[rng.IntN(len(busy))]
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

// waitTakeoverInFlight waits until another worker has acquired one of the
// resources the victim held at the fault and has had an operation on it
// in flight for at least age, or until the deadline.
func (t *trial) waitTakeoverInFlight(ctx context.Context, f Fault, deadline time.Time, age time.Duration) {
	mine := map[string]bool{}
	for _, h := range f.affected() {
		mine[h.Resource] = true
	}
	for ctx.Err() == nil && time.Now().Before(deadline) {
		open := map[string]Event{} // op id -> invoke on one of the victim's resources by another worker
		for _, e := range t.rec.Events() {
			switch {
			case e.Type == evInvoke && e.At > f.At && e.Worker != f.Victim && mine[e.Resource]:
				open[e.Op] = e
			case e.Type == evComplete:
				delete(open, e.Op)
			}
		}
		for _, e := range open {
			if time.Since(time.Unix(0, e.At)) >= age {
				return
			}
		}
		time.Sleep(time.Millisecond)
	}
}
