package prequeue

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed acquire.lua
	acquireLua string
	//go:embed release.lua
	releaseLua string
	//go:embed renew.lua
	renewLua string
	//go:embed raise.lua
	raiseLua string

	// Wrapped once; Run sends EVALSHA and falls back to EVAL.
	acquireScript = redis.NewScript(acquireLua)
	releaseScript = redis.NewScript(releaseLua)
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

// acquireReply is the decoded answer of acquire.lua.
type acquireReply struct {
	acquired   bool
	reacquired bool   // held by the same holder id already: same token, lease restarted
	token      int64  // when acquired
	value      string // when acquired: the lock's value '<token>:<holder>'
	pttl       int64  // ms, when not acquired (-1: no expiry, -2: gone meanwhile)
}

func parseAcquire(v any) (acquireReply, error) {
	arr, ok := v.([]any)
	if !ok || len(arr) != 2 {
		return acquireReply{}, fmt.Errorf("fence: unexpected acquire reply %#v", v)
	}
	flag, ok := arr[0].(int64)
	if !ok {
		return acquireReply{}, fmt.Errorf("fence: unexpected acquire reply %#v", v)
	}
	if flag == 1 || flag == 2 {
		v, ok := arr[1].(string)
		if !ok {
			return acquireReply{}, fmt.Errorf("fence: unexpected acquire reply %#v", arr[1])
		}
		s, _, _ := strings.Cut(v, ":")
		tok, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return acquireReply{}, fmt.Errorf("fence: unexpected acquire token %q: %w", s, err)
		}
		return acquireReply{acquired: true, reacquired: flag == 2, token: tok, value: v}, nil
	}
	pttl, ok := arr[1].(int64)
	if !ok {
		return acquireReply{}, fmt.Errorf("fence: unexpected acquire pttl %#v", arr[1])
	}
	return acquireReply{pttl: pttl}, nil
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

// execScripts sends one EVALSHA per argument set in one pipeline (the
// cluster client splits it per node: one round trip per node). When a
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
		cmds[i] = s.EvalSha(ctx, pipe, c.keys, c.args...)
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
	loaded := map[any]bool{} // nodes that get an EVAL in this pipeline
	pipe = rdb.Pipeline()
	for _, i := range retry {
		c := calls[i]
		var node any = rdb // without a cluster, one node
		if cc != nil {
			if n, err := cc.MasterForKey(ctx, c.keys[0]); err == nil {
				node = n
			} else {
				node = nil // unknown: EVAL this one
			}
		}
		if node == nil || !loaded[node] {
			loaded[node] = node != nil
			cmds[i] = s.Eval(ctx, pipe, c.keys, c.args...)
		} else {
			cmds[i] = s.EvalSha(ctx, pipe, c.keys, c.args...)
		}
	}
	_, _ = pipe.Exec(ctx)
	return cmds
}

type scriptCall struct {
	keys []string
	args []any
}
