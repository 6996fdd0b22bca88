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
	commits, counters := fmt.Sprintf("guardtest_commits_%d", n), fmt.Sprintf("guardtest_counters_%d", n)
	s.exec(t, "CREATE TABLE "+commits+" (resource text, seq bigint, token bigint, PRIMARY KEY (resource, seq))")
	s.exec(t, "CREATE TABLE "+counters+" (resource text PRIMARY KEY, n bigint NOT NULL)")
	resources := []string{fmt.Sprintf("guardtest:order:%d:a", n), fmt.Sprintf("guardtest:order:%d:b", n)}
	for _, r := range resources {
		s.exec(t, "INSERT INTO "+counters+" VALUES ($1, 0)", r)
	}
	const stores, writers, iterations = 4, 12, 12
	ss := make([]guard.Store[Tx], stores)
	for i := range ss {
		ss[i] = s.db.NewStore(t)
	}
	var (
		next      [2]atomic.Int64 // the lock server: one counter per resource
		committed [2]atomic.Int64
		refused   atomic.Int64
		wg        sync.WaitGroup
		mu        sync.Mutex
		failures  []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			store := ss[w%stores]
			for i := range iterations {
				ri := rng.IntN(len(resources))
				res := resources[ri]
				l := Lease{res, next[ri].Add(1), fmt.Sprintf("w%d-%d", w, i)}
				if adv, ok := store.(Advancer); ok && rng.IntN(4) == 0 {
					if err := adv.Advance(ctx, l); err != nil && !errors.Is(err, guard.ErrStaleToken) {
						fail("Advance %+v: %v", l, err)
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
					n, err := s.db.TxQueryInt(ctx, tx, "UPDATE "+counters+" SET n = n + 1 WHERE resource = $1 RETURNING n", res)
					if err != nil {
						return err
					}
					return s.db.TxExec(ctx, tx, "INSERT INTO "+commits+" VALUES ($1, $2, $3)", res, n, l.Tok)
				})
				if err == nil {
					committed[ri].Add(1)
					continue
				}
				var se *guard.StaleTokenError
				if !errors.As(err, &se) || se.Current <= l.Tok {
					fail("Exec %+v: want a refusal naming a newer token, got %v", l, err)
					return
				}
				refused.Add(1)
			}
		}()
	}
	wg.Wait()
	for _, f := range failures {
		t.Error(f)
	}
	var total int64
	for ri, res := range resources {
		var last int64
		var seq int64
		for seq = 1; ; seq++ {
			tok, err := s.db.QueryInt(ctx, "SELECT coalesce((SELECT token FROM "+commits+" WHERE resource = $1 AND seq = $2), -1)", res, seq)
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
		if got != committed[ri].Load() {
			t.Errorf("%s: %d commits logged, %d Execs succeeded", res, got, committed[ri].Load())
		}
		if c := s.count(t, "SELECT n FROM "+counters+" WHERE resource = $1", res); c != got {
			t.Errorf("%s: counter %d, log %d: lost update", res, c, got)
		}
		if rows := s.count(t, "SELECT count(*) FROM "+commits+" WHERE resource = $1", res); rows != got {
			t.Errorf("%s: log has %d rows, %d in sequence", res, rows, got)
		}
		total += got
	}
	t.Logf("commits %d, refusals %d", total, refused.Load())
	// The check means something only if both outcomes happened.
	if total == 0 || refused.Load() == 0 {
		t.Errorf("commits %d, refusals %d: the run did not exercise both outcomes", total, refused.Load())
	}
}
