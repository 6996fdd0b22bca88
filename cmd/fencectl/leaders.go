package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/fencelock/fencelock/fence"
)

func init() { register((*app).leadersCmd) }

func (a *app) leadersCmd() *cobra.Command {
	list := &cobra.Command{
		Use:   "list [PATTERN]",
		Short: "List the elections: leader, term (its token), value, lease left, candidates",
		Long: `List the elections (fence.Client.Election) whose names match PATTERN (a glob
over names, default *), with their leader, the term's token, the leader's
value, what is left of the term's lease and how many candidates wait. A
vacant election shows its last term and how it ended: resigned, or expired
(its leader died, paused or was cut off from Redis). An election is known
for 30 days after its last change. Read with SCAN on every master of a
cluster, without changing anything; run it as a user that may SCAN.

An election is the lock of its name: locks list shows a leader's term as a
held lock too, and locks release --force ends it as a resignation would.`,
		Example: "  fencectl leaders list --redis 127.0.0.1:6379\n  fencectl leaders list 'scheduler:*' -o json",
		Args:    usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			pattern := "*"
			if len(args) == 1 {
				pattern = args[0]
			}
			if pattern == "" || strings.ContainsAny(pattern, "{}") {
				return usageErrorf("PATTERN %q: give a glob over election names (such as scheduler:*), without { or }", pattern)
			}
			if err := a.checkOutput(); err != nil {
				return err
			}
			rc, locks, err := a.openLocks(cmd.Context())
			if err != nil {
				return err
			}
			defer closeLocks(rc, locks)
			leaders, err := listLeaders(cmd.Context(), rc, locks, pattern)
			if err != nil {
				return rc.explain(err)
			}
			return a.printLeaders(leaders, rc.cluster, pattern)
		},
	}
	a.redisFlag(list)
	a.outputFlag(list)
	return group("leaders", "List elections: their leaders and values", list)
}

// leaderJSON is one election of leaders list.
type leaderJSON struct {
	Name string `json:"name"`
	// Leading is true while a term holds the election; Holder, Token and
	// Value are then the leader's, else the last term's.
	Leading bool   `json:"leading"`
	Holder  string `json:"holder,omitempty"`
	Token   int64  `json:"token,omitempty"`
	Value   string `json:"value"`
	// Ended says how the last term ended when not leading: resigned,
	// expired or unknown.
	Ended string `json:"ended,omitempty"`
	// TTLMs is what is left of the term's lease in ms (-1: no expiry).
	TTLMs      int64  `json:"ttl_ms,omitempty"`
	Candidates int64  `json:"candidates"`
	Node       string `json:"node,omitempty"`
}

// listLeaders finds the elections by their record of terms
// (<prefix>{<name>}:v) and inspects each through fence, which reads the
// lock and the record and says what they mean.
func listLeaders(ctx context.Context, rc *redisConn, locks *fence.Client, pattern string) ([]leaderJSON, error) {
	names, err := scanNames(ctx, rc, pattern, ":v")
	if err != nil {
		return nil, err
	}
	out := []leaderJSON{}
	for _, n := range names {
		info, err := locks.Inspect(ctx, n.name)
		if err != nil {
			return nil, err
		}
		if !info.Election {
			continue // its record expired since SCAN saw it
		}
		j := leaderJSON{Name: n.name, Leading: !info.Term.Vacant, Holder: info.Term.Holder, Token: info.Term.Token,
			Value: info.Term.Value, Candidates: max(info.Waiters, 0), Node: n.node}
		if info.Term.Vacant {
			j.Ended = info.Term.Ended.String()
		} else {
			j.TTLMs = -1
			if info.TTL >= 0 {
				j.TTLMs = info.TTL.Milliseconds()
			}
		}
		out = append(out, j)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// scannedName is a name found by scanNames, with its node on a cluster.
type scannedName struct{ name, node string }

// scanNames scans every master for the keys <prefix>{<name>}<suffix> of
// the names matching pattern.
func scanNames(ctx context.Context, rc *redisConn, pattern, suffix string) ([]scannedName, error) {
	nodes, err := masters(ctx, rc)
	if err != nil {
		return nil, err
	}
	match := globEscape(rc.prefix) + "{" + pattern + "}" + globEscape(suffix)
	var out []scannedName
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
			for _, k := range keys {
				name := strings.TrimSuffix(strings.TrimPrefix(k, rc.prefix+"{"), "}"+suffix)
				out = append(out, scannedName{name: name, node: node})
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return out, nil
}

func (a *app) printLeaders(leaders []leaderJSON, cluster bool, pattern string) error {
	if a.json() {
		return a.printJSON(leaders)
	}
	if len(leaders) == 0 {
		if pattern == "*" {
			fmt.Fprintln(a.stdout, "no election is known")
		} else {
			fmt.Fprintf(a.stdout, "no election matching %q is known\n", pattern)
		}
		return nil
	}
	header := []string{"NAME", "STATE", "HOLDER", "TOKEN", "VALUE", "LEASE LEFT", "CANDIDATES"}
	if cluster {
		header = append(header, "NODE")
	}
	var rows [][]string
	for _, l := range leaders {
		state, left := "leading", "no expiry"
		if l.TTLMs >= 0 {
			left = (time.Duration(l.TTLMs) * time.Millisecond).String()
		}
		holder, token := l.Holder, strconv.FormatInt(l.Token, 10)
		if !l.Leading {
			state, left = "vacant, last term "+l.Ended, "-"
			if l.Token == 0 {
				state, holder, token = "vacant", "-", "-"
			}
		}
		r := []string{l.Name, state, holder, token, shortValue(l.Value), left, strconv.FormatInt(l.Candidates, 10)}
		if cluster {
			r = append(r, l.Node)
		}
		rows = append(rows, r)
	}
	return a.table(header, rows)
}

// shortValue is a leader's value fit for a table cell: quoted when it is
// not printable on one line, cut to 60 characters (-o json has it whole).
func shortValue(v string) string {
	if v == "" {
		return "-"
	}
	printable := utf8.ValidString(v) && !strings.ContainsFunc(v, func(r rune) bool { return r < ' ' || r == 0x7f })
	if !printable || strings.ContainsAny(v, " \t") {
		v = strconv.Quote(v)
	}
	if utf8.RuneCountInString(v) > 60 {
		v = string([]rune(v)[:57]) + "..."
	}
	return v
}
