package fence

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/testenv"
)

// BenchmarkScriptsAcquireRelease is BenchmarkAcquireRelease's floor: the
// same two script calls (a client's acquire.lua in try mode and its
// release.lua, with the keys and arguments TryAcquire and Release send;
// TestScriptsFloorSendsWhatTheClientSends holds it to that) from a bare
// loop on the same kind of go-redis client, without the Client around
// them. One pattern runs both,
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
		if err := scriptsAcquireRelease(ctx, c, k); err != nil {
			b.Fatal(err)
		}
	}
}

// scriptsAcquireRelease is one round of BenchmarkScriptsAcquireRelease:
// c's acquire.lua in try mode, then its release.lua, on the name of k.
func scriptsAcquireRelease(ctx context.Context, c *Client, k keys) error {
	args := acquireArgs(&c.cfg, newHolderID(), modeTry)
	v, err := c.scripts.acquire.Run(ctx, c.rdb, k.scriptKeys(), args...).Result()
	if err != nil {
		return err
	}
	value, ok := v.(string)
	if !ok {
		return fmt.Errorf("acquire.lua answered %v, want the lock's value: the name is never contended", v)
	}
	n, err := c.scripts.release.Run(ctx, c.rdb, k.scriptKeys(), value).Int64()
	if err != nil {
		return err
	}
	if n != releaseOK {
		return fmt.Errorf("release.lua answered %d, want %d (released, nobody queued)", n, releaseOK)
	}
	return nil
}

// TestScriptsFloorSendsWhatTheClientSends: the benchmark's floor sends
// the commands TryAcquire and Release send, argument for argument but
// the holder id (and the lock's value, which carries it), so that the
// two benchmarks differ by the Client's own code alone.
func TestScriptsFloorSendsWhatTheClientSends(t *testing.T) {
	r := testenv.NewRedis(t)
	ctx := context.Background()
	rdb := r.Client()
	rec := &recordScripts{}
	rdb.AddHook(rec)
	c, err := New(rdb, WithPrefix(r.Prefix+"fence:"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })

	round := func() [][]any {
		l, err := c.TryAcquire(ctx, "bench")
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		return rec.take()
	}
	round() // the scripts are loaded: the rounds below send EVALSHA alone
	client := round()
	k := keysFor(c.cfg.prefix, "bench")
	require.NoError(t, scriptsAcquireRelease(ctx, c, k))
	floor := rec.take()

	require.Len(t, client, 2, "TryAcquire+Release: one acquire.lua, one release.lua")
	require.Len(t, floor, 2, "the floor: one acquire.lua, one release.lua")
	for i, what := range []string{"acquire.lua", "release.lua"} {
		cl, fl := client[i], floor[i]
		require.Len(t, fl, len(cl), "%s: the floor sends %v, the client %v", what, fl, cl)
		holder := 3 + len(k.scriptKeys()) // EVALSHA sha numkeys keys... ARGV[1]
		for j := range cl {
			if j == holder {
				// The holder id (acquire) or the lock's value (release):
				// a new one each time, of the same shape.
				assert.Contains(t, fmt.Sprint(fl[j]), processPart+":", "%s: ARGV[1]", what)
				assert.Contains(t, fmt.Sprint(cl[j]), processPart+":", "%s: ARGV[1]", what)
				continue
			}
			assert.Equal(t, fmt.Sprint(cl[j]), fmt.Sprint(fl[j]), "%s: argument %d (client %v, floor %v)", what, j, cl, fl)
		}
	}
}

// recordScripts records the arguments of the scripts a client sends.
type recordScripts struct {
	mu   sync.Mutex
	cmds [][]any
}

func (h *recordScripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *recordScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := strings.ToLower(cmd.Name()); name == "evalsha" || name == "eval" {
			h.mu.Lock()
			h.cmds = append(h.cmds, cmd.Args())
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}
func (h *recordScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// take returns the scripts recorded since the last take.
func (h *recordScripts) take() [][]any {
	h.mu.Lock()
	defer h.mu.Unlock()
	cmds := h.cmds
	h.cmds = nil
	return cmds
}
