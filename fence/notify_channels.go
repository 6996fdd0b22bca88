package fence

import (
	"iter"
	"slices"
	"time"
)

// The multiplexer's table (see notify.go): this client's channels, each
// with its listeners — the waiters of a lock's name, or the watch of an
// election — and its subscription. Everything here is guarded by
// notifier.mu: every method is called with it held, and none blocks.

// chanTable is the channels of one notifier.
type chanTable struct {
	m map[string]*psChannel
	// unconfirmed counts the SUBSCRIBEs queued per channel whose
	// confirmation has not arrived: after a quick unsubscribe and
	// subscribe, the old confirmation must not pass for the new one. A
	// count outlives the channel's entry (a channel swept, then used
	// again).
	unconfirmed map[string]int
	// idle lists channels in the order their last listener left (entries
	// may be stale: a channel used again, or emptied again later).
	idle []idleChannel
}

// psChannel is one channel of this client: its listeners and its
// subscription. Guarded by notifier.mu.
type psChannel struct {
	waiters   []*waiter // by arrival in this client
	watch     *watch    // an election's observers (its events channel); nil for a lock's channel
	node      *psNode   // nil until a node could be resolved
	confirmed chan struct{}
	isConf    bool
	moved     bool      // subscribed on another node, unconfirmed: missed messages
	stale     bool      // the server dropped it (its slot moved): must move
	err       error     // what the node answered since it was subscribed, while unconfirmed
	idleSince time.Time // when the last listener left; zero while in use
}

type idleChannel struct {
	ch string
	at time.Time
}

func newChanTable() chanTable {
	return chanTable{m: map[string]*psChannel{}, unconfirmed: map[string]int{}}
}

// get returns channel's entry; nil when this client has none.
func (t *chanTable) get(channel string) *psChannel { return t.m[channel] }

// use returns channel's entry, made if missing, and marks it in use (a
// lingering channel is kept).
func (t *chanTable) use(channel string) *psChannel {
	pc := t.m[channel]
	if pc == nil {
		pc = &psChannel{confirmed: make(chan struct{})}
		t.m[channel] = pc
	}
	pc.idleSince = time.Time{}
	return pc
}

// firstWaiter is this client's first waiter of channel; nil when none.
func (t *chanTable) firstWaiter(channel string) *waiter {
	if pc := t.m[channel]; pc != nil && len(pc.waiters) > 0 {
		return pc.waiters[0]
	}
	return nil
}

func (t *chanTable) allWaiters() []*waiter {
	var ws []*waiter
	for _, pc := range t.m {
		ws = append(ws, pc.waiters...)
	}
	return ws
}

// on lists the channels subscribed on nd.
func (t *chanTable) on(nd *psNode) iter.Seq2[string, *psChannel] {
	return func(yield func(string, *psChannel) bool) {
		for ch, pc := range t.m {
			if pc.node == nd && !yield(ch, pc) {
				return
			}
		}
	}
}

// unusedOn reports whether no channel is subscribed on nd.
func (t *chanTable) unusedOn(nd *psNode) bool {
	for range t.on(nd) {
		return false
	}
	return true
}

// attach subscribes pc (channel) on nd: the SUBSCRIBE is queued for nd's
// writer, and pc waits for its confirmation.
func (t *chanTable) attach(channel string, pc *psChannel, nd *psNode) {
	pc.node = nd
	pc.isConf, pc.err = false, nil
	pc.confirmed = make(chan struct{})
	t.unconfirmed[channel]++
	nd.queue(psOp{ch: channel, sub: true})
}

// confirmed counts a confirmation of channel's subscription, and reports
// whether it is the latest SUBSCRIBE's (an earlier one's is absorbed, as
// are the resubscriptions after a reconnect, which nobody counted).
func (t *chanTable) confirmed(channel string) (latest bool) {
	if c := t.unconfirmed[channel] - 1; c > 0 {
		t.unconfirmed[channel] = c
		return false
	}
	delete(t.unconfirmed, channel)
	return true
}

// awaitsConfirmation reports whether a SUBSCRIBE of channel waits for
// its confirmation.
func (t *chanTable) awaitsConfirmation(channel string) bool { return t.unconfirmed[channel] > 0 }

// linger keeps pc (channel), whose last listener just left, subscribed
// for subLinger, and drops the channels that lingered longer.
func (t *chanTable) linger(channel string, pc *psChannel, now time.Time) {
	t.sweep(now)
	pc.idleSince = now
	t.idle = append(t.idle, idleChannel{channel, now})
}

// sweep unsubscribes the channels idle for subLinger or longer. The
// UNSUBSCRIBE is queued behind any SUBSCRIBE of the same channel on the
// same node, so the two stay ordered.
func (t *chanTable) sweep(now time.Time) {
	i := 0
	for ; i < len(t.idle); i++ {
		e := t.idle[i]
		pc := t.m[e.ch]
		if pc == nil || !pc.idleSince.Equal(e.at) {
			continue // used again since (a later entry, if idle again)
		}
		if now.Sub(e.at) < subLinger {
			break // the later entries are newer
		}
		delete(t.m, e.ch)
		if nd := pc.node; nd != nil && !nd.closed {
			nd.queue(psOp{ch: e.ch})
		}
	}
	t.idle = slices.Delete(t.idle, 0, i)
}

// warm reports whether pc's subscription is confirmed on a working
// connection.
func (pc *psChannel) warm() bool { return pc.isConf && pc.node != nil && !pc.node.broken }

// detached reports whether pc needs a node: none resolved yet, or its
// node closed (its channels moved, or it was dropped).
func (pc *psChannel) detached() bool { return pc.node == nil || pc.node.closed }

// unused reports whether nobody listens on pc any more.
func (pc *psChannel) unused() bool { return len(pc.waiters) == 0 && pc.watch == nil }

// removeWaiter takes w out of pc's waiters (found: it was there); when it
// was the first and others remain, the new first is returned.
func (pc *psChannel) removeWaiter(w *waiter) (newFirst *waiter, found bool) {
	i := slices.Index(pc.waiters, w)
	if i < 0 {
		return nil, false
	}
	pc.waiters = slices.Delete(pc.waiters, i, i+1)
	if i == 0 && len(pc.waiters) > 0 {
		return pc.waiters[0], true
	}
	return nil, true
}

// waitersOf lists pc's waiters with holder id h (a grant's, or a
// handover's).
func (pc *psChannel) waitersOf(h string) []*waiter {
	var to []*waiter
	for _, w := range pc.waiters {
		if w.holder == h {
			to = append(to, w)
		}
	}
	return to
}
