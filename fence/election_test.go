package fence_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// newElection returns the election name on a new client of r.
func newElection(t testing.TB, r *testenv.Redis, name string, opts ...fence.LockOption) *fence.Election {
	t.Helper()
	e, err := newClient(t, r, nil).Election(name, opts...)
	require.NoError(t, err)
	return e
}

// campaignAsync runs Campaign in a goroutine; the result arrives on the
// channel with the time it returned.
func campaignAsync(ctx context.Context, e *fence.Election, value string) <-chan acquireResult {
	ch := make(chan acquireResult, 1)
	go func() {
		l, err := e.Campaign(ctx, value)
		ch <- acquireResult{l, err, time.Now()}
	}()
	return ch
}

// A campaign on a vacant election wins at once; the leader is read with
// its value, proclaims a new one, and resigns: the election is vacant
// again, and says how its last term ended. The term is a lock: its token
// is the lock's, its context ends with the resignation.
func TestCampaignProclaimResign(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 30*time.Second)
	e := newElection(t, r, "scheduler")
	assert.Equal(t, "scheduler", e.Name())
	_, err := e.Leader(ctx)
	require.ErrorIs(t, err, fence.ErrNoLeader)
	assert.Contains(t, err.Error(), "no term is recorded")

	term, err := e.Campaign(ctx, "10.0.0.7:8080")
	require.NoError(t, err)
	holder, token := readLock(t, r.Client(), lockKey(r, "scheduler"))
	assert.Equal(t, term.Holder(), holder)
	assert.Equal(t, term.Token(), token)
	l, err := e.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, fence.Leader{Holder: term.Holder(), Token: term.Token(), Value: "10.0.0.7:8080", TTL: l.TTL}, l)
	assert.Greater(t, l.TTL, time.Duration(0))
	assert.LessOrEqual(t, l.TTL, fence.DefaultTermLease, "a term's lease is the election's, not the client's")

	require.NoError(t, e.Proclaim(ctx, term, "10.0.0.7:9090"))
	l, err = e.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.7:9090", l.Value)
	assert.Equal(t, term.Token(), l.Token, "a proclaim keeps the term")

	require.NoError(t, term.Release(ctx))
	assert.ErrorIs(t, term.Context().Err(), context.Canceled)
	assert.ErrorIs(t, term.Err(), fence.ErrReleased)
	_, err = e.Leader(ctx)
	require.ErrorIs(t, err, fence.ErrNoLeader)
	assert.Contains(t, err.Error(), "resigned")
	err = e.Proclaim(ctx, term, "late")
	require.ErrorIs(t, err, fence.ErrNotHeld)
	assert.ErrorIs(t, err, fence.ErrReleased)
}

// Candidates of several clients become leaders in the order they
// campaigned; each resignation hands the term to the next in its own
// script (the next leader's value is there at once), with a greater
// token.
func TestCampaignOrderAndHandover(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 60*time.Second)
	lead := newElection(t, r, "jobs")
	term, err := lead.Campaign(ctx, "lead")
	require.NoError(t, err)
	var waits []<-chan acquireResult
	for i, v := range []string{"c1", "c2", "c3"} {
		waits = append(waits, campaignAsync(ctx, newElection(t, r, "jobs"), v))
		waitQueued(t, r, "jobs", int64(i+1))
	}
	for i, v := range []string{"c1", "c2", "c3"} {
		require.NoError(t, term.Release(ctx))
		var got acquireResult
		select {
		case got = <-waits[i]:
		case <-ctx.Done():
			t.Fatalf("candidate %s did not lead after its predecessor resigned", v)
		}
		require.NoError(t, got.err)
		for _, w := range waits[i+1:] {
			select {
			case r := <-w:
				t.Fatalf("a later candidate led before %s: %v", v, r.l)
			default:
			}
		}
		l, err := lead.Leader(ctx)
		require.NoError(t, err)
		assert.Equal(t, v, l.Value, "served in arrival order, its value set by the handover")
		assert.Equal(t, got.l.Token(), l.Token)
		assert.Greater(t, got.l.Token(), term.Token())
		term = got.l
	}
	require.NoError(t, term.Release(ctx))
}

// A candidate waiting behind a leader is in its normal state: its
// Campaign never says it is still waiting (LongWait), while an Acquire of
// the same client, begun after the candidate queued and waiting as long
// behind a holder, says so once.
func TestCampaignSaysNoLongWait(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 60*time.Second)
	logs, rec := newLogWatch(), newRecorder()
	c := newClient(t, r, nil, fence.WithLogger(slog.New(slog.NewTextHandler(logs, nil))), fence.WithObserver(rec),
		fence.WithLongWait(50*time.Millisecond))
	term, err := newElection(t, r, "standby").Campaign(ctx, "lead")
	require.NoError(t, err)
	e, err := c.Election("standby")
	require.NoError(t, err)
	candidate := campaignAsync(ctx, e, "next")
	waitQueued(t, r, "standby", 1)

	held, err := newClient(t, r, nil).Acquire(ctx, "held")
	require.NoError(t, err)
	waiter := make(chan acquireResult, 1)
	go func() { l, err := c.Acquire(ctx, "held"); waiter <- acquireResult{l, err, time.Now()} }()
	logs.waitFor(t, `msg="fence: still waiting for a lock held by another holder" name=held`)

	require.NoError(t, term.Release(ctx))
	got := <-candidate
	require.NoError(t, got.err)
	require.NoError(t, got.l.Release(ctx))
	require.NoError(t, held.Release(ctx))
	w := <-waiter
	require.NoError(t, w.err)
	require.NoError(t, w.l.Release(ctx))
	assert.NotContains(t, logs.String(), "name=standby", "the candidate said nothing of its wait")
	for _, ev := range all[fence.LongWaitEvent](rec) {
		assert.Equal(t, "held", ev.Name, "only the Acquire's wait is reported")
	}
}

// A resignation hands the term over in its own script, not at the end
// of a lease: with a term lease of a minute, the next candidate leads
// long before the old term could have expired.
func TestResignHandsOverWithoutLeaseGap(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 60*time.Second)
	a := newElection(t, r, "gap", fence.WithLease(time.Minute))
	b := newElection(t, r, "gap", fence.WithLease(time.Minute))
	ta, err := a.Campaign(ctx, "a")
	require.NoError(t, err)
	wb := campaignAsync(ctx, b, "b")
	waitQueued(t, r, "gap", 1)
	start := time.Now()
	require.NoError(t, ta.Release(ctx))
	got := <-wb
	require.NoError(t, got.err)
	t.Logf("resign → next campaign returned in %v", got.at.Sub(start))
	assert.Less(t, got.at.Sub(start), 30*time.Second, "the next leader waited for the old term's lease")
	assert.Greater(t, got.l.Token(), ta.Token())
	require.NoError(t, got.l.Release(ctx))
}

// The same candidate id (WithHolder) campaigning again while it leads
// gets its term back, its new value proclaimed.
func TestCampaignSameHolderResumes(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 30*time.Second)
	e := newElection(t, r, "resume", fence.WithHolder("host-a/scheduler"))
	t1, err := e.Campaign(ctx, "v1")
	require.NoError(t, err)
	t2, err := e.Campaign(ctx, "v2")
	require.NoError(t, err)
	assert.Equal(t, t1.Token(), t2.Token())
	l, err := e.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, "v2", l.Value)
	require.NoError(t, t2.Release(ctx))
}

// Bad input is refused before anything is sent, naming what was given.
func TestElectionBadInput(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 30*time.Second)
	c := newClient(t, r, nil)
	_, err := c.Election("")
	assert.ErrorIs(t, err, fence.ErrInvalidName)
	_, err = c.Election("a{b}")
	assert.ErrorIs(t, err, fence.ErrInvalidName)
	_, err = c.Election("x", fence.WithFixedLease(time.Second))
	require.ErrorIs(t, err, fence.ErrInvalidOption)
	assert.Contains(t, err.Error(), "WithFixedLease(1s)")
	_, err = c.Election("x", fence.WithLease(time.Millisecond))
	assert.ErrorIs(t, err, fence.ErrInvalidOption)

	e, err := c.Election("x")
	require.NoError(t, err)
	_, err = e.Campaign(ctx, strings.Repeat("v", fence.MaxValueLen+1))
	require.ErrorIs(t, err, fence.ErrInvalidOption)
	assert.Contains(t, err.Error(), "MaxValueLen")
	other, err := c.Acquire(ctx, "not-an-election")
	require.NoError(t, err)
	err = e.Proclaim(ctx, other, "v")
	require.ErrorIs(t, err, fence.ErrInvalidOption)
	assert.Contains(t, err.Error(), "not a term of this election")
	assert.ErrorIs(t, e.Proclaim(ctx, nil, "v"), fence.ErrNotHeld)
	keys, err := r.Client().Keys(ctx, lockKey(r, "x")+"*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys, "nothing was written")
}

// A campaign whose client cannot reach Redis ends with an error once
// its candidate has been cut off for its liveness (its place in the
// queue is gone), even with a context that never ends, and names the
// network error; it never returns a term.
func TestCampaignRedisDown(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	// Without go-redis's own retries each attempt fails at once: the
	// candidate's liveness is what ends the campaign.
	c := newClient(t, r, r.NewClient(&redis.Options{MaxRetries: -1}))
	e, err := c.Election("down", fence.WithLiveness(500*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, r.Kill())
	start := time.Now()
	term, err := e.Campaign(ctxT(t, time.Minute), "v") // a minute: far longer than it needs, to end the test if it hung
	t.Logf("the campaign ended after %v", time.Since(start))
	require.Error(t, err)
	assert.Nil(t, term)
	assert.ErrorIs(t, err, fence.ErrNotAcquired)
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "it ended by itself, not by a context")
	assert.Contains(t, err.Error(), "connection refused")
	assert.Contains(t, err.Error(), "longer than the candidate's liveness (500ms)")
	assert.NotContains(t, err.Error(), "\n")
	// Close keeps to its deadline, although the campaign's leave may wait
	// for a heartbeat nobody answers (the watchdog stops first).
	closing := time.Now()
	_ = c.Close(ctxT(t, 200*time.Millisecond))
	assert.Less(t, time.Since(closing), 3*time.Second, "Close waited past its deadline (for 5 s, its own bound)")
}

// Redis restarts without its data while a leader holds a term and a
// candidate waits: the candidate joins the queue again and leads with a
// greater token, the old leader's term ends, and Redis holds the new
// leader's term; a campaign started while Redis was down does the same
// once it is back. Never a stale leader.
func TestCampaignAcrossRestartWithoutPersistence(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 60*time.Second)
	opts := []fence.LockOption{fence.WithLease(time.Second), fence.WithLiveness(3 * time.Second)}
	a := newElection(t, r, "restart", opts...)
	b := newElection(t, r, "restart", opts...)
	ta, err := a.Campaign(ctx, "a")
	require.NoError(t, err)
	wb := campaignAsync(ctx, b, "b")
	waitQueued(t, r, "restart", 1)

	require.NoError(t, r.Restart(false))
	got := <-wb
	require.NoError(t, got.err)
	assert.Greater(t, got.l.Token(), ta.Token(), "the new term's token is above the lost one's")
	holder, token := readLock(t, r.Client(), lockKey(r, "restart"))
	assert.Equal(t, got.l.Holder(), holder)
	assert.Equal(t, got.l.Token(), token)
	select {
	case <-ta.Done():
	case <-ctx.Done():
		t.Fatal("the old leader's term did not end")
	}
	assert.ErrorIs(t, ta.Err(), fence.ErrLockLost)
	require.NoError(t, got.l.Release(ctx))

	// A campaign that starts while Redis is down: it waits through the
	// outage (its first attempt failed), and leads once Redis is back.
	rec := newRecorder()
	c := newClient(t, r, nil, fence.WithObserver(rec))
	a2, err := c.Election("restart", opts...)
	require.NoError(t, err)
	require.NoError(t, r.Kill())
	wa := campaignAsync(ctx, a2, "a2")
	rec.waitCount(t, "waiting", 1)
	require.NoError(t, r.Restart(false))
	got = <-wa
	require.NoError(t, got.err)
	assert.Greater(t, got.l.Token(), ta.Token())
	l, err := a.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, fence.Leader{Holder: got.l.Holder(), Token: got.l.Token(), Value: "a2", TTL: l.TTL}, l)
}

// On a Redis Cluster an election's keys share their slot: campaign,
// proclaim, hand over, resign and observe work there as on one server
// (sharded pub/sub for the handover and the observers). The test binary's
// shared cluster: no fault is injected.
func TestElectionCluster(t *testing.T) {
	t.Parallel()
	cl := testenv.SharedRedisCluster(t)
	ctx := ctxT(t, 60*time.Second)
	prefix := uniquePrefix(t)
	open := func() *fence.Election {
		c := newFenceOn(t, cl.NewClient(nil), prefix)
		e, err := c.Election("cluster-jobs")
		require.NoError(t, err)
		return e
	}
	a, b := open(), open()
	events, err := open().Observe(ctx)
	require.NoError(t, err)
	first := nextEvent(t, ctx, events)
	assert.True(t, first.Vacant)

	ta, err := a.Campaign(ctx, "a")
	require.NoError(t, err)
	wb := campaignAsync(ctx, b, "b")
	require.NoError(t, a.Proclaim(ctx, ta, "a2"))
	require.Eventually(t, func() bool {
		n, err := cl.Client().HLen(ctx, prefix+"{cluster-jobs}:w").Result()
		return err == nil && n == 1
	}, 20*time.Second, 5*time.Millisecond)
	require.NoError(t, ta.Release(ctx))
	got := <-wb
	require.NoError(t, got.err)
	require.NoError(t, got.l.Release(ctx))

	want := []fence.LeaderEvent{
		{Holder: ta.Holder(), Token: ta.Token(), Value: "a"},
		{Holder: ta.Holder(), Token: ta.Token(), Value: "a2"},
		{Holder: got.l.Holder(), Token: got.l.Token(), Value: "b"},
		{Holder: got.l.Holder(), Token: got.l.Token(), Value: "b", Vacant: true, Ended: fence.TermResigned},
	}
	for _, w := range want {
		assert.Equal(t, w, nextEvent(t, ctx, events))
	}
}

// nextEvent reads the next event, failing the test at ctx's end.
func nextEvent(t testing.TB, ctx context.Context, ch <-chan fence.LeaderEvent) fence.LeaderEvent {
	t.Helper()
	select {
	case ev, ok := <-ch:
		require.True(t, ok, "the observer's channel closed")
		return ev
	case <-ctx.Done():
		t.Fatal("no event before the test's deadline")
	}
	return fence.LeaderEvent{}
}

// Inspect tells an election's name from a lock's and shows the leader's
// value; an operator's ForceRelease of a term ends it as a resignation
// would: the next candidate leads, and observers see the new term follow
// the old one, nothing missed.
func TestInspectAndForceReleaseTerm(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 30*time.Second)
	c := newClient(t, r, nil)
	e, err := c.Election("ops")
	require.NoError(t, err)
	events, err := e.Observe(ctx)
	require.NoError(t, err)
	require.True(t, nextEvent(t, ctx, events).Vacant)
	lock, err := c.Acquire(ctx, "plain")
	require.NoError(t, err)
	info, err := c.Inspect(ctx, "plain")
	require.NoError(t, err)
	assert.False(t, info.Election)

	stuck, err := e.Campaign(ctx, "stuck")
	require.NoError(t, err)
	require.Equal(t, stuck.Token(), nextEvent(t, ctx, events).Token)
	info, err = c.Inspect(ctx, "ops")
	require.NoError(t, err)
	assert.True(t, info.Election)
	assert.True(t, info.Held)
	assert.Equal(t, fence.LeaderEvent{Holder: stuck.Holder(), Token: stuck.Token(), Value: "stuck"}, info.Term)
	next := campaignAsync(ctx, newElection(t, r, "ops"), "next")
	waitQueued(t, r, "ops", 1)
	woken, err := c.ForceRelease(ctx, info)
	require.NoError(t, err)
	assert.True(t, woken)
	got := <-next
	require.NoError(t, got.err)
	assert.Equal(t, fence.LeaderEvent{Holder: got.l.Holder(), Token: got.l.Token(), Value: "next"}, nextEvent(t, ctx, events))
	require.NoError(t, got.l.Release(ctx))
	info, err = c.Inspect(ctx, "ops")
	require.NoError(t, err)
	assert.Equal(t, fence.LeaderEvent{Holder: got.l.Holder(), Token: got.l.Token(), Value: "next", Vacant: true, Ended: fence.TermResigned}, info.Term)
	require.NoError(t, lock.Release(ctx))
}
