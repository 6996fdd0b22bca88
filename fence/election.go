package fence

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Elections: a name's lock whose holdings are terms, with the leader's
// value and a record of the last term kept beside it (see elect.lua, and
// "Elections" in the package documentation).

const (
	// DefaultTermLease is a term's lease unless the [Client.Election]
	// call's options set one ([WithLease]): short, so that a dead leader's
	// term ends soon; a live leader's watchdog renews it every lease/3.
	// The client's own default lease does not apply to terms.
	DefaultTermLease = 5 * time.Second
	// MaxValueLen is the longest leader value accepted, in bytes: a value
	// is stored with the term and sent whole to every observer at every
	// change.
	MaxValueLen = 64 << 10
)

// Election is a leader election on one name: [Election.Campaign] waits to
// become the leader, the term it returns is a [*Lock] whose Release
// resigns, [Election.Leader] reads the current leader and
// [Election.Observe] follows the changes. Make one with
// [Client.Election]; it is safe for concurrent use, and any number of
// Campaigns may wait on it at once (each is a candidate of its own).
type Election struct {
	c    *Client
	name string
	cfg  config
	k    keys
	// keys are the election scripts' six: the lock's four, the record and
	// the candidates' values (see elect.lua).
	keys    []string
	record  string
	events  string // the channel of the records
	scripts *scriptSet
}

// campaign is the part of an acquisition's config that makes it a
// Campaign: the election and the candidate's value.
type campaign struct {
	e     *Election
	value string
}

// Election returns the election called name: the lock of that name, its
// terms being its holdings (so name follows the rules of lock names, and
// [Client.Acquire] of the same name would compete with the candidates
// without being seen by observers: use Campaign). opts set the terms and
// the campaigns: [WithLease] the term's lease (default [DefaultTermLease],
// not the client's lease), [WithLiveness] how long a candidate keeps its
// place without a heartbeat, [WithHolder] the candidate's id,
// [WithWaitLimit] a bound on every Campaign, [WithMaxHold] and
// [WithReplicaSync] as for a lock. [WithFixedLease] is refused: a term is
// renewed for as long as the leader lives. Nothing is sent.
func (c *Client) Election(name string, opts ...LockOption) (*Election, error) {
	if c.isClosed() {
		return nil, ErrClosed
	}
	if err := validateName(name); err != nil {
		return nil, err
	}
	cfg := c.cfg
	cfg.lease, cfg.fixed = DefaultTermLease, false
	if err := cfg.applyLock(opts); err != nil {
		return nil, err
	}
	if cfg.fixed {
		return nil, invalidOption("Election(%q): %s: a term is renewed while its leader lives; give WithLease", name, cfg.given[setLease])
	}
	k := keysFor(cfg.prefix, name)
	e := &Election{c: c, name: name, cfg: cfg, k: k, record: k.lock + ":v", events: k.lock + ":ev",
		scripts: electScriptsFor(c.cluster)}
	e.keys = electionKeys(k)
	return e, nil
}

// electionKeys are the six keys of an election's scripts: the lock's
// four, the record of its terms and the candidates' values (see
// elect.lua).
func electionKeys(k keys) []string { return append(k.scriptKeys(), k.lock+":v", k.lock+":cv") }

// Name is the election's name.
func (e *Election) Name() string { return e.name }

// Campaign waits until this candidate is the leader and returns its term:
// a [*Lock] whose token is the term's fencing token (pass it with the
// leader's writes, see package guard), whose context ends when the term
// does (resigned, lost, or the client closed), and whose Release resigns,
// handing the leadership to the next candidate in the same script.
// Candidates are served in the order they campaigned, across processes
// (the lock's queue). value is the leader's value while the term lasts
// (an address, say; at most [MaxValueLen] bytes; see [Election.Proclaim]).
//
// Campaign waits for as long as ctx lets it (or the Election's
// [WithWaitLimit]); its error then matches [ErrNotAcquired] and ctx's.
// It waits through short outages and failovers like Acquire, but a
// candidate whose calls fail for a whole liveness period has lost its
// place in the queue: Campaign then returns an error matching
// [ErrNotAcquired] that names the last error, and never a term Redis did
// not grant. After Redis lost its data (a restart without persistence) a
// candidate joins the queue again, and its term has a token greater than
// every earlier one's (see "Tokens" in the package documentation).
//
// With [WithHolder], a candidate whose id leads already gets its term
// back (same token), its value proclaimed if it differs.
func (e *Election) Campaign(ctx context.Context, value string) (*Lock, error) {
	if err := checkValue("Campaign", e.name, value); err != nil {
		return nil, err
	}
	if e.c.isClosed() {
		return nil, ErrClosed
	}
	cfg := e.cfg
	cfg.campaign = &campaign{e: e, value: value}
	return e.c.acquire(ctx, e.name, e.k, &cfg)
}

func checkValue(call, name, value string) error {
	if len(value) > MaxValueLen {
		return invalidOption("%s(%q): the value is %d bytes, the limit is %d (MaxValueLen); keep a reference to a larger one",
			call, name, len(value), MaxValueLen)
	}
	return nil
}

// Proclaim makes value the leader's value without a new term: term must
// be a term of this election that is still held. Observers see the new
// value with the same token. A term that ended (or that the server no
// longer holds, which ends it) is refused with an error matching
// [ErrNotHeld] and the term's own error. ctx bounds the round trip.
func (e *Election) Proclaim(ctx context.Context, term *Lock, value string) error {
	switch {
	case term == nil:
		return errNilLock("Proclaim")
	case term.elect == nil || term.c != e.c || term.name != e.name:
		return invalidOption("Proclaim(%q): %v is not a term of this election; pass what its Campaign returned", e.name, term)
	}
	if err := checkValue("Proclaim", e.name, value); err != nil {
		return err
	}
	if e.c.isClosed() {
		return ErrClosed
	}
	if err := term.Err(); err != nil {
		return ended(term, "ended before Proclaim", err)
	}
	res, other, err := parseRenew(e.c.runScript(ctx, e.scripts.proclaim, e.keys, term.valueArgs[0], value))
	if err != nil {
		e.c.refreshTopology(err)
		return fmt.Errorf("fence: proclaim %q: %w", e.name, e.c.withFix(err))
	}
	if res != renewOK {
		cause := term.renewLoss(res, other)
		e.c.wd.lose(term, cause, time.Now())
		return ended(term, "found by Proclaim", cause)
	}
	return nil
}

// Leader is an election's leader as one read saw it.
type Leader struct {
	Holder string
	Token  int64
	Value  string
	// TTL is what is left of the term's lease on the server (-1: no
	// expiry); the leader's watchdog renews it every lease/3.
	TTL time.Duration
}

// Leader reads the current leader in one round trip. When no term holds
// the election's lock it returns an error matching [ErrNoLeader] that
// says how the last known term ended.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	if e.c.isClosed() {
		return Leader{}, ErrClosed
	}
	st, err := e.read(ctx)
	if err != nil {
		return Leader{}, fmt.Errorf("fence: leader of %q: %w", e.name, e.c.withFix(err))
	}
	if !st.held {
		return Leader{}, st.noLeader(e.name)
	}
	return Leader{Holder: st.holder, Token: st.token, Value: st.value(), TTL: st.ttl}, nil
}

// termRecord is the record of a term (see elect.lua).
type termRecord struct {
	resigned bool // state R; else L (leading, or expired since)
	how      byte // how the term before it ended: 'H', 'R', 'E' or '-'
	token    int64
	seq      int64
	prev     int64
	lease    time.Duration // the term's lease when it began
	holder   string
	value    string
}

// parseRecord reads '<state><how>:<token>:<seq>:<prev>:<lease>:<holder
// length>:<holder><value>'.
func parseRecord(r string) (termRecord, error) {
	bad := func() (termRecord, error) { return termRecord{}, fmt.Errorf("fence: unexpected term record %.80q", r) }
	if len(r) < 3 || (r[0] != 'L' && r[0] != 'R') || r[2] != ':' {
		return bad()
	}
	rec := termRecord{resigned: r[0] == 'R', how: r[1]}
	rest := r[3:]
	var nums [5]int64
	for i := range nums {
		f, after, ok := strings.Cut(rest, ":")
		n, err := strconv.ParseInt(f, 10, 64)
		if !ok || err != nil || n < 0 {
			return bad()
		}
		nums[i], rest = n, after
	}
	if nums[4] > int64(len(rest)) {
		return bad()
	}
	rec.token, rec.seq, rec.prev = nums[0], nums[1], nums[2]
	rec.lease = time.Duration(nums[3]) * time.Millisecond
	rec.holder, rec.value = rest[:nums[4]], rest[nums[4]:]
	return rec, nil
}

// electionState is one read of an election (leader.lua).
type electionState struct {
	held   bool
	holder string
	token  int64
	ttl    time.Duration
	rec    termRecord
	hasRec bool
}

// read reads the lock and the record at one instant.
func (e *Election) read(ctx context.Context) (electionState, error) {
	v, err := e.c.runScript(ctx, leaderScript, []string{e.k.lock, e.record}).Result()
	if err != nil {
		e.c.refreshTopology(err)
		return electionState{}, err
	}
	arr, _ := v.([]any)
	if len(arr) != 3 {
		return electionState{}, fmt.Errorf("fence: unexpected election reply %#v", v)
	}
	var st electionState
	if lv, ok := arr[0].(string); ok {
		if st.token, err = tokenOf(lv); err != nil {
			return electionState{}, err
		}
		st.held, st.holder = true, holderOf(lv)
		pttl, _ := arr[1].(int64)
		st.ttl = pttlDuration(pttl)
	}
	if rv, ok := arr[2].(string); ok {
		if st.rec, err = parseRecord(rv); err != nil {
			return electionState{}, err
		}
		st.hasRec = true
	}
	return st, nil
}

// termRec reports whether the record is the held term's.
func (st electionState) termRec() bool {
	return st.held && st.hasRec && !st.rec.resigned && st.rec.token == st.token
}

// value is the leader's value: the record's when it is the held term's
// ("" for a term a plain Acquire made).
func (st electionState) value() string {
	if st.termRec() {
		return st.rec.value
	}
	return ""
}

func (st electionState) noLeader(name string) error {
	if !st.hasRec {
		return fmt.Errorf("%w: election %q has no leader, and no term is recorded (none in the last 30 days, or Redis lost its data)", ErrNoLeader, name)
	}
	how := "expired (its leader died, paused or was cut off from Redis)"
	if st.rec.resigned {
		how = "resigned"
	}
	return fmt.Errorf("%w: election %q has no leader: the last term, token %d of %q, %s", ErrNoLeader, name,
		st.rec.token, st.rec.holder, how)
}
