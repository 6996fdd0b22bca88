package fence

import (
	"context"
	"time"
)

// The loop of a watch (see observe.go): it applies the records the
// notifier hands it, reads the election when a term it knows would
// expire, when its subscription was (re)confirmed, and every liveness/3
// while it has no subscription, and turns what it learns into events.

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
	f := &follower{w: w, readAt: time.Now(), backoff: minErrorBackoff}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		if due := f.due(); !due.IsZero() {
			if !now.Before(due) {
				f.read()
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
			f.take(time.Now())
		case <-timer.C:
		}
	}
}

// follower is the loop's own state.
type follower struct {
	w   *watch
	pos position
	// expiry is when the term the watch knows would expire, unless
	// renewed (zero: no term known).
	expiry time.Time
	// readAt is when a read is due besides the expiry and the polls: at
	// once after a (re)subscription, or after a failed read's backoff.
	readAt   time.Time
	lastRead time.Time
	backoff  time.Duration
	// blind: the last event said the watch cannot read the election; the
	// next successful read reports the state whatever it is.
	blind bool
}

// due is when the next read is: the earliest of readAt, the expiry and,
// without a subscription, the next poll; zero when none is due.
func (f *follower) due() time.Time {
	t := f.readAt
	earliest := func(x time.Time) {
		if !x.IsZero() && (t.IsZero() || x.Before(t)) {
			t = x
		}
	}
	if !f.expiry.IsZero() {
		earliest(f.expiry.Add(expiryMargin))
	}
	f.w.mu.Lock()
	subscribed := f.w.subscribed
	f.w.mu.Unlock()
	if !subscribed {
		earliest(f.lastRead.Add(f.w.e.cfg.liveness / 3))
	}
	return t
}

// take applies what the notifier handed over.
func (f *follower) take(now time.Time) {
	w := f.w
	w.mu.Lock()
	msgs, sync := w.msgs, w.sync
	w.msgs, w.sync = nil, false
	w.mu.Unlock()
	for _, m := range msgs {
		rec, err := parseRecord(m)
		if err != nil {
			continue // not a record (nothing else is published there): a read will tell
		}
		o := recordObservation(rec)
		known := f.pos.known && f.pos.token == rec.token && !f.pos.vacant
		f.apply(o)
		if !rec.resigned && !known && f.pos.token == rec.token {
			f.expiry = now.Add(rec.lease) // a new term: read when it would expire
		}
	}
	if sync {
		f.readAt = now
	}
}

// lose tells the observers, once per blind spell, that the election
// cannot be read.
func (f *follower) lose(err error) {
	if f.blind {
		return
	}
	f.blind = true
	f.w.emit(LeaderEvent{Err: err})
}

// apply turns an observation into events.
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

// read reads the election and applies what it says.
func (f *follower) read() {
	w := f.w
	ctx, cancel := context.WithTimeout(w.c.bgCtx, readTimeout)
	st, err := w.e.read(ctx)
	cancel()
	f.lastRead = time.Now()
	if err != nil {
		if w.c.bgCtx.Err() != nil {
			return // closing
		}
		f.lose(w.e.c.withFix(err))
		f.readAt = f.lastRead.Add(f.backoff)
		f.backoff = min(2*f.backoff, maxErrorBackoff)
		return
	}
	f.readAt, f.backoff = time.Time{}, minErrorBackoff
	o := readObservation(st)
	blind := f.blind
	f.apply(o)
	if blind && f.blind {
		// Nothing changed since the last event before the blind spell:
		// say so, the observers were told the leader was unknown.
		f.blind = false
		f.w.emit(f.pos.last)
	}
	switch {
	case o.kind != obsTerm || f.pos.vacant:
		f.expiry = time.Time{}
	case st.ttl < 0: // no expiry (set by hand): look again now and then
		f.expiry = f.lastRead.Add(noExpiryWait)
	default:
		f.expiry = f.lastRead.Add(st.ttl)
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
