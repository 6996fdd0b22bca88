package fence_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

const leaderProcEnv = "FENCE_TEST_LEADER_PROC"

// leaderProcess is the child of the election tests: it campaigns in
// election $..._NAME with term lease $..._LEASE and value $..._VALUE,
// says "leader <token>" once it leads, and waits to be killed.
func leaderProcess() {
	get := func(k string) string { return os.Getenv(leaderProcEnv + k) }
	lease, _ := time.ParseDuration(get("_LEASE"))
	rdb := redis.NewClient(&redis.Options{Addr: get("")})
	c, err := fence.New(rdb, fence.WithPrefix(get("_PREFIX")))
	if err == nil {
		var e *fence.Election
		if e, err = c.Election(get("_NAME"), fence.WithLease(lease)); err == nil {
			var term *fence.Lock
			if term, err = e.Campaign(context.Background(), get("_VALUE")); err == nil {
				fmt.Println("leader", term.Token())
				select {}
			}
		}
	}
	fmt.Println("error", err)
	os.Exit(1)
}

// startLeader starts a leader process and waits until it leads; it
// returns the process and its term's token.
func startLeader(t *testing.T, r *testenv.Redis, name, value string, lease time.Duration) (*testenv.Child, int64) {
	t.Helper()
	p := testenv.StartChild(t, "leader "+value, leaderProcEnv+"="+r.Addr, leaderProcEnv+"_PREFIX="+r.Prefix+"fence:",
		leaderProcEnv+"_NAME="+name, leaderProcEnv+"_LEASE="+lease.String(), leaderProcEnv+"_VALUE="+value)
	tok, err := strconv.ParseInt(p.Expect("leader", 30*time.Second), 10, 64)
	require.NoError(t, err)
	return p, tok
}

// A leader process is SIGKILLed: its term ends when its lease runs out
// (nothing renews it), and the candidate waiting in this process leads
// within the term's lease plus one heartbeat of the candidate, with a
// greater token; an observer sees the dead leader's term end by expiry,
// then the new term. Without a candidate, a dead leader's vacancy is
// seen when its lease runs out.
func TestLeaderKilled(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 60*time.Second)
	const lease, liveness = time.Second, 1500 * time.Millisecond
	e := newElection(t, r, "killed", fence.WithLease(lease), fence.WithLiveness(liveness))
	events, err := newElection(t, r, "killed").Observe(ctx)
	require.NoError(t, err)
	assert.True(t, nextEvent(t, ctx, events).Vacant)

	p, tok := startLeader(t, r, "killed", "proc-1", lease)
	dead := fence.LeaderEvent{Holder: nextEvent(t, ctx, events).Holder, Token: tok, Value: "proc-1"}
	wb := campaignAsync(ctx, e, "here")
	waitQueued(t, r, "killed", 1)
	killed := time.Now()
	p.Kill()
	got := <-wb
	require.NoError(t, got.err)
	took := got.at.Sub(killed)
	t.Logf("leader SIGKILLed → next leader in %v (term lease %v, candidate heartbeat %v)", took, lease, liveness/3)
	// Generous: the figure itself is measured by the bench.
	assert.Less(t, took, 10*(lease+liveness/3), "the next leader waited far longer than the dead term's lease")
	assert.Greater(t, got.l.Token(), tok)
	expired := dead
	expired.Vacant, expired.Ended = true, fence.TermExpired
	assert.Equal(t, expired, nextEvent(t, ctx, events))
	assert.Equal(t, fence.LeaderEvent{Holder: got.l.Holder(), Token: got.l.Token(), Value: "here"}, nextEvent(t, ctx, events))
	require.NoError(t, got.l.Release(ctx))
	assert.True(t, nextEvent(t, ctx, events).Vacant)

	// No candidate: the vacancy alone, found by the observer's read at
	// the dead term's expiry.
	p, tok = startLeader(t, r, "killed", "proc-2", lease)
	ev := nextEvent(t, ctx, events)
	require.Equal(t, tok, ev.Token)
	killed = time.Now()
	p.Kill()
	ev = nextEvent(t, ctx, events)
	took = time.Since(killed)
	t.Logf("leader SIGKILLed → vacancy observed in %v (term lease %v)", took, lease)
	assert.Equal(t, fence.LeaderEvent{Holder: ev.Holder, Token: tok, Value: "proc-2", Vacant: true, Ended: fence.TermExpired}, ev)
	assert.Less(t, took, 10*(lease+liveness/3))
}
