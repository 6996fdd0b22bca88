package fence

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/fencelock/fencelock/testenv"
)

// BenchmarkRenewRound: one watchdog renewal round of 1,000 held locks (one
// pipelined round trip).
func BenchmarkRenewRound(b *testing.B) {
	r := testenv.NewRedis(b)
	ctx := context.Background()
	c, err := New(r.Client(), WithPrefix(r.Prefix+"fence:"), WithLease(time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(ctx)
	const n = 1000
	locks := make([]*Lock, n)
	for i := range locks {
		if locks[i], err = c.TryAcquire(ctx, "r"+strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		res := c.wd.round(append([]*Lock(nil), locks...), nil)
		for i, e := range res.errs {
			if e != nil || res.res[i] != renewOK {
				b.Fatalf("renewal %d: %v %d", i, e, res.res[i])
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/lock")
}
