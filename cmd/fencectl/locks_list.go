package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
)

func (a *app) locksListCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "list [PATTERN]",
		Short: "List the locks that are held: name, holder, token, remaining lease",
		Long: `List the locks that are held now, with their holder, token and remaining
lease, read with SCAN (never KEYS) on every master of a cluster, without
changing anything. PATTERN is a glob over lock names (default *), as in
Redis's MATCH: stock-sync:* lists stock-sync:eu and stock-sync:us.

SCAN is an operator's command: the application's Redis user does not need
it, and ACL key patterns do not limit what it shows. Run list as a user
that may SCAN (ACL SETUSER <user> +scan).`,
		Example: "  fencectl locks list --redis 127.0.0.1:6379\n  fencectl locks list 'stock-sync:*' -o json",
		Args:    usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			pattern := "*"
			if len(args) == 1 {
				pattern = args[0]
			}
			if pattern == "" || strings.ContainsAny(pattern, "{}") {
				return usageErrorf("PATTERN %q: give a glob over lock names (such as stock-sync:*), without { or }", pattern)
			}
			if err := a.checkOutput(); err != nil {
				return err
			}
			rc, err := openRedis(cmd.Context(), a.redisSrc(), a.sentinelMaster, a.prefix, a.timeout)
			if err != nil {
				return err
			}
			defer rc.Close()
			held, err := heldLocks(cmd.Context(), rc, pattern)
			if err != nil {
				return rc.explain(err)
			}
			return a.printHeld(held, rc.cluster, pattern)
		},
	}
	a.redisFlag(c)
	a.outputFlag(c)
	return c
}

// heldLockJSON is one held lock of locks list.
type heldLockJSON struct {
	Name   string `json:"name"`
	Holder string `json:"holder"`
	Token  int64  `json:"token"`
	// TTLMs is the remaining lease in ms; -1 when the key has no expiry.
	TTLMs int64 `json:"ttl_ms"`
	// Node is the master that holds it, on a cluster.
	Node string `json:"node,omitempty"`
}

// scanCount is SCAN's COUNT hint: keys looked at per call, per node.
const scanCount = 1000

// heldLocks scans every master for the lock keys of names matching
// pattern and reads each one's value and PTTL, one pipeline per SCAN
// batch. A key that expires between SCAN and GET is left out; so is a key
// under the prefix that does not hold a fence lock value.
func heldLocks(ctx context.Context, rc *redisConn, pattern string) ([]heldLockJSON, error) {
	nodes, err := masters(ctx, rc)
	if err != nil {
		return nil, err
	}
	match := globEscape(rc.prefix) + "{" + pattern + "}"
	out := []heldLockJSON{}
	for _, n := range nodes {
		node := ""
		if rc.cluster {
			node = rc.nodeAddr(n)
		}
		var cursor uint64
		for {
			keys, next, err := n.Scan(ctx, cursor, match, scanCount).Result()
			if err != nil {
				return nil, nodeErr(node, err)
			}
			got, err := readHeld(ctx, n, rc.prefix, keys)
			if err != nil {
				return nil, nodeErr(node, err)
			}
			for i := range got {
				got[i].Node = node
			}
			out = append(out, got...)
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func nodeErr(node string, err error) error {
	if node == "" {
		return err
	}
	return fmt.Errorf("node %s: %w", node, err)
}

// readHeld reads the lock keys in one pipeline: GET (the value is
// "<token>:<holder>", see fence's acquire script) and PTTL.
func readHeld(ctx context.Context, n *redis.Client, prefix string, keys []string) ([]heldLockJSON, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	pipe := n.Pipeline()
	gets := make([]*redis.StringCmd, len(keys))
	ttls := make([]*redis.DurationCmd, len(keys))
	for i, k := range keys {
		gets[i] = pipe.Get(ctx, k)
		ttls[i] = pipe.PTTL(ctx, k)
	}
	_, _ = pipe.Exec(ctx) // per-command errors are read below
	var out []heldLockJSON
	for i, k := range keys {
		v, err := gets[i].Result()
		switch {
		case errors.Is(err, redis.Nil):
			continue // released or expired since SCAN saw it
		case err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE"):
			continue // not a fence lock
		case err != nil:
			return nil, err
		}
		t, holder, ok := strings.Cut(v, ":")
		token, terr := strconv.ParseInt(t, 10, 64)
		if !ok || terr != nil {
			continue // not a fence lock value
		}
		ttl, err := ttls[i].Result()
		if err != nil {
			return nil, err
		}
		if ttl == -2 { // gone between GET and PTTL
			continue
		}
		ms := int64(-1)
		if ttl >= 0 {
			ms = ttl.Milliseconds()
		}
		name := strings.TrimSuffix(strings.TrimPrefix(k, prefix+"{"), "}")
		out = append(out, heldLockJSON{Name: name, Holder: holder, Token: token, TTLMs: ms})
	}
	return out, nil
}

// globEscape quotes the glob characters of s for SCAN's MATCH, so that a
// prefix such as "jobs[eu]:" matches only itself.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (a *app) printHeld(held []heldLockJSON, cluster bool, pattern string) error {
	if a.json() {
		return a.printJSON(held)
	}
	header := []string{"NAME", "HOLDER", "TOKEN", "LEASE LEFT"}
	if cluster {
		header = append(header, "NODE")
	}
	var rows [][]string
	for _, h := range held {
		left := "no expiry"
		if h.TTLMs >= 0 {
			left = (time.Duration(h.TTLMs) * time.Millisecond).String()
		}
		r := []string{h.Name, h.Holder, strconv.FormatInt(h.Token, 10), left}
		if cluster {
			r = append(r, h.Node)
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		if pattern == "*" {
			fmt.Fprintln(a.stdout, "no lock is held")
		} else {
			fmt.Fprintf(a.stdout, "no lock matching %q is held\n", pattern)
		}
		return nil
	}
	return a.table(header, rows)
}
