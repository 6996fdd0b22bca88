package fence

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The events an observer makes from what it learns, message by message
// or read by read: a term that names the last one as its predecessor
// follows it (with the vacancy between when the last was not handed
// over and the vacancy was not seen), anything else is marked Missed;
// old or repeated records make nothing.
func TestPositionNext(t *testing.T) {
	t.Parallel()
	term := func(tok, seq, prev int64, how byte, v string) observation {
		return observation{kind: obsTerm, token: tok, seq: seq, prev: prev, how: how, holder: "h" + v, value: v}
	}
	ended := func(tok, seq int64, end TermEnd, v string) observation {
		return observation{kind: obsEnded, token: tok, seq: seq, ended: end, holder: "h" + v, value: v}
	}
	lead := func(tok int64, v string) LeaderEvent { return LeaderEvent{Holder: "h" + v, Token: tok, Value: v} }
	vacant := func(tok int64, v string, end TermEnd) LeaderEvent {
		return LeaderEvent{Holder: "h" + v, Token: tok, Value: v, Vacant: true, Ended: end}
	}
	missed := func(ev LeaderEvent) LeaderEvent { ev.Missed = true; return ev }
	for _, tc := range []struct {
		name string
		obs  []observation
		want [][]LeaderEvent // per observation
	}{
		{"first state, handover, proclaim, resignation", []observation{
			term(10, 0, 0, '-', "a"), term(20, 0, 10, 'H', "b"), term(20, 1, 10, 'H', "b2"), ended(20, 2, TermResigned, "b2"),
		}, [][]LeaderEvent{{lead(10, "a")}, {lead(20, "b")}, {lead(20, "b2")}, {vacant(20, "b2", TermResigned)}}},
		{"an expiry seen only through the next term's record", []observation{
			term(10, 0, 0, '-', "a"), term(20, 0, 10, 'E', "b"),
		}, [][]LeaderEvent{{lead(10, "a")}, {vacant(10, "a", TermExpired), lead(20, "b")}}},
		{"an expiry seen by a read, then the next term", []observation{
			term(10, 0, 0, '-', "a"), ended(10, 0, TermExpired, "a"), term(20, 0, 10, 'E', "b"),
		}, [][]LeaderEvent{{lead(10, "a")}, {vacant(10, "a", TermExpired)}, {lead(20, "b")}}},
		{"old and repeated records", []observation{
			term(20, 1, 10, 'H', "b"), term(20, 1, 10, 'H', "b"), term(20, 0, 10, 'H', "x"), term(10, 3, 0, '-', "a"),
			ended(20, 2, TermResigned, "b"), ended(20, 2, TermResigned, "b"), term(20, 5, 10, 'H', "b"),
		}, [][]LeaderEvent{{lead(20, "b")}, nil, nil, nil, {vacant(20, "b", TermResigned)}, nil, nil}},
		{"a term that does not follow the last one", []observation{
			term(10, 0, 0, '-', "a"), term(30, 0, 20, 'R', "c"),
		}, [][]LeaderEvent{{lead(10, "a")}, {missed(lead(30, "c"))}}},
		{"a whole term missed, seen ended", []observation{
			term(10, 0, 0, '-', "a"), ended(20, 1, TermResigned, "b"),
		}, [][]LeaderEvent{{lead(10, "a")}, {missed(vacant(20, "b", TermResigned))}}},
		{"data lost while a term led, then a new term", []observation{
			term(10, 0, 0, '-', "a"), {kind: obsNone}, {kind: obsNone}, term(30, 0, 0, '-', "c"),
		}, [][]LeaderEvent{{lead(10, "a")}, {missed(LeaderEvent{Holder: "ha", Token: 10, Value: "a", Vacant: true})}, nil, {lead(30, "c")}}},
		{"a term without a record of its own", []observation{
			{kind: obsNone}, {kind: obsTerm, token: 40, prev: -1, how: '-', holder: "hd"},
		}, [][]LeaderEvent{{{Vacant: true}}, {missed(LeaderEvent{Holder: "hd", Token: 40})}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p position
			for i, o := range tc.obs {
				assert.Equal(t, tc.want[i], p.next(o), "observation %d", i)
			}
		})
	}
}
