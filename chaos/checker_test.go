package chaos

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// hist builds synthetic histories for the checker's own tests: the checker
// must flag every kind of broken promise, and only those.
type hist struct {
	ops     []Op
	commits []Commit
	values  map[string]int64
	items   []ItemCount
	n       int
}

const res = "r"

// op records an operation [inv, ret]; when committed it also records the
// database row, with the next version.
func (h *hist) op(w int, kind string, tok, batch, inv, ret int64, out Outcome, val int64, committed bool) {
	h.n++
	id := "op" + string(rune('a'+h.n))
	h.ops = append(h.ops, Op{ID: id, Worker: w, Kind: kind, Resource: res, Token: tok, Batch: batch,
		Invoke: inv, Complete: ret, Outcome: out, Value: val})
	if committed {
		h.commits = append(h.commits, Commit{Resource: res, Version: int64(len(h.commits) + 1), Kind: kind,
			Token: tok, OpID: id, Batch: batch, Value: val, Worker: w, At: ret})
		if kind == KindIncr {
			if h.values == nil {
				h.values = map[string]int64{}
			}
			h.values[res] = val
		}
	}
}

func (h *hist) check() CheckResult {
	return Check(h.ops, DBState{Commits: h.commits, Values: h.values, Items: h.items})
}

func checks(r CheckResult) map[string]int {
	m := map[string]int{}
	for _, v := range r.Violations {
		m[v.Check]++
	}
	return m
}

func expect(t *testing.T, r CheckResult, want ...string) {
	t.Helper()
	got := checks(r)
	for _, w := range want {
		if got[w] == 0 {
			t.Errorf("check %s did not fire; got %v", w, r.Violations)
		}
	}
	if len(want) == 0 && len(r.Violations) > 0 {
		t.Errorf("clean history flagged: %v", r.Violations)
	}
}

// A clean fenced history: holder 1 (token 10) works, holder 2 (token 20)
// takes over, holder 1 comes back and is rejected, a retry is deduplicated,
// a crashed operation that committed and one that did not.
func cleanHistory() *hist {
	h := &hist{}
	h.op(1, KindIncr, 10, 0, 100, 110, OutOK, 1, true)
	h.op(1, KindAppend, 10, 1, 120, 130, OutOK, 0, true)
	h.op(1, KindIncr, 10, 0, 140, 0, OutCrash, 2, true)  // committed, never acknowledged
	h.op(1, KindIncr, 10, 0, 150, 0, OutCrash, 0, false) // never committed
	h.op(2, KindIncr, 20, 0, 300, 310, OutOK, 3, true)
	h.op(2, KindAppend, 20, 1, 320, 330, OutDup, 0, false) // retry of batch 1
	h.op(1, KindIncr, 10, 0, 200, 340, OutStale, 0, false) // paused holder, rejected
	h.op(2, KindAppend, 20, 2, 350, 360, OutFail, 0, true) // error, but the database has it
	return h
}

func TestCheckCleanHistory(t *testing.T) {
	r := cleanHistory().check()
	expect(t, r)
	if r.OpsChecked != 8 || r.LinearizabilityUnknown != 0 {
		t.Errorf("ops checked %d, unknown %d", r.OpsChecked, r.LinearizabilityUnknown)
	}
}

func TestCheckStaleWriteCommitted(t *testing.T) {
	h := &hist{}
	h.op(2, KindIncr, 20, 0, 300, 310, OutOK, 1, true)
	h.op(1, KindIncr, 10, 0, 320, 330, OutOK, 2, true) // the paused holder's late write lands
	expect(t, h.check(), CheckTokenOrder, CheckStaleAfterAck, CheckLinearizable)
}

func TestCheckLostUpdate(t *testing.T) {
	h := &hist{}
	h.op(1, KindIncr, 10, 0, 100, 200, OutOK, 1, true)
	h.op(2, KindIncr, 20, 0, 150, 250, OutOK, 1, true) // read 0 too: an increment is lost
	expect(t, h.check(), CheckLostUpdate, CheckLinearizable)
}

func TestCheckRegisterValue(t *testing.T) {
	h := &hist{}
	h.op(1, KindIncr, 10, 0, 100, 200, OutOK, 1, true)
	h.values[res] = 5 // something else wrote the register
	expect(t, h.check(), CheckLostUpdate)
}

func TestCheckKeyAppliedTwice(t *testing.T) {
	h := &hist{}
	h.op(1, KindAppend, 10, 1, 100, 200, OutOK, 0, true)
	h.op(2, KindAppend, 20, 1, 300, 400, OutOK, 0, true)
	h.items = []ItemCount{{Resource: res, Batch: 1, Item: 0, Count: 2}}
	expect(t, h.check(), CheckKeyTwice, CheckDuplicateRows, CheckLinearizable)
}

func TestCheckLostAck(t *testing.T) {
	h := &hist{}
	h.op(1, KindAppend, 10, 1, 100, 200, OutOK, 0, false)
	expect(t, h.check(), CheckLostAck)
}

func TestCheckRejectedVisible(t *testing.T) {
	h := &hist{}
	h.op(2, KindIncr, 20, 0, 100, 110, OutOK, 1, true)
	h.op(1, KindAppend, 10, 1, 120, 130, OutStale, 0, true)
	expect(t, h.check(), CheckRejectedSeen)
}

// Only the linearizability checker sees this one: a write rejected as
// stale although no higher token was ever accepted (a false rejection:
// safe, but the fence would be lying).
func TestCheckLinearizabilityOnly(t *testing.T) {
	h := &hist{}
	h.op(1, KindIncr, 10, 0, 100, 110, OutOK, 1, true)
	h.op(2, KindIncr, 20, 0, 200, 210, OutStale, 0, false)
	r := h.check()
	got := checks(r)
	if got[CheckLinearizable] == 0 || len(got) != 1 {
		t.Errorf("want only %s, got %v", CheckLinearizable, r.Violations)
	}
}

// An acknowledged write whose real-time successor commits with a lower
// token, while the database's commit order alone looks fine (the database
// recorded them in the other order): the real-time check catches it.
func TestCheckStaleAfterAckRealTime(t *testing.T) {
	h := &hist{}
	h.op(1, KindAppend, 10, 1, 300, 310, OutOK, 0, true) // invoked after op 2's ack, lower token
	h.op(2, KindAppend, 20, 2, 100, 200, OutOK, 0, false)
	h.commits = append([]Commit{{Resource: res, Version: 0, Kind: KindAppend, Token: 20, OpID: h.ops[1].ID, Batch: 2, At: 200}}, h.commits...)
	expect(t, h.check(), CheckStaleAfterAck)
}

func TestOpsPairsEvents(t *testing.T) {
	ev := []Event{
		{Type: evInvoke, At: 1, Worker: 1, Op: "a", Kind: KindIncr, Resource: res, Token: 5},
		{Type: evInvoke, At: 2, Worker: 2, Op: "b", Kind: KindAppend, Resource: res, Token: 6, Batch: 3},
		{Type: evComplete, At: 3, Worker: 1, Op: "a", Outcome: OutOK, Value: 1},
	}
	ops := Ops(ev)
	if len(ops) != 2 || ops[0].Outcome != OutOK || ops[0].Complete != 3 || ops[0].Value != 1 ||
		ops[1].Outcome != OutCrash || ops[1].Batch != 3 {
		t.Fatalf("ops = %+v", ops)
	}
}

func TestFaultScheduleFromSeed(t *testing.T) {
	a := faultSchedule(42, FaultKinds, 3*len(FaultKinds))
	assert.Equal(t, a, faultSchedule(42, FaultKinds, 3*len(FaultKinds)), "-seed must reproduce the schedule")
	assert.NotEqual(t, a, faultSchedule(43, FaultKinds, 3*len(FaultKinds)), "another seed, another schedule")
	for b := 0; b < 3; b++ {
		block := append([]string(nil), a[b*len(FaultKinds):(b+1)*len(FaultKinds)]...)
		assert.ElementsMatch(t, FaultKinds, block, "block %d runs every kind once", b)
	}
}
