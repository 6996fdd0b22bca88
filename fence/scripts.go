package fence

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed queue.lua
	queueLua string
	//go:embed acquire.lua
	acquireLua string
	//go:embed release.lua
	releaseLua string
	//go:embed leave.lua
	leaveLua string
	//go:embed renew.lua
	renewLua string
	//go:embed raise.lua
	raiseLua string

	// Wrapped once; Run sends EVALSHA and falls back to EVAL. The scripts
	// that issue tokens or touch the queue share queue.lua's functions,
	// so that an acquisition and a handover follow one token rule.
	acquireScript = redis.NewScript(queueLua + acquireLua)
	releaseScript = redis.NewScript(queueLua + releaseLua)
	leaveScript   = redis.NewScript(queueLua + leaveLua)
	renewScript   = redis.NewScript(renewLua)
	raiseScript   = redis.NewScript(raiseLua)
)

// Renewal outcomes returned by renew.lua.
const (
	renewOK       = 1
	renewGone     = 0
	renewNotOurs  = -1
	seqIdleExpiry = 30 * 24 * 60 * 60 * 1000 // ms; the clock floor covers a counter that idled out
)

// acquire.lua's modes (ARGV[6]), boxed once.
var (
	modeTry  any = "t" // TryAcquire: never queue
	modeWait any = "w" // Acquire's first call: join the queue if not acquired
	modeBeat any = "b" // a waiter's heartbeat: stay in the queue, never join it
)

// acquireReply is the decoded answer of acquire.lua.
type acquireReply struct {
	acquired   bool
	reacquired bool   // held by the same holder id already: same token, lease restarted
	token      int64  // when acquired
	value      string // when acquired: the lock's value '<token>:<holder>'
	pttl       int64  // ms, when not acquired (-1: no expiry, 0: try again at once)
	queued     bool   // when not acquired: the caller is in the queue
	now        int64  // the server's clock in µs
}

func parseAcquire(v any) (acquireReply, error) {
	arr, ok := v.([]any)
	if !ok || len(arr) < 3 {
		return acquireReply{}, fmt.Errorf("fence: unexpected acquire reply %#v", v)
	}
	flag, ok1 := arr[0].(int64)
	nowS, ok2 := arr[2].(string)
	now, err := strconv.ParseInt(nowS, 10, 64)
	if !ok1 || !ok2 || err != nil {
		return acquireReply{}, fmt.Errorf("fence: unexpected acquire reply %#v", v)
	}
	if flag == 1 || flag == 2 {
		v, ok := arr[1].(string)
		if !ok {
			return acquireReply{}, fmt.Errorf("fence: unexpected acquire reply %#v", arr[1])
		}
		tok, err := tokenOf(v)
		if err != nil {
			return acquireReply{}, err
		}
		return acquireReply{acquired: true, reacquired: flag == 2, token: tok, value: v, now: now}, nil
	}
	pttl, ok := arr[1].(int64)
	if !ok || len(arr) != 4 {
		return acquireReply{}, fmt.Errorf("fence: unexpected acquire reply %#v", v)
	}
	q, _ := arr[3].(int64)
	return acquireReply{pttl: pttl, queued: q == 1, now: now}, nil
}

// tokenOf reads the token of a lock value '<token>:<holder>'.
func tokenOf(value string) (int64, error) {
	s, _, _ := strings.Cut(value, ":")
	tok, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("fence: unexpected lock value %q: %w", value, err)
	}
	return tok, nil
}

// Release outcomes returned by release.lua (and leave.lua when it passes
// a handover on).
const (
	releaseNotOurs           = 0
	releaseOK                = 1
	releaseUnpublished       = 2 // deleted; the release message was refused
	releaseHandedOver        = 3 // the first live waiter holds it now
	releaseHandedUnpublished = 4 // handed over; the message was refused
)

// parseRelease decodes release.lua's answer: the outcome, and the new
// holder's lock value after a handover.
func parseRelease(cmd *redis.Cmd) (outcome int64, value string, err error) {
	v, err := cmd.Result()
	if err != nil {
		return 0, "", err
	}
	arr, ok := v.([]any)
	if ok && len(arr) >= 1 {
		n, ok := arr[0].(int64)
		switch {
		case ok && n <= releaseUnpublished && len(arr) == 1:
			return n, "", nil
		case ok && len(arr) == 2:
			if s, ok := arr[1].(string); ok {
				return n, s, nil
			}
		}
	}
	return 0, "", fmt.Errorf("fence: unexpected release reply %#v", v)
}

// grantPrefix starts the message a handover publishes:
// "grant:<server µs>:<token>:<holder>". A release without handover
// publishes the released value, which starts with a digit.
const grantPrefix = "grant:"

// parseGrant reads a handover message: the server time of the handover
// (µs) and the new lock value. ok is false for a plain release message.
func parseGrant(payload string) (at int64, value string, ok bool) {
	rest, ok := strings.CutPrefix(payload, grantPrefix)
	if !ok {
		return 0, "", false
	}
	ts, value, ok := strings.Cut(rest, ":")
	if !ok {
		return 0, "", false
	}
	at, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || !strings.Contains(value, ":") {
		return 0, "", false
	}
	return at, value, true
}

// holderOf is the holder part of a lock value '<token>:<holder>'.
func holderOf(value string) string {
	_, h, _ := strings.Cut(value, ":")
	return h
}

// parseRenew decodes renew.lua's answer: renewOK, renewGone, or
// renewNotOurs with the value found (another acquisition's
// '<token>:<holder>').
func parseRenew(cmd *redis.Cmd) (res int64, other string, err error) {
	v, err := cmd.Result()
	if err != nil {
		return 0, "", err
	}
	switch x := v.(type) {
	case int64:
		if x == renewOK || x == renewGone {
			return x, "", nil
		}
	case string:
		return renewNotOurs, x, nil
	}
	return 0, "", fmt.Errorf("fence: unexpected renew reply %#v", v)
}

// isNoScript reports a script cache miss (after a restart or failover).
func isNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

// execScripts sends one EVALSHA per call (of s, or of the call's own
// script) in one pipeline (the cluster client splits it per node: one
// round trip per node). When a
// node lost its script cache (restart, failover), the misses are sent once
// more in one pipeline whose first command per node is an EVAL: that loads
// the script on the node for the EVALSHAs behind it on the same
// connection, without SCRIPT LOAD, which a restricted ACL user may not
// have (+@all -script), and without sending the script's body with every
// call. Each returned *redis.Cmd carries its own result or error.
func execScripts(ctx context.Context, rdb scripter, s *redis.Script, calls []scriptCall) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	pipe := rdb.Pipeline()
	for i, c := range calls {
		cmds[i] = c.scriptOr(s).EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // per-command errors are read below
	var retry []int
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			retry = append(retry, i)
		}
	}
	if len(retry) == 0 {
		return cmds
	}
	cc, _ := rdb.(*redis.ClusterClient)
	type nodeScript struct {
		node any
		s    *redis.Script
	}
	loaded := map[nodeScript]bool{} // nodes that get an EVAL of a script in this pipeline
	pipe = rdb.Pipeline()
	for _, i := range retry {
		c := calls[i]
		sc := c.scriptOr(s)
		var node any = rdb // without a cluster, one node
		if cc != nil {
			if n, err := cc.MasterForKey(ctx, c.keys[0]); err == nil {
				node = n
			} else {
				node = nil // unknown: EVAL this one
			}
		}
		if k := (nodeScript{node, sc}); node == nil || !loaded[k] {
			loaded[k] = node != nil
			cmds[i] = sc.Eval(ctx, pipe, c.keys, c.args...)
		} else {
			cmds[i] = sc.EvalSha(ctx, pipe, c.keys, c.args...)
		}
	}
	_, _ = pipe.Exec(ctx)
	return cmds
}

type scriptCall struct {
	script *redis.Script // nil: the one execScripts is given
	keys   []string
	args   []any
}

func (c scriptCall) scriptOr(s *redis.Script) *redis.Script {
	if c.script != nil {
		return c.script
	}
	return s
}
