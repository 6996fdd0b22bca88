package guardtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
)

// The invariant: committed tokens per resource never decrease in commit
// order. Twelve writers on four stores take tokens from one counter per
// resource (as the lock hands them out) and pause a little before writing,
// so lower tokens often arrive late. Each commit bumps a per-resource
// counter row, which orders commits, and logs its token at that position;
// the log must never go back, lose an update, or hold a row for a
// refused Exec, and every refusal must name a newer token.
func (s *suite[Tx]) commitOrder(t *testing.T) {
	ctx := ctxFor(t)
	n := s.n.Add(1)
	o := &orderRun[Tx]{
		s:         s,
		commits:   fmt.Sprintf("guardtest_commits_%d", n),
		counters:  fmt.Sprintf("guardtest_counters_%d", n),
		resources: []string{fmt.Sprintf("guardtest:order:%d:a", n), fmt.Sprintf("guardtest:order:%d:b", n)},
	}
	s.exec(t, "CREATE TABLE "+o.commits+" (resource text, seq bigint, token bigint, PRIMARY KEY (resource, seq))")
	s.exec(t, "CREATE TABLE "+o.counters+" (resource text PRIMARY KEY, n bigint NOT NULL)")
	for _, r := range o.resources {
		s.exec(t, "INSERT INTO "+o.counters+" VALUES ($1, 0)", r)
	}
	const stores, writers = 4, 12
	ss := make([]guard.Store[Tx], stores)
	for i := range ss {
		ss[i] = s.db.NewStore(t)
	}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o.write(ctx, ss[w%stores], w)
		}()
	}
	wg.Wait()
	for _, f := range o.failures {
		t.Error(f)
	}
	var total int64
	for ri := range o.resources {
		total += o.check(t, ctx, ri)
	}
	t.Logf("commits %d, refusals %d", total, o.refused.Load())
	// The check means something only if both outcomes happened.
	if total == 0 || o.refused.Load() == 0 {
		t.Errorf("commits %d, refusals %d: the run did not exercise both outcomes", total, o.refused.Load())
	}
}

// orderRun is one run of the commit-order check: its tables, resources,
// the lock server's counters and what the writers saw.
type orderRun[Tx any] struct {
	s                 *suite[Tx]
	commits, counters string
	resources         []string
	next, committed   [2]atomic.Int64 // next: the lock server, one counter per resource
	refused           atomic.Int64
	mu                sync.Mutex
	failures          []string
}

func (o *orderRun[Tx]) fail(format string, args ...any) {
	o.mu.Lock()
	o.failures = append(o.failures, fmt.Sprintf(format, args...))
	o.mu.Unlock()
}

// write is writer w's iterations on store: a token from the resource's
// counter, sometimes an Advance, a pause, then a guarded write that logs
// its token at the position the counter row gives it.
func (o *orderRun[Tx]) write(ctx context.Context, store guard.Store[Tx], w int) {
	const iterations = 12
	rng := rand.New(rand.NewPCG(uint64(w), 7))
	for i := range iterations {
		ri := rng.IntN(len(o.resources))
		res := o.resources[ri]
		l := Lease{res, o.next[ri].Add(1), fmt.Sprintf("w%d-%d", w, i)}
		if adv, ok := store.(Advancer); ok && rng.IntN(4) == 0 {
			if err := adv.Advance(ctx, l); err != nil && !errors.Is(err, guard.ErrStaleToken) {
				o.fail("Advance %+v: %v", l, err)
				return
			}
		}
		time.Sleep(time.Duration(rng.IntN(1500)) * time.Microsecond)
		// A pause inside fn, before the counter row is locked, lets
		// newer holders begin and commit while this one is open:
		// only the store's check at commit keeps the order then.
		pause := time.Duration(rng.IntN(1000)) * time.Microsecond
		_, err := guard.Exec(ctx, store, l, func(ctx context.Context, tx Tx) error {
			time.Sleep(pause)
			n, err := o.s.db.TxQueryInt(ctx, tx, "UPDATE "+o.counters+" SET n = n + 1 WHERE resource = $1 RETURNING n", res)
			if err != nil {
				return err
			}
			return o.s.db.TxExec(ctx, tx, "INSERT INTO "+o.commits+" VALUES ($1, $2, $3)", res, n, l.Tok)
		})
		if err == nil {
			o.committed[ri].Add(1)
			continue
		}
		var se *guard.StaleTokenError
		if !errors.As(err, &se) || se.Current <= l.Tok {
			o.fail("Exec %+v: want a refusal naming a newer token, got %v", l, err)
			return
		}
		o.refused.Add(1)
	}
}

// check reads resource ri's commit log in commit order: its tokens never
// go back, it has a row per successful Exec and no other, and the counter
// lost no update. It returns the number of commits.
func (o *orderRun[Tx]) check(t *testing.T, ctx context.Context, ri int) int64 {
	res := o.resources[ri]
	var last, seq int64
	for seq = 1; ; seq++ {
		tok, err := o.s.db.QueryInt(ctx, "SELECT coalesce((SELECT token FROM "+o.commits+" WHERE resource = $1 AND seq = $2), -1)", res, seq)
		if err != nil {
			t.Fatal(err)
		}
		if tok < 0 {
			break
		}
		if tok < last {
			t.Fatalf("%s: token went back at commit %d: %d after %d", res, seq, tok, last)
		}
		last = tok
	}
	got := seq - 1
	if got != o.committed[ri].Load() {
		t.Errorf("%s: %d commits logged, %d Execs succeeded", res, got, o.committed[ri].Load())
	}
	if c := o.s.count(t, "SELECT n FROM "+o.counters+" WHERE resource = $1", res); c != got {
		t.Errorf("%s: counter %d, log %d: lost update", res, c, got)
	}
	if rows := o.s.count(t, "SELECT count(*) FROM "+o.commits+" WHERE resource = $1", res); rows != got {
		t.Errorf("%s: log has %d rows, %d in sequence", res, rows, got)
	}
	return got
}
