package tick

import (
	"encoding/json"
	"fmt"
	"time"
)

// LedgerKey is the run key of a job's ledger: a run of the job's resource
// that is never finished, so that Prune never deletes it, whose cursor
// records the newest tick started, whether it finished and by which token,
// the last finished ticks and the last missed ones (read by fencectl ticks
// list). It is written in fenced steps like any run: a stale holder cannot
// move it.
const LedgerKey = "tick-ledger"

// ledgerVersion is the layout of the ledger's cursor.
const ledgerVersion = 1

// ledgerKeep bounds the finished and missed ticks the ledger remembers:
// the ledger is rewritten twice per tick and stays a few kilobytes.
const ledgerKeep = 32

// Ledger is what a job's ledger records: the JSON cursor of its LedgerKey
// run, as [ParseLedger] reads it (fencectl ticks list does).
type Ledger struct {
	V int `json:"v"`
	// Newest is the newest tick started (zero before the first);
	// Finished says it finished, Token is the token that started it
	// (running) or finished it.
	Newest   time.Time `json:"newest,omitzero"`
	Finished bool      `json:"finished,omitempty"`
	Token    int64     `json:"token,omitempty"`
	// Done are the last finished ticks with the token that finished each,
	// oldest first.
	Done []DoneTick `json:"done,omitempty"`
	// Missed are the last runs of missed ticks, oldest first.
	Missed []MissedTicks `json:"missed,omitempty"`
}

// DoneTick is a finished tick and the token that finished it.
type DoneTick struct {
	At    time.Time `json:"at"`
	Token int64     `json:"token"`
}

// MissedTicks are Count ticks, from First to Last, that no instance ran,
// found when the tick Found started.
type MissedTicks struct {
	First time.Time `json:"first"`
	Last  time.Time `json:"last"`
	Count int64     `json:"count"`
	Found time.Time `json:"found"`
}

// ParseLedger reads the cursor of a job's ledger run (run key LedgerKey of
// the job's resource, in fencelock.runs). An empty cursor is an empty
// ledger; one this version cannot read is an error matching [ErrLedger].
func ParseLedger(cursor string) (Ledger, error) { return decodeLedger("", cursor) }

type ledger = Ledger

func decodeLedger(job, cursor string) (ledger, error) {
	l := ledger{V: ledgerVersion}
	if cursor == "" {
		return l, nil
	}
	if err := json.Unmarshal([]byte(cursor), &l); err != nil {
		return l, fmt.Errorf("%w: %srun %q: %v: it is written by this package alone; if it was edited by hand, restore it or delete its row (fencelock.runs) and the job starts afresh", ErrLedger, ofJob(job), LedgerKey, err)
	}
	if l.V != ledgerVersion {
		return l, fmt.Errorf("%w: %srun %q has layout version %d, this version reads %d: run every instance of the job on the same version of fencelock", ErrLedger, ofJob(job), LedgerKey, l.V, ledgerVersion)
	}
	return l, nil
}

func (l ledger) encode() string {
	b, err := json.Marshal(l)
	if err != nil {
		panic("tick: ledger: " + err.Error()) // times and ints always marshal
	}
	return string(b)
}

// doneBy is the token that finished t, 0 when the ledger no longer
// remembers it.
func (l ledger) doneBy(t time.Time) int64 {
	for i := len(l.Done) - 1; i >= 0; i-- {
		if l.Done[i].At.Equal(t) {
			return l.Done[i].Token
		}
	}
	return 0
}

// started is l once tick t started with token.
func (l ledger) started(t time.Time, token int64) ledger {
	l.Newest, l.Finished, l.Token = t, false, token
	return l
}

// finished is l once tick t (its newest) finished with token.
func (l ledger) finished(t time.Time, token int64) ledger {
	l.Newest, l.Finished, l.Token = t, true, token
	l.Done = keepLast(append(l.Done[:len(l.Done):len(l.Done)], DoneTick{At: t, Token: token}))
	return l
}

func keepLast[T any](s []T) []T {
	if len(s) > ledgerKeep {
		return s[len(s)-ledgerKeep:]
	}
	return s
}

func ofJob(job string) string {
	if job == "" {
		return ""
	}
	return fmt.Sprintf("job %q: ", job)
}
