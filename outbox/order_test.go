package outbox_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/outbox"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Ordered effects of a resource reach the receiver in commit order (by
// token, then by the order they were added), with 16 writers racing for
// three resources' fences and two relays sending many at once; unordered
// effects mixed in do not wait for them. Every committed effect arrives
// once; no refused transaction's effect arrives at all.
func TestOrderedSixteenWriters(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	var inFlight sync.Map // resource -> key being handled
	var overlap atomic.Int32
	rc := newReceiver(t, func(r *http.Request, n int) int {
		res, key := r.Header.Get("Fencing-Resource"), r.Header.Get("Idempotency-Key")
		if strings.HasPrefix(key, "o") {
			if prev, busy := inFlight.LoadOrStore(res, key); busy {
				t.Errorf("%s: %s delivered while %s was still being handled", res, key, prev)
				overlap.Add(1)
			}
			defer inFlight.Delete(res)
		}
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
		return http.StatusOK
	})
	opts := []outbox.RelayOption{outbox.WithBatchSize(16), outbox.WithConcurrency(32), outbox.WithPollInterval(5 * time.Millisecond)}
	startRelay(t, db.Pool, httpSender(t), opts...)
	startRelay(t, db.Pool, httpSender(t), opts...)

	resources := []string{"stock:eu", "stock:us", "stock:apac"}
	var token atomic.Int64
	var mu sync.Mutex
	committed := map[string][]string{} // resource -> ordered keys, in token order
	var refused atomic.Int32
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 15 {
				res := resources[rand.IntN(len(resources))]
				tok := token.Add(1)
				keys := []string{fmt.Sprintf("o%d-a", tok), fmt.Sprintf("o%d-b", tok)}
				err := raw(ctx, db.Pool, res, tok, fmt.Sprintf("w%d", w),
					outbox.Effect{Destination: rc.URL, Key: keys[0], Ordered: true},
					outbox.Effect{Destination: rc.URL, Key: fmt.Sprintf("u%d", tok)},
					outbox.Effect{Destination: rc.URL, Key: keys[1], Ordered: true})
				if err != nil {
					if !strings.Contains(err.Error(), "FL001") {
						t.Error(err)
						return
					}
					refused.Add(1)
					continue
				}
				mu.Lock()
				committed[res] = append(committed[res], keys...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	eventually(t, func() bool { all, _ := rows(t, db.Pool); return all == 0 }, "all delivered")

	got := map[string][]string{}
	seen := map[string]int{}
	for _, g := range rc.deliveries() {
		seen[g.key]++
		if strings.HasPrefix(g.key, "o") {
			got[g.resource] = append(got[g.resource], g.key)
		}
	}
	for k, n := range seen {
		assert.Equal(t, 1, n, "%s delivered once", k)
	}
	// Commits of one resource happen in token order, so the order the
	// writers recorded them in (by token) is the commit order.
	for _, res := range resources {
		want := committed[res]
		sortByToken(want)
		assert.Equal(t, want, got[res], res)
	}
	assert.Zero(t, overlap.Load())
	t.Logf("%d transactions refused as stale, their effects never sent", refused.Load())
	require.Positive(t, refused.Load(), "16 writers racing should have had stale claims refused")
}

// sortByToken sorts keys "o<token>-<a|b>" by token, then suffix.
func sortByToken(keys []string) {
	parse := func(k string) (int64, string) {
		var tok int64
		var suf string
		fmt.Sscanf(strings.Replace(k[1:], "-", " ", 1), "%d %s", &tok, &suf)
		return tok, suf
	}
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0; j-- {
			ti, si := parse(keys[j])
			tj, sj := parse(keys[j-1])
			if ti < tj || ti == tj && si < sj {
				keys[j], keys[j-1] = keys[j-1], keys[j]
			}
		}
	}
}
