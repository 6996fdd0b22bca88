package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
)

// Event types a worker writes, one JSON object per line on its stdout.
const (
	evReady    = "ready"    // worker connected and about to work
	evAcquire  = "acquire"  // lock acquired: Resource, Token
	evLost     = "lost"     // Lock.Context() cancelled while the worker still meant to hold it
	evRelease  = "release"  // worker released the lock (Err says why if it failed)
	evInvoke   = "invoke"   // operation starts: Op, Kind, Resource, Token, Batch
	evComplete = "complete" // operation ends: Op, Outcome, Value, Err
	evLog      = "log"      // free text for the failure report
)

// Operation kinds.
const (
	KindIncr   = "incr"   // read-modify-write of the resource's register
	KindAppend = "append" // insert a batch of business rows under an idempotency key
)

// Outcome of an operation as the worker saw it.
type Outcome string

const (
	// OutOK: the transaction committed and the worker got the ack.
	OutOK Outcome = "ok"
	// OutStale: rejected because its token was stale; nothing committed.
	OutStale Outcome = "stale"
	// OutDup: rejected because its idempotency key was already applied.
	OutDup Outcome = "dup"
	// OutFail: an error whose effect is unknown (the commit may or may not
	// have happened, e.g. the connection broke during COMMIT).
	OutFail Outcome = "fail"
	// OutCrash: the worker never reported a completion (SIGKILL); unknown.
	OutCrash Outcome = "crash"
)

// Event is one line of a worker's history stream. Times are Unix
// nanoseconds from time.Now(): all processes run on one machine and read the
// same realtime clock, so times of different workers are comparable.
type Event struct {
	Type     string  `json:"type"`
	At       int64   `json:"at"`
	Worker   int     `json:"w"`
	Op       string  `json:"op,omitempty"`
	Kind     string  `json:"kind,omitempty"`
	Resource string  `json:"res,omitempty"`
	Token    int64   `json:"tok,omitempty"`
	Batch    int64   `json:"batch,omitempty"`
	Outcome  Outcome `json:"out,omitempty"`
	Value    int64   `json:"val,omitempty"`
	Err      string  `json:"err,omitempty"`
}

// Op is one operation assembled from its invoke and complete events.
type Op struct {
	ID       string
	Worker   int
	Kind     string
	Resource string
	Token    int64
	Batch    int64 // append only
	Invoke   int64
	Complete int64 // 0 when the worker never reported one
	Outcome  Outcome
	Value    int64 // incr: the value the worker wrote (read + 1)
	Err      string
}

func (o Op) String() string {
	s := fmt.Sprintf("%s w%d %s %s tok=%d", o.ID, o.Worker, o.Kind, o.Resource, o.Token)
	if o.Kind == KindAppend {
		s += fmt.Sprintf(" batch=%d", o.Batch)
	}
	s += fmt.Sprintf(" [%d..", o.Invoke)
	if o.Complete > 0 {
		s += fmt.Sprintf("%d]", o.Complete)
	} else {
		s += "?]"
	}
	s += " " + string(o.Outcome)
	if o.Kind == KindIncr && o.Outcome == OutOK {
		s += fmt.Sprintf(" val=%d", o.Value)
	}
	if o.Err != "" {
		s += " err=" + o.Err
	}
	return s
}

// Recorder collects the events of every worker of a trial. It is safe for
// concurrent use: each worker's stdout is read by its own goroutine.
type Recorder struct {
	mu     sync.Mutex
	events []Event
	bad    []string // lines that did not parse (reported, never dropped silently)
}

// Add records one event.
func (r *Recorder) Add(e Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// ReadFrom reads JSON lines from a worker's stdout until EOF. The worker id
// is forced to w so a confused worker cannot pose as another.
func (r *Recorder) ReadFrom(w int, rd io.Reader) {
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e Event
		if err := json.Unmarshal(line, &e); err != nil || e.Type == "" {
			r.mu.Lock()
			r.bad = append(r.bad, fmt.Sprintf("w%d: %s", w, line))
			r.mu.Unlock()
			continue
		}
		e.Worker = w
		r.Add(e)
	}
}

// Events returns a copy of the events in time order.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	ev := append([]Event(nil), r.events...)
	r.mu.Unlock()
	sort.SliceStable(ev, func(i, j int) bool { return ev[i].At < ev[j].At })
	return ev
}

// BadLines returns the lines that were not events (worker panics, stray
// prints); the trial report shows them.
func (r *Recorder) BadLines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bad...)
}

// Ops pairs invoke and complete events into operations, sorted by invoke
// time. An invoke without a complete is an OutCrash operation.
func Ops(events []Event) []Op {
	byID := map[string]*Op{}
	var order []string
	for _, e := range events {
		switch e.Type {
		case evInvoke:
			if _, ok := byID[e.Op]; ok {
				continue
			}
			byID[e.Op] = &Op{ID: e.Op, Worker: e.Worker, Kind: e.Kind, Resource: e.Resource,
				Token: e.Token, Batch: e.Batch, Invoke: e.At, Outcome: OutCrash}
			order = append(order, e.Op)
		case evComplete:
			o, ok := byID[e.Op]
			if !ok {
				continue
			}
			o.Complete, o.Outcome, o.Value, o.Err = e.At, e.Outcome, e.Value, e.Err
		}
	}
	ops := make([]Op, 0, len(order))
	for _, id := range order {
		ops = append(ops, *byID[id])
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Invoke < ops[j].Invoke })
	return ops
}

// Commit is one committed write as the database recorded it, in the same
// transaction as the write itself. Version is the per-resource commit
// order: each write transaction bumps the resource's register row, whose
// row lock orders concurrent writers by commit.
type Commit struct {
	Resource string
	Version  int64
	Kind     string
	Token    int64
	OpID     string
	Batch    int64
	Value    int64 // incr: the value written
	Worker   int
	At       int64 // clock_timestamp() at the write, Unix ns
}

func (c Commit) String() string {
	s := fmt.Sprintf("v%d %s %s tok=%d op=%s", c.Version, c.Kind, c.Resource, c.Token, c.OpID)
	if c.Kind == KindAppend {
		s += fmt.Sprintf(" batch=%d", c.Batch)
	} else {
		s += fmt.Sprintf(" val=%d", c.Value)
	}
	return s
}

// DBState is what the database holds at the end of a trial.
type DBState struct {
	Commits []Commit         // every committed write, by resource then version
	Values  map[string]int64 // register value per resource
	// Items counts business rows per resource, batch and item.
	Items []ItemCount
}

// ItemCount is the number of business rows with one (resource, batch, item).
type ItemCount struct {
	Resource string
	Batch    int64
	Item     int
	Count    int
}

func joinLines(xs []string) string { return strings.Join(xs, "\n") }
