package fence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// LockInfo is what the server knows about a lock name, for operators (see
// cmd/fencectl).
type LockInfo struct {
	Name    string
	Held    bool
	Holder  string        // when held
	Token   int64         // when held
	TTL     time.Duration // when held; -1 when the key has no expiry
	Counter int64         // the token counter; 0 when the key is absent
	Waiters int64         // waiters with a place in the name's queue (live or not yet skipped); -1 when the user may not HLEN
	// Election is true when the name is an election's ([Client.Election]):
	// it has a record of its last term, which Term gives as an observer
	// would ([Election.Observe]): the leader and its value while that term
	// holds the lock, else the last term, Vacant, and how it ended.
	Election bool
	Term     LeaderEvent
	// Eviction is the configuration of the node that holds the lock: when
	// Eviction.Evicts(), Redis may evict the lock under memory pressure.
	// Zero when the user may not run INFO.
	Eviction Eviction
}

// Inspect reads a lock's state in one round trip, and the eviction
// configuration of its node in a second, without changing anything.
func (c *Client) Inspect(ctx context.Context, name string) (LockInfo, error) {
	if c.isClosed() {
		return LockInfo{}, ErrClosed
	}
	if err := validateName(name); err != nil {
		return LockInfo{}, err
	}
	k := keysFor(c.cfg.prefix, name)
	pipe := c.rdb.Pipeline()
	val := pipe.Get(ctx, k.lock)
	pttl := pipe.PTTL(ctx, k.lock)
	seq := pipe.Get(ctx, k.seq)
	waiters := pipe.HLen(ctx, k.waiters)
	record := pipe.Get(ctx, k.lock+":v")
	_, _ = pipe.Exec(ctx) // per-command errors are read below
	info := LockInfo{Name: name}
	switch v, err := val.Result(); {
	case errors.Is(err, redis.Nil): // not held
	case err != nil:
		return LockInfo{}, fmt.Errorf("fence: inspect %q: %w", name, err)
	default:
		// '<token>:<holder>' (see acquire.lua).
		t, h, ok := strings.Cut(v, ":")
		if !ok {
			return LockInfo{}, fmt.Errorf("fence: inspect %q: the lock's value %q is not <token>:<holder>", name, v)
		}
		info.Held, info.Holder = true, h
		if info.Token, err = strconv.ParseInt(t, 10, 64); err != nil {
			return LockInfo{}, fmt.Errorf("fence: inspect %q: token %q: %w", name, t, err)
		}
		if info.TTL, err = pttl.Result(); err != nil {
			return LockInfo{}, fmt.Errorf("fence: inspect %q: %w", name, err)
		}
	}
	// redis.Nil (no counter yet) is the one expected miss.
	switch n, err := seq.Int64(); {
	case errors.Is(err, redis.Nil):
	case err != nil:
		return LockInfo{}, fmt.Errorf("fence: inspect %q: counter: %w", name, err)
	default:
		info.Counter = n
	}
	switch n, err := waiters.Result(); {
	case redis.HasErrorPrefix(err, "NOPERM"):
		info.Waiters = -1 // HLEN is an operator's command, not in the application's ACL line
	case err != nil:
		return LockInfo{}, fmt.Errorf("fence: inspect %q: queue: %w", name, err)
	default:
		info.Waiters = n
	}
	switch r, err := record.Result(); {
	case errors.Is(err, redis.Nil):
	case err != nil:
		return LockInfo{}, fmt.Errorf("fence: inspect %q: term record: %w", name, err)
	default:
		st := electionState{held: info.Held, holder: info.Holder, token: info.Token, ttl: info.TTL, hasRec: true}
		if st.rec, err = parseRecord(r); err != nil {
			return LockInfo{}, fmt.Errorf("fence: inspect %q: %w", name, err)
		}
		info.Election, info.Term = true, readObservation(st).event()
	}
	info.Eviction, _ = c.evictionFor(ctx, k.lock) // INFO may be denied: reported as unknown
	return info, nil
}

// RaiseCounter raises name's token counter to at least floor (never lowers
// it) and returns its value afterwards; every later token is greater. It
// repairs a counter that fell behind the tokens a database has seen (the
// counter was lost and the Redis clock ran backwards), so that new holders
// are accepted again.
func (c *Client) RaiseCounter(ctx context.Context, name string, floor int64) (int64, error) {
	if c.isClosed() {
		return 0, ErrClosed
	}
	if err := validateName(name); err != nil {
		return 0, err
	}
	if floor < 0 || floor >= 1<<53 {
		return 0, invalidOption("RaiseCounter(%q, %d): the floor must be between 0 and 2^53 (exact in the script)", name, floor)
	}
	k := keysFor(c.cfg.prefix, name)
	s, err := c.runScript(ctx, raiseScript, []string{k.seq}, strconv.FormatInt(floor, 10), seqIdleExpiry).Text()
	if err != nil {
		return 0, fmt.Errorf("fence: raise counter %q: %w", name, err)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("fence: raise counter %q: unexpected reply %q", name, s)
	}
	return n, nil
}

// ForceRelease ends the lock that seen (from [Client.Inspect]) describes,
// for an operator breaking a lock whose holder is stuck, as the holder's
// own Release would: the first live waiter gets it (and is told), or it
// is deleted. It deletes nothing
// and returns [ErrNotHeld] when the lock is no longer that one (released,
// expired, or taken again: another token or holder) or seen says it is not
// held. woken is false when the release message was refused (a Redis user
// without PUBLISH): waiters then learn of it at their next heartbeat.
//
// The holder is not told. It keeps running until its next renewal finds
// the lock gone (its context is then cancelled, within a renewal period),
// so in the meantime only the fence in the database (package guard) keeps
// its writes out. An election's term (seen.Election) is ended as its
// leader's resignation would: its observers see a resignation, or the
// next candidate's term.
func (c *Client) ForceRelease(ctx context.Context, seen LockInfo) (woken bool, err error) {
	if c.isClosed() {
		return false, ErrClosed
	}
	if err := validateName(seen.Name); err != nil {
		return false, err
	}
	switch {
	case !seen.Held:
		return false, fmt.Errorf("%w: force release %q: it was not held when inspected: nothing to release", ErrNotHeld, seen.Name)
	case seen.Token <= 0 || seen.Holder == "":
		return false, invalidOption("ForceRelease(%q): the LockInfo has no token or holder: pass what Inspect returned", seen.Name)
	}
	k := keysFor(c.cfg.prefix, seen.Name)
	value := strconv.FormatInt(seen.Token, 10) + ":" + seen.Holder
	script, scriptKeys := c.scripts.release, k.scriptKeys()
	if seen.Election {
		script, scriptKeys = electScriptsFor(c.cluster).release, electionKeys(k)
	}
	sent := time.Now()
	rep, err := parseRelease(c.runScript(ctx, script, scriptKeys, value))
	if err != nil {
		c.refreshTopology(err)
		return false, fmt.Errorf("fence: force release %q: %w", seen.Name, err)
	}
	if rep.handedOver() {
		c.notify.handedTo(k.channel, rep.value, sent)
	}
	if rep.refused != "" {
		c.warnPublishRefused(seen.Name, rep.refused)
	}
	switch rep.outcome {
	case releaseOK, releaseHandedOver:
		return true, nil
	case releaseUnpublished, releaseHandedUnpublished:
		return false, nil
	}
	return false, fmt.Errorf("%w: force release %q: the lock changed since it was inspected (released, expired or taken again): nothing deleted", ErrNotHeld, seen.Name)
}

// infoer is a client that can run INFO (every go-redis client; a
// [RedisClient] wrapper may not).
type infoer interface {
	Info(ctx context.Context, section ...string) *redis.StringCmd
}

// Eviction is a server's eviction configuration, as [Client.Inspect]
// reports it for the node that holds a lock.
type Eviction struct {
	Addr      string // the node, when known
	Policy    string // maxmemory-policy
	Maxmemory int64  // bytes; 0 means no limit, nothing is evicted
}

// Evicts reports whether the server may evict lock keys: a memory limit
// is set and the policy is not noeviction. fence's keys all have an
// expiry, so volatile-* policies may evict them as well as allkeys-*.
func (e Eviction) Evicts() bool {
	return e.Maxmemory > 0 && e.Policy != "" && e.Policy != "noeviction"
}

// readEviction reads maxmemory and maxmemory-policy with INFO memory,
// which managed services allow more often than CONFIG GET.
func readEviction(ctx context.Context, node infoer) (Eviction, error) {
	s, err := node.Info(ctx, "memory").Result()
	if err != nil {
		return Eviction{}, err
	}
	var ev Eviction
	if n, ok := node.(*redis.Client); ok && !isFailoverClient(n) {
		ev.Addr = n.Options().Addr // a failover client's is a placeholder
	}
	for line := range strings.Lines(s) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "maxmemory_policy":
			ev.Policy = v
		case "maxmemory":
			ev.Maxmemory, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return ev, nil
}

// evictionFor reads the eviction configuration of the node that holds key.
func (c *Client) evictionFor(ctx context.Context, key string) (Eviction, error) {
	node, _ := c.rdb.(infoer)
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		n, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return Eviction{}, err
		}
		node = n
	}
	if node == nil {
		return Eviction{}, errors.New("fence: the Redis client cannot run INFO")
	}
	return readEviction(ctx, node)
}
