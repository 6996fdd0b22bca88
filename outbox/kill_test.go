package outbox_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/outbox/outboxtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two relays, one of them a process SIGKILLed at random points and
// started again: no effect is lost; a fenced receiver applies each once;
// an unfenced one sees duplicates, at most the relay's concurrency per kill; rows a
// killed relay held are sent again once its claim's visibility timeout
// has passed, not before. The long version of this runs in make chaos.
func TestRelayKilled(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	fenced, applied := fencedReceiver(t)
	plain := newReceiver(t, func(r *http.Request, n int) int {
		time.Sleep(2 * time.Millisecond) // sends overlap the kills
		return http.StatusOK
	})
	const n, batch = 600, 16
	for i := range n {
		require.NoError(t, raw(ctx, db.Pool, "r", 1, "h",
			outbox.Effect{Destination: plain.URL, Key: fmt.Sprintf("p%d", i)},
			outbox.Effect{Destination: fenced.URL, Key: fmt.Sprintf("f%d", i)}))
	}
	cfg := outboxtest.RelayConfig{URL: db.URL, Batch: batch, Visibility: 2 * time.Second, Poll: 20 * time.Millisecond}
	// The relay that is killed starts first, so that it holds rows.
	kills := 0
	deadline := time.Now().Add(40 * time.Second)
	var stable *outbox.Relay
	for ; kills < 6 && time.Now().Before(deadline); kills++ {
		p := outboxtest.RelayProcess(t, cfg)
		time.Sleep(time.Duration(100+rand.IntN(400)) * time.Millisecond)
		p.Kill()
		if stable == nil {
			stable = startRelay(t, db.Pool, httpSender(t), cfg.Options()...)
		}
	}
	eventually(t, func() bool { all, _ := rows(t, db.Pool); return all == 0 }, "every effect delivered")

	keys := plain.keys()
	dups := 0
	for i := range n {
		c := keys[fmt.Sprintf("p%d", i)]
		require.Positive(t, c, "p%d lost", i)
		dups += c - 1
	}
	t.Logf("%d kills, %d duplicates at the unfenced receiver (at most %d allowed)", kills, dups, kills*batch)
	assert.LessOrEqual(t, dups, kills*batch)
	// A duplicate comes from a claim that outlived its relay: it is sent
	// again only after the claim's visibility timeout, and the first send
	// happened within the send timeout of the claim.
	first := map[string]time.Time{}
	var minGap, maxGap time.Duration
	for _, g := range plain.deliveries() {
		at, ok := first[g.key]
		if !ok {
			first[g.key] = g.at
			continue
		}
		gap := g.at.Sub(at)
		if minGap == 0 || gap < minGap {
			minGap = gap
		}
		maxGap = max(maxGap, gap)
		assert.GreaterOrEqual(t, gap, cfg.Visibility-cfg.Visibility/4-50*time.Millisecond, "%s sent again %v after its first send", g.key, gap)
	}
	t.Logf("redeliveries came %v to %v after the first send (visibility %v, poll %v)", minGap, maxGap, cfg.Visibility, cfg.Poll)
	got := applied()
	for i := range n {
		assert.Equal(t, 1, got[fmt.Sprintf("f%d", i)], "f%d applied once at the fenced receiver", i)
	}
}
