package fence_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// 100 observers, on 4 clients, see every term of an election in order,
// with no gap and nothing marked missed: handovers (a new term, no
// vacancy between), proclaims and resignations with nobody waiting (a
// vacancy), from the state before the first term.
func TestObserveEveryTermInOrder(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 2*time.Minute)
	const clients, perClient, rounds = 4, 25, 12
	var chans []<-chan fence.LeaderEvent
	for range clients {
		e := newElection(t, r, "ordered")
		for range perClient {
			ch, err := e.Observe(ctx)
			require.NoError(t, err)
			chans = append(chans, ch)
		}
	}
	// Every observer's first event is the state: vacant, nothing known.
	// Reading it also makes sure every observer watches before the first
	// term.
	for _, ch := range chans {
		require.Equal(t, fence.LeaderEvent{Vacant: true}, nextEvent(t, ctx, ch))
	}

	want := []fence.LeaderEvent{}
	elected := func(l *fence.Lock, v string) fence.LeaderEvent {
		return fence.LeaderEvent{Holder: l.Holder(), Token: l.Token(), Value: v}
	}
	a, b := newElection(t, r, "ordered"), newElection(t, r, "ordered")
	var term *fence.Lock
	value := ""
	for i := range rounds {
		if term == nil {
			var err error
			value = fmt.Sprintf("v%d", i)
			term, err = a.Campaign(ctx, value)
			require.NoError(t, err)
			want = append(want, elected(term, value))
		}
		if i%3 == 1 {
			value += "'"
			require.NoError(t, a.Proclaim(ctx, term, value))
			want = append(want, elected(term, value))
		}
		if i%2 == 0 { // hand over to a waiting candidate
			next := fmt.Sprintf("v%d", i+1)
			w := campaignAsync(ctx, b, next)
			waitQueued(t, r, "ordered", 1)
			require.NoError(t, term.Release(ctx))
			got := <-w
			require.NoError(t, got.err)
			term, value = got.l, next
			want = append(want, elected(term, value))
			a, b = b, a
			continue
		}
		require.NoError(t, term.Release(ctx))
		ev := elected(term, value)
		ev.Vacant, ev.Ended = true, fence.TermResigned
		want = append(want, ev)
		term = nil
	}
	if term != nil {
		require.NoError(t, term.Release(ctx))
		ev := elected(term, value)
		ev.Vacant, ev.Ended = true, fence.TermResigned
		want = append(want, ev)
	}

	var wg sync.WaitGroup
	for i, ch := range chans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j, w := range want {
				select {
				case ev := <-ch:
					if !assert.Equal(t, w, ev, "observer %d, event %d", i, j) {
						return
					}
				case <-ctx.Done():
					t.Errorf("observer %d: no event %d of %d", i, j, len(want))
					return
				}
			}
		}()
	}
	wg.Wait()
}

// A resignation with nobody waiting reaches an observer as a vacancy
// from its message, not from a read at the term's expiry: with a term
// lease of a minute, it arrives long before.
func TestObserveResignation(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 30*time.Second)
	e := newElection(t, r, "resign", fence.WithLease(time.Minute))
	events, err := e.Observe(ctx)
	require.NoError(t, err)
	require.True(t, nextEvent(t, ctx, events).Vacant)
	term, err := e.Campaign(ctx, "v")
	require.NoError(t, err)
	require.Equal(t, term.Token(), nextEvent(t, ctx, events).Token)
	start := time.Now()
	require.NoError(t, term.Release(ctx))
	ev := nextEvent(t, ctx, events)
	t.Logf("resignation observed in %v", time.Since(start))
	assert.Equal(t, fence.LeaderEvent{Holder: term.Holder(), Token: term.Token(), Value: "v", Vacant: true, Ended: fence.TermResigned}, ev)
}

// Redis restarts without its data while a leader holds a term: the
// observer says it cannot read the election, then, once Redis answers,
// the state (vacant: the term was lost with the data) marked as possibly
// having missed terms; the next term follows without a mark.
func TestObserveRedisRestartWithoutPersistence(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 60*time.Second)
	e := newElection(t, r, "restart", fence.WithLease(time.Second))
	events, err := newElection(t, r, "restart").Observe(ctx)
	require.NoError(t, err)
	require.True(t, nextEvent(t, ctx, events).Vacant)
	term, err := e.Campaign(ctx, "before")
	require.NoError(t, err)
	require.Equal(t, term.Token(), nextEvent(t, ctx, events).Token)

	require.NoError(t, r.Restart(false))
	ev := nextEvent(t, ctx, events)
	for ev.Err != nil { // while Redis cannot be read
		assert.Zero(t, ev.Token, "an error event names no leader")
		ev = nextEvent(t, ctx, events)
	}
	assert.Equal(t, fence.LeaderEvent{Holder: term.Holder(), Token: term.Token(), Value: "before", Vacant: true, Missed: true}, ev,
		"the state after the restart: the term is gone with the data, and terms may have been missed")

	<-term.Done() // its renewal finds it gone
	next, err := e.Campaign(ctx, "after")
	require.NoError(t, err)
	assert.Equal(t, fence.LeaderEvent{Holder: next.Holder(), Token: next.Token(), Value: "after"}, nextEvent(t, ctx, events))
	assert.Greater(t, next.Token(), term.Token())
}

// A consumer that stops reading holds up no other observer; once more
// than a thousand events wait for it, it gets the newest, marked Missed.
func TestObserveSlowConsumer(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 60*time.Second)
	e := newElection(t, r, "slow")
	slow, err := e.Observe(ctx)
	require.NoError(t, err)
	fast, err := e.Observe(ctx)
	require.NoError(t, err)
	require.True(t, nextEvent(t, ctx, fast).Vacant)
	term, err := e.Campaign(ctx, "0")
	require.NoError(t, err)
	require.Equal(t, term.Token(), nextEvent(t, ctx, fast).Token)
	const n = 1100
	for i := 1; i <= n; i++ {
		require.NoError(t, e.Proclaim(ctx, term, fmt.Sprint(i)))
		require.Equal(t, fmt.Sprint(i), nextEvent(t, ctx, fast).Value, "the fast observer keeps up")
	}
	// The slow one: the events before it fell behind, a jump marked
	// Missed, then the rest in order.
	var got []fence.LeaderEvent
	for len(got) == 0 || got[len(got)-1].Value != fmt.Sprint(n) {
		got = append(got, nextEvent(t, ctx, slow))
	}
	missed := 0
	for _, ev := range got {
		if ev.Missed {
			missed++
		}
	}
	assert.Equal(t, 1, missed, "the slow consumer is told once that it missed events")
	assert.Less(t, len(got), n, "what it could not keep was dropped, not queued without bound")
}

// Observe's channel closes when its context ends, and when the client
// closes; Observe on a closed client fails.
func TestObserveCloses(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 30*time.Second)
	c := newClient(t, r, nil)
	e, err := c.Election("closes")
	require.NoError(t, err)
	octx, cancel := context.WithCancel(ctx)
	a, err := e.Observe(octx)
	require.NoError(t, err)
	b, err := e.Observe(ctx)
	require.NoError(t, err)
	nextEvent(t, ctx, a)
	nextEvent(t, ctx, b)
	cancel()
	drained(t, ctx, a)
	require.NoError(t, c.Close(ctx))
	drained(t, ctx, b)
	_, err = e.Observe(ctx)
	assert.ErrorIs(t, err, fence.ErrClosed)
	_, err = e.Campaign(ctx, "v")
	assert.ErrorIs(t, err, fence.ErrClosed)
}

// drained waits until ch is closed.
func drained(t *testing.T, ctx context.Context, ch <-chan fence.LeaderEvent) {
	t.Helper()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-ctx.Done():
			t.Fatal("the observer's channel did not close")
		}
	}
}

// Without pub/sub an observer still follows the election: one whose Redis
// user may not SUBSCRIBE reads it every liveness/3; when the leader's
// user may not PUBLISH, a subscribed observer learns of a resignation at
// its read when the term would have expired, and the record tells it was
// a resignation.
func TestObserveWithoutPubSub(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 60*time.Second)
	admin := r.Client()
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "nosub", "on", ">pw", "~*", "&*", "+@all", "-subscribe", "-ssubscribe").Err())
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "nopub", "on", ">pw", "~*", "&*", "+@all", "-publish", "-spublish").Err())
	quiet := fence.WithLogger(slog.New(slog.DiscardHandler))
	as := func(user string, opts ...fence.LockOption) *fence.Election {
		c := newClient(t, r, r.NewClient(&redis.Options{Username: user, Password: "pw"}), quiet)
		e, err := c.Election("nopubsub", opts...)
		require.NoError(t, err)
		return e
	}

	// An observer that cannot subscribe, a leader whose term lasts a
	// minute: the resignation is found by a poll, long before.
	polled, err := as("nosub", fence.WithLiveness(600*time.Millisecond)).Observe(ctx)
	require.NoError(t, err)
	require.True(t, nextEvent(t, ctx, polled).Vacant)
	long := newElection(t, r, "nopubsub", fence.WithLease(time.Minute))
	term, err := long.Campaign(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, term.Token(), nextEvent(t, ctx, polled).Token)
	require.NoError(t, term.Release(ctx))
	assert.Equal(t, fence.LeaderEvent{Holder: term.Holder(), Token: term.Token(), Value: "a", Vacant: true, Ended: fence.TermResigned},
		nextEvent(t, ctx, polled))

	// A leader that cannot publish: a subscribed observer reads the
	// election when the term would have expired, and finds it resigned.
	events, err := newElection(t, r, "nopubsub", fence.WithLease(time.Second)).Observe(ctx) // it reads every term lease while vacant
	require.NoError(t, err)
	require.True(t, nextEvent(t, ctx, events).Vacant)
	silent := as("nopub", fence.WithLease(time.Second))
	term, err = silent.Campaign(ctx, "b")
	require.NoError(t, err)
	// Unpublished: the observer learns of the term at its poll or read.
	require.Equal(t, term.Token(), nextEvent(t, ctx, events).Token)
	require.NoError(t, term.Release(ctx))
	assert.Equal(t, fence.LeaderEvent{Holder: term.Holder(), Token: term.Token(), Value: "b", Vacant: true, Ended: fence.TermResigned},
		nextEvent(t, ctx, events))
}
