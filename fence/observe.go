package fence

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Locks. watch.mu guards a watch's observers and its last event, and
// observer.mu an observer's queue; taken in the order Client.mu (which
// finds a watch) → watch.mu → observer.mu, or follower.mu (follow.go) →
// watch.mu → observer.mu when an event is emitted (see client.go). An
// observer's channel is sent on without blocking under observer.mu
// (push), and with no mutex held by its own goroutine.

// Observing an election. Every change of an election's record (a new
// term, a proclaim, a resignation; see elect.lua) is published whole on
// the election's channel in the script that makes it, so a change costs
// an observer no read. What Redis does not publish is an expiry (a term
// whose leader died, paused or was cut off ends when its lease runs out,
// with no script to say so): an observer reads the election when the
// term it knows would expire (its lease, then the TTL each read finds,
// since renewals move it), and the read says whether it was renewed or
// ended. Records carry the token of the term before them and how it
// ended, so an observer that missed messages (its connection broke)
// knows whether the state it reads afterwards follows the last it saw,
// or whether terms may have come and gone unseen.
//
// One watch per election and client serves every observer of it: one
// subscription (the client's pub/sub connection of the node, see
// notify.go), one timer, one read at a time; each observer has a queue
// and a goroutine that delivers to its channel, so a slow consumer holds
// up no other.

// TermEnd says how a term ended (see [LeaderEvent]).
type TermEnd uint8

const (
	// TermEndUnknown: the observer does not know how the term ended (its
	// record was lost with Redis's data, or it was not seen).
	TermEndUnknown TermEnd = iota
	// TermResigned: the leader resigned (released its term) with no
	// candidate waiting.
	TermResigned
	// TermExpired: the term's lease ran out: its leader died, paused, or
	// was cut off from Redis (or an operator force-released it).
	TermExpired
)

// String is a short, stable label (for logs and metrics).
func (t TermEnd) String() string {
	switch t {
	case TermResigned:
		return "resigned"
	case TermExpired:
		return "expired"
	}
	return "unknown"
}

// LeaderEvent is one change of an election seen by [Election.Observe]:
// the state after it.
type LeaderEvent struct {
	// Holder, Token and Value are the leader's: a new Token is a new
	// term, the same Token with another Value a proclaim. On a vacancy
	// they are the term that ended (zero when none is known).
	Holder string
	Token  int64
	Value  string
	// Vacant is true when no term holds the election: the last one
	// ended, Ended says how, and no candidate was waiting.
	Vacant bool
	Ended  TermEnd
	// Missed is true when terms may have begun and ended unseen before
	// this event: the observer was cut off from Redis, Redis lost its
	// data, or the consumer fell more than a thousand events behind. The
	// event is the state at that point.
	Missed bool
	// Err is set while the observer cannot read the election (Redis is
	// unreachable, or its pub/sub connection broke): the leader is
	// unknown. The next event is the state once Redis answers again (it
	// may repeat the last one), with Missed set when the observer cannot
	// tell that nothing happened meanwhile. The other fields are zero.
	Err error
}

// String describes the event in one line, for logs.
func (ev LeaderEvent) String() string {
	var b strings.Builder
	switch {
	case ev.Err != nil:
		return "leader unknown: " + ev.Err.Error()
	case ev.Vacant && ev.Token == 0:
		b.WriteString("vacant")
	case ev.Vacant:
		fmt.Fprintf(&b, "vacant: term %d of %q %s", ev.Token, ev.Holder, ev.Ended)
	default:
		fmt.Fprintf(&b, "leader %q, term %d, value %q", ev.Holder, ev.Token, ev.Value)
	}
	if ev.Missed {
		b.WriteString(" (terms may have been missed before)")
	}
	return b.String()
}

// maxBacklog is how many events an observer's queue holds before the
// consumer is deemed too slow: its queue is replaced by the newest event,
// marked Missed, rather than grow without bound.
const maxBacklog = 1024

// Observe follows the election: the returned channel first gets the
// current state (the leader, or a vacancy), then every change, in order:
// each new term (a handover gives no vacancy between the two terms), each
// proclaim, and each vacancy — a resignation as soon as its message
// arrives, an expiry once the observer's read finds the term's lease run
// out, no later than the lease after the last renewal. While Redis cannot
// be read the channel gets an event with Err; see [LeaderEvent] for what
// follows. Observers of one election on one client share one subscription
// and one timer. The channel is closed when ctx ends or the client
// closes; a consumer that stops reading holds up nobody else. Observe
// returns at once (the subscription and the first read are made in the
// background), and fails only when ctx is done already (with ctx's
// error) or the client is closed ([ErrClosed]).
func (e *Election) Observe(ctx context.Context) (<-chan LeaderEvent, error) {
	if e.c.isClosed() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o := &observer{ctx: ctx, ch: make(chan LeaderEvent), kick: make(chan struct{}, 1)}
	w, start := e.c.joinWatch(e, o)
	if w == nil {
		return nil, ErrClosed
	}
	if start && !e.c.goBackground(w.run) {
		w.stopAll()
		return nil, ErrClosed
	}
	if !e.c.goBackground(func() { o.run(w) }) {
		w.remove(o)
		return nil, ErrClosed
	}
	return o.ch, nil
}

// observer is one Observe call: its queue of events and its channel.
type observer struct {
	ctx  context.Context
	ch   chan LeaderEvent
	kick chan struct{} // cap 1: the queue grew

	mu     sync.Mutex
	queue  []LeaderEvent
	busy   bool // run holds an event it is sending: a newer one must queue behind it
	closed bool // ch is closed (or about to be)
}

// push hands ev to the consumer: straight away when the consumer waits on
// the channel and nothing is queued (one goroutine hop fewer), else
// through the queue.
func (o *observer) push(ev LeaderEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	if len(o.queue) == 0 && !o.busy {
		select {
		case o.ch <- ev:
			return
		default:
		}
	}
	if len(o.queue) >= maxBacklog {
		ev.Missed = ev.Err == nil
		o.queue = o.queue[:0]
	}
	o.queue = append(o.queue, ev)
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// pop takes the next queued event, marking the observer busy with it.
func (o *observer) pop() (LeaderEvent, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.queue) == 0 {
		return LeaderEvent{}, false
	}
	ev := o.queue[0]
	o.queue[0] = LeaderEvent{}
	o.queue = o.queue[1:]
	o.busy = true
	return ev, true
}

func (o *observer) sent() {
	o.mu.Lock()
	o.busy = false
	o.mu.Unlock()
}

// run delivers the queue to the channel until ctx ends or the watch
// stops, then closes the channel and leaves the watch.
func (o *observer) run(w *watch) {
	defer func() {
		o.mu.Lock()
		o.closed = true
		o.mu.Unlock()
		close(o.ch)
		w.remove(o)
	}()
	for {
		ev, ok := o.pop()
		if !ok {
			select {
			case <-o.kick:
				continue
			case <-o.ctx.Done():
				return
			case <-w.stop:
				return
			}
		}
		select {
		case o.ch <- ev:
			o.sent()
		case <-o.ctx.Done():
			return
		case <-w.stop:
			return
		}
	}
}

// watch follows one election for the observers of one client.
type watch struct {
	c    *Client
	e    *Election // the first observed: its keys, and its liveness for polls
	kick chan struct{}
	stop chan struct{} // closed when the watch ends
	f    follower      // what the watch knows (see follow.go)

	mu         sync.Mutex
	obs        []*observer
	done       bool
	sync       bool // read now: a subscription was (re)confirmed, or broke
	subscribed bool // confirmed and not broken since: changes arrive as messages
	// cur is the last event (a new observer's first), has whether there
	// is one.
	cur LeaderEvent
	has bool
}

// joinWatch adds o to the client's watch of e, making one if none
// exists (start: the caller starts its loop). nil when the client is
// closed.
func (c *Client) joinWatch(e *Election, o *observer) (w *watch, start bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return nil, false
	}
	if c.watches == nil {
		c.watches = map[string]*watch{}
	}
	w = c.watches[e.events]
	if w == nil {
		w = &watch{c: c, e: e, kick: make(chan struct{}, 1), stop: make(chan struct{})}
		w.f.w = w
		c.watches[e.events] = w
		start = true
	}
	w.mu.Lock()
	w.obs = append(w.obs, o)
	if w.has {
		first := w.cur
		first.Missed = false // this observer missed nothing
		o.push(first)
	}
	w.mu.Unlock()
	return w, start
}

// remove takes o out of the watch; the last observer's going ends it.
func (w *watch) remove(o *observer) {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, x := range w.obs {
		if x == o {
			w.obs = append(w.obs[:i], w.obs[i+1:]...)
			break
		}
	}
	if len(w.obs) == 0 && !w.done {
		w.endLocked()
	}
}

// endLocked ends the watch. Called with the client's and w's mutexes
// held.
func (w *watch) endLocked() {
	w.done = true
	if w.c.watches[w.e.events] == w {
		delete(w.c.watches, w.e.events)
	}
	close(w.stop)
}

// stopAll ends the watch and its observers (the client closed).
func (w *watch) stopAll() {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.endLocked()
	}
}

func (w *watch) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// message, confirmed and broken are the notifier's: a record arrived (it
// is applied on the notifier's goroutine, one hop fewer to the observers;
// see follower.message); the channel's subscription was (re)confirmed;
// its connection failed (or the server dropped the subscription).
func (w *watch) message(payload string) {
	if w.f.message(payload, time.Now()) {
		w.poke() // the loop sets its timer anew
	}
}

func (w *watch) confirmed() {
	w.mu.Lock()
	w.sync, w.subscribed = true, true
	w.mu.Unlock()
	w.poke()
}

// broken: messages may be lost until the channel is subscribed again;
// the watch reads at once, and polls meanwhile. It tells the observers
// that it cannot see only when its reads fail too: a pub/sub connection
// that redials more slowly than the reads succeed is no blind spell.
func (w *watch) broken() {
	w.mu.Lock()
	w.sync, w.subscribed = true, false
	w.mu.Unlock()
	w.poke()
}

// emit sends evs to every observer, in order.
func (w *watch) emit(evs ...LeaderEvent) {
	if len(evs) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ev := range evs {
		for _, o := range w.obs {
			o.push(ev)
		}
		w.cur, w.has = ev, true
	}
}
