package fence

import (
	"context"
	"testing"

	"github.com/fencelock/fencelock/testenv"
)

// BenchmarkScriptsAcquireRelease is BenchmarkAcquireRelease's floor: the
// same two script calls (a client's acquire.lua in try mode and its
// release.lua, with the keys and arguments TryAcquire and Release send)
// from a bare loop on the same kind of go-redis client, without the
// Client around them. One pattern runs both,
// -bench '^Benchmark(Scripts)?AcquireRelease$', so that benchstat
// compares them from one run: what fence's client adds to its scripts'
// round trips.
func BenchmarkScriptsAcquireRelease(b *testing.B) {
	r := testenv.NewRedis(b)
	ctx := context.Background()
	c, err := New(r.Client(), WithPrefix(r.Prefix+"fence:"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(ctx)
	k := keysFor(c.cfg.prefix, "bench")
	b.ReportAllocs()
	for b.Loop() {
		args := acquireArgs(&c.cfg, newHolderID(), modeTry)
		v, err := c.scripts.acquire.Run(ctx, c.rdb, k.scriptKeys(), args...).Result()
		if err != nil {
			b.Fatal(err)
		}
		value, ok := v.(string)
		if !ok {
			b.Fatalf("acquire.lua answered %v, want the lock's value: the name is never contended", v)
		}
		n, err := c.scripts.release.Run(ctx, c.rdb, k.scriptKeys(), value).Int64()
		if err != nil {
			b.Fatal(err)
		}
		if n != releaseOK {
			b.Fatalf("release.lua answered %d, want %d (released, nobody queued)", n, releaseOK)
		}
	}
}
