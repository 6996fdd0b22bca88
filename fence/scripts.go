package fence

import (
	"context"
	_ "embed"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

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
	//go:embed elect.lua
	electLua string
	//go:embed proclaim.lua
	proclaimLua string
	//go:embed leader.lua
	leaderLua string

	// Wrapped once; Run sends EVALSHA and falls back to EVAL.
	scriptSets   = [2]scriptSet{newScriptSet("PUBLISH", false), newScriptSet("SPUBLISH", false)}
	electSets    = [2]scriptSet{newScriptSet("PUBLISH", true), newScriptSet("SPUBLISH", true)}
	renewScript  = redis.NewScript(renewLua)
	raiseScript  = redis.NewScript(raiseLua)
	leaderScript = redis.NewScript(leaderLua)
)

// scriptSet is acquire.lua, release.lua and leave.lua for one way of
// notifying waiters: PUBLISH, or SPUBLISH on a cluster (sharded pub/sub).
// They share queue.lua's functions, so that an acquisition and a handover
// follow one token rule. The command is a line at the top of each script
// rather than an argument of every call: each argument costs the server
// more than the line does.
//
// An election's set (elect) is the same scripts with elect.lua after that
// line, before the script, and their "--elect " lines made code, plus proclaim.lua: a
// script per kind again, so that a lock's scripts carry nothing of
// elections, not even a test.
type scriptSet struct {
	acquire, release, leave *redis.Script
	proclaim                *redis.Script // elections only
}

// The lines of acquire.lua, release.lua and leave.lua where queue.lua's
// two parts go: its token rule (now, next_token), and what follows its
// own queueMark line (queue).
const (
	tokensMark = "--@tokens\n"
	queueMark  = "--@queue\n"
)

// electLine is the marker of a line that is code only in an election's
// scripts (see elect.lua).
var electLine = regexp.MustCompile(`(?m)^(\s*)--elect `)

func newScriptSet(publish string, elect bool) scriptSet {
	head := "local publish = '" + publish + "'\n"
	body := func(s string) string { return s }
	if elect {
		head += electLua
		body = func(s string) string { return electLine.ReplaceAllString(s, "$1") }
	}
	tokens, queue, ok := strings.Cut(body(queueLua), queueMark)
	if !ok {
		panic("fence: queue.lua has no " + queueMark + " line")
	}
	// queue.lua's two parts go in at each script's marker lines, so that
	// a path that ends before them does not define what it does not use
	// (see queue.lua).
	compose := func(script string) *redis.Script {
		s := body(script)
		for _, part := range [...]struct{ mark, lua string }{{tokensMark, tokens}, {queueMark, queue}} {
			if strings.Count(s, part.mark) != 1 {
				panic("fence: a script needs one " + part.mark + " line")
			}
			s = strings.Replace(s, part.mark, part.lua, 1)
		}
		return redis.NewScript(head + s)
	}
	set := scriptSet{
		acquire: compose(acquireLua),
		release: compose(releaseLua),
		leave:   compose(leaveLua),
	}
	if elect {
		set.proclaim = redis.NewScript(head + proclaimLua)
	}
	return set
}

// scriptsFor returns the scripts of a client: sharded (a cluster) or not.
func scriptsFor(sharded bool) *scriptSet {
	if sharded {
		return &scriptSets[1]
	}
	return &scriptSets[0]
}

// electScriptsFor returns the scripts of an election of a client.
func electScriptsFor(sharded bool) *scriptSet {
	if sharded {
		return &electSets[1]
	}
	return &electSets[0]
}

// Renewal outcomes returned by renew.lua.
const (
	renewOK       = 1
	renewGone     = 0
	renewNotOurs  = -1
	seqIdleExpiry = 30 * 24 * 60 * 60 * 1000 // ms, as queue.lua's counter_ttl; the clock floor covers a counter that idled out
)

// acquire.lua's modes: the first character of its ARGV[3].
type mode uint8

const (
	modeTry  mode = iota // TryAcquire: never queue
	modeWait             // Acquire's first call: join the queue if not acquired
	modeBeat             // a waiter's heartbeat: stay in the queue, never join it
	numModes
)

// modeArgs makes acquire.lua's ARGV[3] for each mode: the mode, and for
// a waiter its liveness and grant lease in ms.
func modeArgs(liveness, grant time.Duration) [numModes]any {
	wait := ":" + strconv.FormatInt(liveness.Milliseconds(), 10) + ":" + strconv.FormatInt(grant.Milliseconds(), 10)
	return [numModes]any{"t", "w" + wait, "b" + wait}
}

// acquireReply is the decoded answer of acquire.lua.
type acquireReply struct {
	acquired   bool
	reacquired bool   // held by the same holder id already: same token, lease restarted
	token      int64  // when acquired
	value      string // when acquired: the lock's value '<token>:<holder>'
	pttl       int64  // ms, when not acquired (-1: no expiry, 0: try again at once)
	queued     bool   // when not acquired: the caller is in the queue
	now        int64  // when not acquired: the server's clock in µs
}

func parseAcquire(v any) (acquireReply, error) {
	if value, ok := v.(string); ok {
		tok, err := tokenOf(value)
		if err != nil {
			return acquireReply{}, err
		}
		return acquireReply{acquired: true, token: tok, value: value}, nil
	}
	arr, _ := v.([]any)
	flag, ok := firstInt(arr)
	switch {
	case ok && flag == 2 && len(arr) == 2:
		v, ok := arr[1].(string)
		if !ok {
			break
		}
		tok, err := tokenOf(v)
		if err != nil {
			return acquireReply{}, err
		}
		return acquireReply{acquired: true, reacquired: true, token: tok, value: v}, nil
	case ok && flag == 0 && len(arr) == 4:
		pttl, ok1 := arr[1].(int64)
		now, ok2 := arr[2].(int64)
		q, ok3 := arr[3].(int64)
		if ok1 && ok2 && ok3 {
			return acquireReply{pttl: pttl, queued: q == 1, now: now}, nil
		}
	}
	return acquireReply{}, fmt.Errorf("fence: unexpected acquire reply %#v", v)
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

// releaseReply is release.lua's (and leave.lua's) decoded answer.
type releaseReply struct {
	outcome int64  // releaseNotOurs ... releaseHandedUnpublished
	value   string // the new holder's lock value after a handover
	refused string // why the notification was refused (Redis's error)
}

// handedOver reports a handover, published or not.
func (r releaseReply) handedOver() bool {
	return r.outcome == releaseHandedOver || r.outcome == releaseHandedUnpublished
}

func parseRelease(cmd *redis.Cmd) (releaseReply, error) {
	v, err := cmd.Result()
	if err != nil {
		return releaseReply{}, err
	}
	if n, ok := v.(int64); ok && (n == releaseNotOurs || n == releaseOK) {
		return releaseReply{outcome: n}, nil
	}
	arr, _ := v.([]any)
	n, ok := firstInt(arr)
	var rep releaseReply
	switch {
	case !ok:
	case n == releaseUnpublished && len(arr) == 2:
		rep.refused, ok = arr[1].(string)
		rep.outcome = n
		if ok {
			return rep, nil
		}
	case n == releaseHandedOver && len(arr) == 2, n == releaseHandedUnpublished && len(arr) == 3:
		rep.outcome = n
		rep.value, ok = arr[1].(string)
		if n == releaseHandedUnpublished && ok {
			rep.refused, ok = arr[2].(string)
		}
		if ok {
			return rep, nil
		}
	}
	return releaseReply{}, fmt.Errorf("fence: unexpected release reply %#v", v)
}

func firstInt(arr []any) (int64, bool) {
	if len(arr) == 0 {
		return 0, false
	}
	n, ok := arr[0].(int64)
	return n, ok
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
//
// route, when not nil, may refuse a call before it is sent (a cluster
// node that is not a master, see clusterView): the call's Cmd carries
// route's error.
func execScripts(ctx context.Context, rdb scripter, s *redis.Script, calls []scriptCall, route routeFunc) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	pipe := rdb.Pipeline()
	sent := 0
	for i, c := range calls {
		if route != nil {
			if err := route(ctx, c.keys[0]); err != nil {
				cmds[i] = redis.NewCmd(ctx)
				cmds[i].SetErr(err)
				continue
			}
		}
		cmds[i] = c.scriptOr(s).EvalSha(ctx, pipe, c.keys, c.args...)
		sent++
	}
	if sent > 0 {
		_, _ = pipe.Exec(ctx) // per-command errors are read below
	}
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

// runScript runs s once: EVALSHA, and EVAL after a script-cache miss. On
// a cluster it is a pipeline of one (execScripts), which go-redis routes
// by the key's slot alone. Its single-command path first loads the
// server's COMMAND table, once per client: from up to three random nodes,
// replicas included, bounded only by the node's read timeout (not by
// ctx), and under a mutex every such call of the client waits on. A
// client whose first such call came while any node was stopped would
// stall every call of fence (releases, acquisitions) on every master
// until that read timed out; a Redis user without COMMAND would pay up
// to three refused round trips on every call. The pipeline path needs
// neither (unless the client reads from replicas: ReadOnly, see "Server
// configuration" in the package documentation).
func (c *Client) runScript(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	if c.cluster {
		return execScripts(ctx, c.rdb, s, []scriptCall{{keys: keys, args: args}}, c.route())[0]
	}
	return s.Run(ctx, c.rdb, keys, args...)
}

// routeFunc refuses a call for key before it is sent, or returns nil.
type routeFunc func(ctx context.Context, key string) error

// route is the client's routeFunc: a cluster client's view, nil otherwise.
func (c *Client) route() routeFunc {
	if c.view == nil {
		return nil
	}
	return c.view.route
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
