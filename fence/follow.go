package fence

import (
	"context"
	"sync"
	"time"
)

// Locks. follower.mu guards what a watch knows (follower); it is held
// while the events made of it are emitted, so that they keep the order of
// what was learnt: follower.mu → watch.mu → observer.mu (see client.go).
// The loop's state is its goroutine's own.

// The follower of a watch (see observe.go): it applies the records the
// notifier hands it (on the notifier's goroutine), and its loop reads the
// election when a term it knows would expire, every term lease while it
// knows of none, when the subscription was (re)confirmed or broke, and
// every liveness/3 while it has no subscription; both turn what they
// learn into events.

const (
	// expiryMargin is how long after a term's expected expiry the watch
	// reads it: past the server's expiry granularity, so that a term that
	// was not renewed is found gone.
	expiryMargin = 2 * time.Millisecond
	// readTimeout bounds one read of the watch.
	readTimeout = 5 * time.Second
)

func (w *watch) run() {
	c := w.c
	n := c.notify
	n.addWatch(w.e.events, w)
	defer n.removeWatch(w.e.events, w)
	// Subscribed before the first read: a change made after the read is
	// published after the subscription, and reaches this watch. Without a
	// confirmation (refused, or late) the watch polls meanwhile.
	if err := n.subscribe(c.bgCtx, w.e.events); err == nil {
		w.mu.Lock()
		w.subscribed = true
		w.mu.Unlock()
	}
	l := &loop{w: w, readAt: time.Now(), backoff: minErrorBackoff}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		if due := l.due(); !due.IsZero() {
			if !now.Before(due) {
				l.read()
				continue
			}
			timer.Reset(due.Sub(now))
		} else {
			timer.Reset(time.Hour)
		}
		select {
		case <-w.stop:
			return
		case <-c.closing:
			w.stopAll()
			return
		case <-w.kick:
			w.mu.Lock()
			if w.sync {
				w.sync, l.readAt = false, time.Now()
			}
			w.mu.Unlock()
		case <-timer.C:
		}
	}
}

// follower is what a watch knows, and the events it made of it.
type follower struct {
	w *watch

	mu  sync.Mutex
	pos position
	// expiry is when the term the watch knows would expire, unless
	// renewed (zero: no term known).
	expiry time.Time
	// blind: the last event said the watch cannot read the election; the
	// next successful read reports the state whatever it is.
	blind bool
	// gen counts the records applied: a read that some record overtook
	// says nothing newer than it, and is made again.
	gen uint64
}

// message applies a record; it reports whether the expiry moved (a new
// term: the loop reads when its lease would run out).
func (f *follower) message(payload string, now time.Time) bool {
	rec, err := parseRecord(payload)
	if err != nil {
		return false // nothing else is published there: ignored
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	known := f.pos.known && f.pos.token == rec.token && !f.pos.vacant
	f.apply(recordObservation(rec))
	if !rec.resigned && !known && f.pos.token == rec.token && !f.pos.vacant {
		f.expiry = now.Add(rec.lease)
		return true
	}
	return false
}

// apply turns an observation into events. Called with f.mu held.
func (f *follower) apply(o observation) {
	evs := f.pos.next(o)
	if len(evs) > 0 {
		f.blind = false
	}
	f.w.emit(evs...)
	if f.pos.vacant {
		f.expiry = time.Time{}
	}
}

// loop is the watch loop's own state.
type loop struct {
	w *watch
	// readAt is when a read is due besides the expiry and the polls: at
	// once after a (re)subscription or a read that a record overtook, or
	// after a failed read's backoff.
	readAt   time.Time
	lastRead time.Time
	backoff  time.Duration
}

// due is when the next read is: the earliest of readAt, the expiry and,
// without a subscription, the next poll; zero when none is due.
func (l *loop) due() time.Time {
	t := l.readAt
	earliest := func(x time.Time) {
		if !x.IsZero() && (t.IsZero() || x.Before(t)) {
			t = x
		}
	}
	f := &l.w.f
	f.mu.Lock()
	expiry := f.expiry
	f.mu.Unlock()
	if !expiry.IsZero() {
		earliest(expiry.Add(expiryMargin))
	} else {
		// No term known: a term begun without a message (its leader may
		// not PUBLISH) is found within a term's lease all the same.
		earliest(l.lastRead.Add(l.w.e.cfg.lease))
	}
	l.w.mu.Lock()
	subscribed := l.w.subscribed
	l.w.mu.Unlock()
	if !subscribed {
		earliest(l.lastRead.Add(l.w.e.cfg.liveness / 3))
	}
	return t
}

// read reads the election and applies what it says.
func (l *loop) read() {
	w, f := l.w, &l.w.f
	f.mu.Lock()
	gen := f.gen
	f.mu.Unlock()
	ctx, cancel := context.WithTimeout(w.c.bgCtx, readTimeout)
	st, err := w.e.read(ctx)
	cancel()
	l.lastRead = time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		if w.c.bgCtx.Err() != nil {
			return // closing
		}
		if !f.blind {
			f.blind = true
			w.emit(LeaderEvent{Err: w.c.withFix(err)})
		}
		l.readAt = l.lastRead.Add(l.backoff)
		l.backoff = min(2*l.backoff, maxErrorBackoff)
		return
	}
	l.backoff = minErrorBackoff
	if f.gen != gen {
		l.readAt = l.lastRead // a record came meanwhile: read again
		return
	}
	l.readAt = time.Time{}
	o := readObservation(st)
	blind := f.blind
	f.apply(o)
	if blind && f.blind {
		// Nothing changed since the last event before the blind spell:
		// say so, the observers were told the leader was unknown.
		f.blind = false
		w.emit(f.pos.last)
	}
	switch {
	case o.kind != obsTerm || f.pos.vacant:
		f.expiry = time.Time{}
	case st.ttl < 0: // no expiry (set by hand): look again now and then
		f.expiry = l.lastRead.Add(noExpiryWait)
	default:
		f.expiry = l.lastRead.Add(st.ttl)
	}
}

// obsKind is what an observation says of an election.
type obsKind uint8

const (
	obsTerm  obsKind = iota // a term leads (its record, or a read)
	obsEnded                // a term ended (resigned, or found expired)
	obsNone                 // no term, and no record of one
)

// observation is what a record or a read says.
type observation struct {
	kind          obsKind
	token, seq    int64
	prev          int64 // the term before (-1: unknown, links to nothing)
	how           byte  // how prev ended: 'H', 'R', 'E', '-'
	holder, value string
	ended         TermEnd
}

func recordObservation(rec termRecord) observation {
	o := observation{kind: obsTerm, token: rec.token, seq: rec.seq, prev: rec.prev, how: rec.how,
		holder: rec.holder, value: rec.value}
	if rec.resigned {
		o.kind, o.ended = obsEnded, TermResigned
	}
	return o
}

func readObservation(st electionState) observation {
	switch {
	case st.termRec():
		return recordObservation(st.rec)
	case st.held:
		// A term without a record of its own (made by a plain Acquire, or
		// its record was lost): nothing links it to the one before.
		return observation{kind: obsTerm, token: st.token, prev: -1, how: '-', holder: st.holder}
	case !st.hasRec:
		return observation{kind: obsNone}
	}
	o := recordObservation(st.rec)
	if o.kind == obsTerm { // its record says it leads, its lock is gone
		o.kind, o.ended = obsEnded, TermExpired
	}
	return o
}

// event is the state o describes, as an event.
func (o observation) event() LeaderEvent {
	switch o.kind {
	case obsTerm:
		return LeaderEvent{Holder: o.holder, Token: o.token, Value: o.value}
	case obsEnded:
		return LeaderEvent{Vacant: true, Ended: o.ended, Holder: o.holder, Token: o.token, Value: o.value}
	}
	return LeaderEvent{Vacant: true}
}

// position is where the events stand: what the last said.
type position struct {
	known  bool  // an event was made
	token  int64 // the last term (current or ended); 0 when none is known
	seq    int64
	vacant bool
	last   LeaderEvent // the last event that was not an Err
}

func endOf(how byte) TermEnd {
	switch how {
	case 'R':
		return TermResigned
	case 'E':
		return TermExpired
	}
	return TermEndUnknown
}

// next returns the events that take the observers from the position to
// what o says, and moves the position there; none when o is old or says
// nothing new. A term whose record names the last term as its
// predecessor follows it (with the vacancy between, when the last term
// was not handed over and the vacancy was not seen); anything else
// after the first event is marked Missed.
func (p *position) next(o observation) []LeaderEvent {
	var evs []LeaderEvent
	switch o.kind {
	case obsTerm:
		if p.known && (o.token < p.token || o.token == p.token && (p.vacant || o.seq <= p.seq)) {
			return nil
		}
		if p.known && o.token == p.token { // the same term's newer record: a proclaim
			evs = append(evs, LeaderEvent{Holder: o.holder, Token: o.token, Value: o.value})
			break
		}
		linked := !p.known || o.prev == p.token
		if p.known && !p.vacant && linked && o.how != 'H' {
			evs = append(evs, LeaderEvent{Vacant: true, Ended: endOf(o.how),
				Holder: p.last.Holder, Token: p.last.Token, Value: p.last.Value})
		}
		evs = append(evs, LeaderEvent{Holder: o.holder, Token: o.token, Value: o.value, Missed: !linked})
	case obsEnded:
		if p.known && (o.token < p.token || o.token == p.token && p.vacant) {
			return nil
		}
		evs = append(evs, LeaderEvent{Vacant: true, Ended: o.ended, Holder: o.holder, Token: o.token, Value: o.value,
			Missed: p.known && o.token != p.token})
	case obsNone:
		if p.known && p.vacant && p.token == 0 {
			return nil
		}
		ev := LeaderEvent{Vacant: true, Missed: p.known && p.token != 0}
		if p.known && !p.vacant {
			ev.Holder, ev.Token, ev.Value = p.last.Holder, p.last.Token, p.last.Value
		}
		evs = append(evs, ev)
	}
	p.known, p.vacant, p.seq = true, o.kind != obsTerm, o.seq
	p.token = o.token // 0 for obsNone: a successor's record names no term before it
	p.last = evs[len(evs)-1]
	return evs
}
