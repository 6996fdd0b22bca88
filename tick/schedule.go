package tick

import (
	"fmt"
	"time"
)

// Schedule is when a job's ticks fall: Next returns the first tick strictly
// after t, or the zero time when there is none. robfig/cron v3's
// cron.Schedule is one (parse a spec with its parser, "CRON_TZ=Europe/Paris
// 0 3 * * *" for a time zone); [Every] is one without a dependency.
type Schedule interface {
	Next(t time.Time) time.Time
}

// Every is a schedule that ticks every d, at the instants that are whole
// multiples of d since the Unix epoch: every instance computes the same
// ticks whenever it started. A d that divides a day ticks at fixed UTC
// times of day (Every(time.Hour) on every full hour, UTC); for a calendar
// in local time, use a cron schedule with its time zone. d must be
// positive.
type Every time.Duration

// Next is the first tick strictly after t.
func (e Every) Next(t time.Time) time.Time {
	return e.floor(t).Add(time.Duration(e))
}

// floor is the newest tick at or before t.
func (e Every) floor(t time.Time) time.Time {
	d := time.Duration(e)
	// The epoch offset in whole periods, then the remainder: no overflow
	// for any time a job runs at (UnixNano covers 1678–2262).
	ns := t.UnixNano()
	q := ns / int64(d)
	if ns%int64(d) < 0 {
		q-- // floor, not truncation, before the epoch
	}
	return time.Unix(0, q*int64(d)).UTC()
}

func (e Every) String() string { return "every " + time.Duration(e).String() }

// maxWalk bounds how many ticks a search steps through, so that a
// schedule that ticks very densely costs a bounded amount of work.
const maxWalk = 1 << 20

// Prev is the newest tick of s at or before t, or the zero time when s has
// none in the five years before t. Run at start-up with Prev(s, now)
// runs the newest tick if no instance ran it (see "Catching up" in the
// package documentation).
func Prev(s Schedule, t time.Time) time.Time {
	if e, ok := s.(Every); ok && e > 0 {
		return e.floor(t)
	}
	// Widen a window back from t until it holds a tick, then walk forward
	// through it: the window doubles, so a schedule is searched in a few
	// dozen calls of Next whatever its period.
	for w := time.Second; w <= 5*366*24*time.Hour; w *= 2 {
		n := s.Next(t.Add(-w))
		if n.IsZero() || n.After(t) {
			continue
		}
		for range maxWalk {
			nn := s.Next(n)
			if nn.IsZero() || nn.After(t) || !nn.After(n) {
				return n
			}
			n = nn
		}
		return n
	}
	return time.Time{}
}

// place is a tick found for an instant, with the gaps to its neighbours.
type place struct {
	at  time.Time     // the tick, UTC
	gap time.Duration // the shorter gap to the tick before or after (0: none known)
}

// locate finds the tick of s nearest to at and the gaps around it.
func locate(s Schedule, at time.Time) (place, error) {
	lo := Prev(s, at)
	hi := s.Next(at)
	if !hi.IsZero() && !hi.After(at) {
		return place{}, fmt.Errorf("its Next(%s) returned %s, not a later instant", at.Format(time.RFC3339Nano), hi.Format(time.RFC3339Nano))
	}
	var t time.Time
	switch {
	case lo.IsZero() && hi.IsZero():
		return place{}, fmt.Errorf("it has no tick within five years of %s", at.Format(time.RFC3339Nano))
	case lo.IsZero():
		t = hi
	case hi.IsZero() || at.Sub(lo) <= hi.Sub(at):
		t = lo
	default:
		t = hi
	}
	p := place{at: t.UTC()}
	if before := Prev(s, t.Add(-time.Nanosecond)); !before.IsZero() {
		p.gap = t.Sub(before)
	}
	if after := s.Next(t); !after.IsZero() && (p.gap == 0 || after.Sub(t) < p.gap) {
		p.gap = after.Sub(t)
	}
	return p, nil
}

// Key is the run key of the tick at t: its instant in UTC, RFC 3339 with
// as many fraction digits as it needs ("2026-03-29T01:00:00Z"). The same
// instant has the same key whatever the zone or the daylight-saving rule
// of the instance that computed it.
func Key(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// missedBetween counts the ticks of s strictly between from and to, at
// most maxWalk (then capped reports true).
func missedBetween(s Schedule, from, to time.Time) (n int64, first, last time.Time, capped bool) {
	if e, ok := s.(Every); ok && e > 0 {
		d := time.Duration(e)
		n = int64(to.Sub(from)/d) - 1
		if to.Sub(from)%d != 0 {
			n++ // to is not on the grid of from (cannot happen for ticks of e)
		}
		if n <= 0 {
			return 0, time.Time{}, time.Time{}, false
		}
		return n, from.Add(d), from.Add(time.Duration(n) * d), false
	}
	t := from
	for range maxWalk {
		t = s.Next(t)
		if t.IsZero() || !t.Before(to) {
			return n, first, last, false
		}
		if n == 0 {
			first = t.UTC()
		}
		last = t.UTC()
		n++
	}
	return n, first, last, true
}
