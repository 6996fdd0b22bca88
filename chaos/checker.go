package chaos

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// Check names, as they appear in reports and in the JSON summary.
const (
	CheckTokenOrder     = "token-order"       // committed tokens decrease in commit order
	CheckStaleAfterAck  = "stale-after-ack"   // a write committed with a token lower than one acknowledged before it began
	CheckKeyTwice       = "key-applied-twice" // one idempotency key committed more than once
	CheckDuplicateRows  = "duplicate-rows"    // one (resource, batch, item) business row more than once
	CheckLostAck        = "lost-ack"          // an acknowledged write is not in the database
	CheckRejectedSeen   = "rejected-visible"  // a write reported rejected is in the database
	CheckLostUpdate     = "lost-update"       // register value disagrees with the number of committed increments
	CheckLinearizable   = "linearizability"   // porcupine found no linearization of the fenced register
	CheckHarness        = "harness"           // the history itself is broken (not a library verdict)
	linearizableTimeout = 20 * time.Second
)

// Violation is one broken promise found in a trial's history.
type Violation struct {
	Check    string `json:"check"`
	Resource string `json:"resource"`
	Detail   string `json:"detail"`
	// From/To bound (Unix ns) the slice of history that shows it.
	From int64 `json:"from"`
	To   int64 `json:"to"`
}

// CheckResult is the verdict on one trial.
type CheckResult struct {
	Violations []Violation
	// OpsChecked counts the operations that took part in the checks.
	OpsChecked int
	// LinearizabilityUnknown counts resources where porcupine ran out of
	// time (reported, not counted as a violation or as a pass).
	LinearizabilityUnknown int
	// FailedButCommitted lists operations that returned an error (or never
	// returned) although the database has their write: ambiguous outcomes,
	// legal, but worth knowing about (their error says why).
	FailedButCommitted []Op
}

// Check verifies the promises of fencelock against the workers' history and
// the database's record of what committed, resource by resource.
func Check(ops []Op, db DBState) CheckResult {
	var res CheckResult
	res.OpsChecked = len(ops)
	opsByRes := map[string][]Op{}
	for _, o := range ops {
		opsByRes[o.Resource] = append(opsByRes[o.Resource], o)
	}
	commitsByRes := map[string][]Commit{}
	for _, c := range db.Commits {
		commitsByRes[c.Resource] = append(commitsByRes[c.Resource], c)
	}
	resources := map[string]bool{}
	for r := range opsByRes {
		resources[r] = true
	}
	for r := range commitsByRes {
		resources[r] = true
	}
	names := make([]string, 0, len(resources))
	for r := range resources {
		names = append(names, r)
	}
	sort.Strings(names)
	committedIDs := map[string]bool{}
	for _, c := range db.Commits {
		committedIDs[c.OpID] = true
	}
	for _, o := range ops {
		if (o.Outcome == OutFail || o.Outcome == OutCrash) && committedIDs[o.ID] {
			res.FailedButCommitted = append(res.FailedButCommitted, o)
		}
	}
	for _, r := range names {
		cs := commitsByRes[r]
		sort.Slice(cs, func(i, j int) bool { return cs[i].Version < cs[j].Version })
		v, unknown := checkResource(r, opsByRes[r], cs, db.Values[r])
		res.Violations = append(res.Violations, v...)
		if unknown {
			res.LinearizabilityUnknown++
		}
	}
	for _, it := range db.Items {
		if it.Count > 1 {
			res.Violations = append(res.Violations, Violation{Check: CheckDuplicateRows, Resource: it.Resource,
				Detail: fmt.Sprintf("business row (%s, batch %d, item %d) present %d times", it.Resource, it.Batch, it.Item, it.Count)})
		}
	}
	return res
}

func checkResource(r string, ops []Op, cs []Commit, value int64) ([]Violation, bool) {
	var vs []Violation
	add := func(check, detail string, from, to int64) {
		vs = append(vs, Violation{Check: check, Resource: r, Detail: detail, From: from, To: to})
	}
	byID := make(map[string]Op, len(ops))
	for _, o := range ops {
		byID[o.ID] = o
	}
	committed := make(map[string]Commit, len(cs))
	for _, c := range cs {
		if prev, dup := committed[c.OpID]; dup {
			add(CheckHarness, fmt.Sprintf("operation %s committed twice: %v and %v", c.OpID, prev, c), 0, 0)
		}
		committed[c.OpID] = c
	}
	opTime := func(id string) (int64, int64) {
		o, ok := byID[id]
		if !ok {
			return 0, 0
		}
		end := o.Complete
		if end == 0 {
			end = o.Invoke
		}
		return o.Invoke, end
	}
	span := func(a, b string) (int64, int64) {
		f1, t1 := opTime(a)
		f2, t2 := opTime(b)
		return min64nz(f1, f2), max(t1, t2)
	}

	// 1. Tokens never decrease in commit order.
	for i := 1; i < len(cs); i++ {
		if cs[i].Token < cs[i-1].Token {
			f, t := span(cs[i-1].OpID, cs[i].OpID)
			add(CheckTokenOrder, fmt.Sprintf("commit %v after commit %v: token went down", cs[i], cs[i-1]), f, t)
		}
	}

	// 2. No committed write carries a token lower than one acknowledged
	// before that write was even invoked (real-time order, from the acks,
	// independent of the database's own ordering).
	var acked []Op
	for _, o := range ops {
		if o.Outcome == OutOK && o.Complete > 0 {
			acked = append(acked, o)
		}
	}
	sort.Slice(acked, func(i, j int) bool { return acked[i].Complete < acked[j].Complete })
	var commitOps []Op
	for _, c := range cs {
		if o, ok := byID[c.OpID]; ok {
			commitOps = append(commitOps, o)
		} else {
			add(CheckHarness, fmt.Sprintf("commit %v has no invoke event in any worker history", c), 0, 0)
		}
	}
	sort.Slice(commitOps, func(i, j int) bool { return commitOps[i].Invoke < commitOps[j].Invoke })
	var maxAck Op
	k := 0
	for _, o := range commitOps {
		for k < len(acked) && acked[k].Complete < o.Invoke {
			if acked[k].Token > maxAck.Token {
				maxAck = acked[k]
			}
			k++
		}
		if maxAck.ID != "" && o.Token < maxAck.Token {
			f, t := span(maxAck.ID, o.ID)
			add(CheckStaleAfterAck, fmt.Sprintf("%s committed with token %d, but %s (token %d) was acknowledged before it began",
				o.ID, o.Token, maxAck.ID, maxAck.Token), f, t)
		}
	}

	// 3. Each idempotency key (batch) committed at most once.
	batches := map[int64][]Commit{}
	for _, c := range cs {
		if c.Kind == KindAppend {
			batches[c.Batch] = append(batches[c.Batch], c)
		}
	}
	for b, list := range batches {
		if len(list) > 1 {
			f, t := span(list[0].OpID, list[len(list)-1].OpID)
			add(CheckKeyTwice, fmt.Sprintf("batch %d applied %d times: %v", b, len(list), list), f, t)
		}
	}

	// 4. Acknowledged writes are in the database; rejected ones are not.
	for _, o := range ops {
		_, in := committed[o.ID]
		switch {
		case o.Outcome == OutOK && !in:
			add(CheckLostAck, fmt.Sprintf("%v was acknowledged but is not in the database", o), o.Invoke, o.Complete)
		case (o.Outcome == OutStale || o.Outcome == OutDup) && in:
			add(CheckRejectedSeen, fmt.Sprintf("%v was reported rejected but committed as %v", o, committed[o.ID]), o.Invoke, o.Complete)
		case o.Outcome == OutOK && in && o.Kind == KindIncr && committed[o.ID].Value != o.Value:
			add(CheckHarness, fmt.Sprintf("%v acknowledged value %d, database has %d", o, o.Value, committed[o.ID].Value), o.Invoke, o.Complete)
		}
	}

	// 5. No lost update: each committed increment wrote one more than the
	// increment committed before it (flagged once, where it happens, not
	// at every later increment), and the register holds the number of
	// committed increments.
	var n int64
	var last Commit
	for _, c := range cs {
		if c.Kind != KindIncr {
			continue
		}
		n++
		if c.Value != last.Value+1 {
			f, t := span(last.OpID, c.OpID)
			add(CheckLostUpdate, fmt.Sprintf("increment #%d (%v) wrote %d after %v: it read a value that was already overwritten, an update was lost",
				n, c, c.Value, last), f, t)
		}
		last = c
	}
	if value != n {
		add(CheckLostUpdate, fmt.Sprintf("register holds %d after %d committed increments", value, n), 0, 0)
	}

	// 6. The history is linearizable as a fenced register.
	hist := porcupineHistory(ops, committed)
	unknown := false
	switch porcupine.CheckOperationsTimeout(fencedRegister, hist, linearizableTimeout) {
	case porcupine.Illegal:
		var from, to int64
		if len(vs) > 0 {
			from, to = vs[0].From, vs[0].To
		}
		add(CheckLinearizable, fmt.Sprintf("no linearization of %d operations as a fenced register", len(hist)), from, to)
	case porcupine.Unknown:
		unknown = true
	}
	return vs, unknown
}

func min64nz(a, b int64) int64 {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

// The fenced register: per resource, a counter plus the set of applied
// batches, guarded by the highest token the store has accepted. Writes
// with a lower token must be rejected; an increment must read the value
// the previous increment wrote (no lost update); a batch applies once.
//
// Operations whose outcome the worker never learned (error, SIGKILL) are
// resolved by the database: committed ones enter with their committed
// value and an open end (they may linearize any time after their
// invocation); uncommitted ones had no effect and are left out.

type regInput struct {
	Kind  string
	Token int64
	Batch int64
}

type regOutput struct {
	Outcome Outcome
	Value   int64
}

type regState struct {
	Value   int64
	MaxTok  int64
	Applied string // byte i is 1 when batch i was applied; a string keeps the state comparable
}

func (s regState) applied(b int64) bool {
	return b >= 0 && b < int64(len(s.Applied)) && s.Applied[b] == 1
}

func (s regState) withBatch(b int64) regState {
	if b < 0 {
		return s
	}
	buf := []byte(s.Applied)
	for int64(len(buf)) <= b {
		buf = append(buf, 0)
	}
	buf[b] = 1
	s.Applied = string(buf)
	return s
}

var fencedRegister = (&porcupine.NondeterministicModel{
	Init: func() []interface{} { return []interface{}{regState{}} },
	Step: func(state, input, output interface{}) []interface{} {
		s := state.(regState)
		in := input.(regInput)
		out := output.(regOutput)
		switch out.Outcome {
		case OutOK:
			if in.Token < s.MaxTok {
				return nil // a stale write committed
			}
			n := s
			n.MaxTok = in.Token
			if in.Kind == KindIncr {
				if out.Value != s.Value+1 {
					return nil
				}
				n.Value++
				return []interface{}{n}
			}
			if s.applied(in.Batch) {
				return nil
			}
			return []interface{}{n.withBatch(in.Batch)}
		case OutStale:
			if in.Token < s.MaxTok {
				return []interface{}{s}
			}
			return nil
		case OutDup:
			if !s.applied(in.Batch) {
				return nil
			}
			// Whether the rejected attempt's claim of the token stays is
			// the store's choice; both are allowed.
			raised := s
			raised.MaxTok = max(s.MaxTok, in.Token)
			return []interface{}{s, raised}
		}
		return nil
	},
	DescribeOperation: func(input, output interface{}) string {
		in, out := input.(regInput), output.(regOutput)
		return fmt.Sprintf("%s tok=%d b=%d -> %s %d", in.Kind, in.Token, in.Batch, out.Outcome, out.Value)
	},
}).ToModel()

func porcupineHistory(ops []Op, committed map[string]Commit) []porcupine.Operation {
	var h []porcupine.Operation
	for _, o := range ops {
		c, in := committed[o.ID]
		var out regOutput
		ret := o.Complete
		switch o.Outcome {
		case OutOK:
			out = regOutput{Outcome: OutOK, Value: o.Value}
		case OutStale, OutDup:
			out = regOutput{Outcome: o.Outcome}
		default: // fail, crash: the database says what happened
			if !in {
				continue
			}
			out = regOutput{Outcome: OutOK, Value: c.Value}
			ret = math.MaxInt64
		}
		if ret == 0 {
			ret = math.MaxInt64
		}
		h = append(h, porcupine.Operation{ClientId: o.Worker, Input: regInput{Kind: o.Kind, Token: o.Token, Batch: o.Batch},
			Call: o.Invoke, Output: out, Return: ret})
	}
	return h
}
