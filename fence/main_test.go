package fence_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(holderProcEnv) != "" {
		holderProcess() // a child of TestReacquireFromAnotherProcess
		return
	}
	if os.Getenv(waiterProcEnv) != "" {
		waiterProcess() // a child of the waiter-crash tests
		return
	}
	if os.Getenv(leaderProcEnv) != "" {
		leaderProcess() // a child of the election tests
		return
	}
	testenv.Main(m)
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newClient returns a fence client on rdb whose keys carry the test's
// unique prefix; it is closed at the end of the test.
func newClient(t testing.TB, r *testenv.Redis, rdb fence.RedisClient, opts ...fence.ClientOption) *fence.Client {
	t.Helper()
	if rdb == nil {
		rdb = r.Client()
	}
	c, err := fence.New(rdb, append([]fence.ClientOption{fence.WithPrefix(r.Prefix + "fence:")}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// lockKey is the lock's key for a client made by newClient.
func lockKey(r *testenv.Redis, name string) string { return r.Prefix + "fence:{" + name + "}" }

// waitSubscribers waits until the lock's release channel has n
// subscribers (a waiter has subscribed, or has left with n == 0).
func waitSubscribers(t testing.TB, r *testenv.Redis, name string, n int64, msgAndArgs ...any) {
	t.Helper()
	ch := lockKey(r, name) + ":ch"
	require.Eventually(t, func() bool {
		got, err := r.Client().PubSubNumSub(context.Background(), ch).Result()
		return err == nil && got[ch] == n
	}, 10*time.Second, 5*time.Millisecond, msgAndArgs...)
}

// readLock reads a lock key's value '<token>:<holder>' as the scripts
// store it; the key must exist.
func readLock(t testing.TB, rdb *redis.Client, key string) (holder string, token int64) {
	t.Helper()
	v, err := rdb.Get(context.Background(), key).Result()
	require.NoError(t, err, "lock key %s", key)
	tok, holder, ok := strings.Cut(v, ":")
	require.True(t, ok, "lock value %q is not <token>:<holder>", v)
	token, err = strconv.ParseInt(tok, 10, 64)
	require.NoError(t, err, "lock value %q", v)
	return holder, token
}

// recorder is an Observer that records every event.
type recorder struct {
	mu     sync.Mutex
	counts map[string]int
	events []any
	at     []time.Time   // when each event arrived
	notify chan struct{} // cap 1: an event arrived
}

func newRecorder() *recorder {
	return &recorder{counts: map[string]int{}, notify: make(chan struct{}, 1)}
}

func (r *recorder) add(kind string, e any) {
	r.mu.Lock()
	r.counts[kind]++
	r.events = append(r.events, e)
	r.at = append(r.at, time.Now())
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

func (r *recorder) count(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[kind]
}

// waitCount waits until n events of kind arrived.
func (r *recorder) waitCount(t testing.TB, kind string, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return r.count(kind) >= n }, 20*time.Second, time.Millisecond,
		"waiting for %d %s events", n, kind)
}

// mark records a step of the test itself (a fault injected, say) among
// the events, for timeline.
func (r *recorder) mark(step string) { r.add("mark", step) }

// timeline lists the events and marks with their arrival in ms after
// since, and each renewal's round trip, error and deadline: what a
// failed timing-dependent assertion needs to tell a slow machine from a
// fault.
func (r *recorder) timeline(since time.Time) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	ms := func(t time.Time) int64 { return t.Sub(since).Milliseconds() }
	for i, e := range r.events {
		fmt.Fprintf(&b, "\n%6d ms ", ms(r.at[i]))
		switch e := e.(type) {
		case string:
			fmt.Fprintf(&b, "test: %s", e)
		case fence.RenewEvent:
			fmt.Fprintf(&b, "renewal: rtt %v, deadline at %d ms, err %v", e.Duration.Round(time.Millisecond), ms(e.Deadline), e.Err)
		default:
			fmt.Fprintf(&b, "%T %+v", e, e)
		}
	}
	return b.String()
}

// all returns the recorded events of type E.
func all[E any](r *recorder) []E {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []E
	for _, e := range r.events {
		if x, ok := e.(E); ok {
			out = append(out, x)
		}
	}
	return out
}

func (r *recorder) OnAcquire(_ context.Context, e fence.AcquireEvent) {
	if e.Err == nil {
		r.add("acquired", e)
	} else {
		r.add("notAcquired", e)
	}
}
func (r *recorder) OnWait(_ context.Context, e fence.WaitEvent) { r.add("waiting", e) }
func (r *recorder) OnLongWait(_ context.Context, e fence.LongWaitEvent) {
	r.add("longWait", e)
}
func (r *recorder) OnRenew(_ context.Context, e fence.RenewEvent) {
	if e.Err == nil {
		r.add("renewed", e)
	} else {
		r.add("renewalFailed", e)
	}
}
func (r *recorder) OnLoss(_ context.Context, e fence.LossEvent)       { r.add("lost", e) }
func (r *recorder) OnRelease(_ context.Context, e fence.ReleaseEvent) { r.add("released", e) }

var (
	_ fence.AcquireObserver  = (*recorder)(nil)
	_ fence.WaitObserver     = (*recorder)(nil)
	_ fence.LongWaitObserver = (*recorder)(nil)
	_ fence.RenewObserver    = (*recorder)(nil)
	_ fence.LossObserver     = (*recorder)(nil)
	_ fence.ReleaseObserver  = (*recorder)(nil)
)

// doneAt records when a lock's context was cancelled.
func doneAt(l *fence.Lock) <-chan time.Time {
	ch := make(chan time.Time, 1)
	go func() {
		<-l.Done()
		ch <- time.Now()
	}()
	return ch
}

// proxied starts a testenv.Proxy in front of addr and a go-redis client
// through it, made from opts with Addr set to the proxy's: a test then
// injects the proxy's faults (cut, blackhole, drop, delay) between fence
// and the server. Both are closed when t ends.
func proxied(t testing.TB, addr string, opts redis.Options) (*testenv.Proxy, *redis.Client) {
	t.Helper()
	p, err := testenv.NewProxy(addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	opts.Addr = p.Addr
	rdb := redis.NewClient(&opts)
	t.Cleanup(func() { _ = rdb.Close() })
	return p, rdb
}
