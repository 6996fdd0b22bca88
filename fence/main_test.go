package fence_test

import (
	"context"
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

func TestMain(m *testing.M) { testenv.Main(m) }

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newClient returns a fence client on rdb whose keys carry the test's
// unique prefix; it is closed at the end of the test.
func newClient(t testing.TB, r *testenv.Redis, rdb redis.UniversalClient, opts ...fence.Option) *fence.Client {
	t.Helper()
	if rdb == nil {
		rdb = r.Client()
	}
	c, err := fence.New(rdb, append([]fence.Option{fence.WithPrefix(r.Prefix + "fence:")}, opts...)...)
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

// recorder is an Observer that counts events.
type recorder struct {
	mu     sync.Mutex
	counts map[string]int
	events []string
}

func newRecorder() *recorder { return &recorder{counts: map[string]int{}} }

func (r *recorder) add(kind string, e fence.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[kind]++
	r.events = append(r.events, kind+":"+e.Name)
}

func (r *recorder) count(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[kind]
}

func (r *recorder) Acquired(e fence.Event)      { r.add("acquired", e) }
func (r *recorder) Waited(e fence.Event)        { r.add("waited", e) }
func (r *recorder) Renewed(e fence.Event)       { r.add("renewed", e) }
func (r *recorder) RenewalFailed(e fence.Event) { r.add("renewalFailed", e) }
func (r *recorder) Lost(e fence.Event)          { r.add("lost", e) }
func (r *recorder) Released(e fence.Event)      { r.add("released", e) }

// doneAt records when a lock's context was cancelled.
func doneAt(l *fence.Lock) <-chan time.Time {
	ch := make(chan time.Time, 1)
	go func() {
		<-l.Done()
		ch <- time.Now()
	}()
	return ch
}
