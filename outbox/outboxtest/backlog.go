package outboxtest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The shape of the backlog LoadBacklog writes.
const (
	// BacklogResources is how many resources its ordered rows belong to.
	BacklogResources = 1000
	// BacklogDue is how long its live rows have been due.
	BacklogDue = 2 * time.Hour
	// BacklogDead is how long its dead rows have been dead.
	BacklogDead = time.Hour
)

// LoadBacklog writes rows rows into fencelock.outbox in one statement, as
// a backlog that no relay drains: nine in ten unordered (resource "r"),
// one in ten ordered, spread over BacklogResources resources ("res0" to
// "res999", in turn); every row due for BacklogDue, and every thousandth
// dead for BacklogDead (never an ordered one); then ANALYZE, so that
// the planner knows the table's size. The rows carry claims of many
// resources in one transaction, so the load goes past the outbox's claim
// trigger (session_replication_role = replica: db's role must be a
// superuser, as testenv's is). It fails the test on any error.
func LoadBacklog(t testing.TB, db *pgxpool.Pool, rows int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatalf("outboxtest: LoadBacklog: %v", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, q := range []string{
		`SET LOCAL session_replication_role = replica`,
		`INSERT INTO fencelock.outbox (resource, token, holder, destination, key, payload, ordered, due_at, dead_at)
SELECT CASE WHEN g % 10 = 1 THEN 'res' || (g / 10 % $2) ELSE 'r' END, 1, 'h', 'http://x', 'k' || g, '\x00', g % 10 = 1,
       now() - $3 * interval '1 microsecond', CASE WHEN g % 1000 = 0 THEN now() - $4 * interval '1 microsecond' END
  FROM generate_series(1, $1) g`,
	} {
		var args []any
		if strings.HasPrefix(q, "INSERT") {
			args = []any{rows, BacklogResources, BacklogDue.Microseconds(), BacklogDead.Microseconds()}
		}
		if _, err := tx.Exec(ctx, q, args...); err != nil {
			t.Fatalf("outboxtest: LoadBacklog: %v", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("outboxtest: LoadBacklog: %v", err)
	}
	if _, err := db.Exec(ctx, `ANALYZE fencelock.outbox`); err != nil {
		t.Fatalf("outboxtest: LoadBacklog: %v", err)
	}
	t.Logf("outboxtest: a backlog of %d rows written in %v", rows, time.Since(start).Round(time.Millisecond))
}

// Plan is the plan of one statement Postgres ran, with what it read: the
// JSON of EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON), as auto_explain logs it.
type Plan struct {
	Query string   `json:"Query Text"`
	Root  PlanNode `json:"Plan"`
}

// PlanNode is a node of a Plan, with the fields the tests read.
type PlanNode struct {
	Type     string `json:"Node Type"`
	Relation string `json:"Relation Name"`
	Index    string `json:"Index Name"`
	// Rows is the rows per loop the node returned; Loops how many times it
	// ran.
	Rows  float64 `json:"Actual Rows"`
	Loops float64 `json:"Actual Loops"`
	// Rows per loop the node read and dropped.
	Filtered  float64 `json:"Rows Removed by Filter"`
	Rechecked float64 `json:"Rows Removed by Index Recheck"`
	// Buffers: pages found in shared buffers and read in, by this node
	// and the nodes under it (for a function scan, the statements the
	// function ran).
	SharedHit  int64      `json:"Shared Hit Blocks"`
	SharedRead int64      `json:"Shared Read Blocks"`
	Plans      []PlanNode `json:"Plans"`
}

// Walk calls fn for n and every node under it.
func (n PlanNode) Walk(fn func(PlanNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.Walk(fn)
	}
}

// Scans are the nodes of p that read relation (a scan of the table or of
// one of its indexes; not the node that writes it).
func (p Plan) Scans(relation string) []PlanNode {
	var out []PlanNode
	p.Root.Walk(func(n PlanNode) {
		if n.Relation == relation && n.Type != "ModifyTable" {
			out = append(out, n)
		}
	})
	return out
}

// String is p's query and its plan, a node a line, as EXPLAIN's text
// format shows it, with the rows each node returned and dropped.
func (p Plan) String() string {
	var b strings.Builder
	b.WriteString(strings.TrimSpace(p.Query))
	b.WriteString("\n")
	var walk func(n PlanNode, depth int)
	walk = func(n PlanNode, depth int) {
		b.WriteString(strings.Repeat("  ", depth))
		b.WriteString(n.Type)
		if n.Index != "" {
			b.WriteString(" using " + n.Index)
		}
		if n.Relation != "" {
			b.WriteString(" on " + n.Relation)
		}
		fmt.Fprintf(&b, " (rows=%g loops=%g", n.Rows, n.Loops)
		if n.Filtered+n.Rechecked > 0 {
			fmt.Fprintf(&b, " removed=%g", n.Filtered+n.Rechecked)
		}
		fmt.Fprintf(&b, " buffers=%d)\n", n.SharedHit+n.SharedRead)
		for _, c := range n.Plans {
			walk(c, depth+1)
		}
	}
	walk(p.Root, 1)
	return b.String()
}

// RowsRead is how many rows the scans of relation in p read: those they
// returned and those their filters dropped, over every loop.
func (p Plan) RowsRead(relation string) int64 {
	var rows float64
	for _, n := range p.Scans(relation) {
		rows += (n.Rows + n.Filtered + n.Rechecked) * n.Loops
	}
	return int64(rows + 0.5)
}

// Plans runs fn on a connection of its own to url (a superuser's) with
// auto_explain logging every statement it runs, those inside functions
// included, with ANALYZE and BUFFERS in JSON, and returns their plans in
// the order they ended (a function's statements before the statement
// that called it).
func Plans(t testing.TB, url string, fn func(ctx context.Context, conn *pgx.Conn)) []Plan {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatalf("outboxtest: Plans: %v", err)
	}
	var mu sync.Mutex
	var logged []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, n.Message)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("outboxtest: Plans: %v", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range []string{
		`LOAD 'auto_explain'`, `SET auto_explain.log_min_duration = 0`, `SET auto_explain.log_nested_statements = on`,
		`SET auto_explain.log_analyze = on`, `SET auto_explain.log_buffers = on`, `SET auto_explain.log_timing = off`,
		`SET auto_explain.log_format = json`, `SET auto_explain.log_level = notice`, `SET client_min_messages = notice`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("outboxtest: Plans: %s: %v", q, err)
		}
	}
	fn(ctx, conn)
	if _, err := conn.Exec(ctx, `SET auto_explain.log_min_duration = -1`); err != nil {
		t.Fatalf("outboxtest: Plans: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	var plans []Plan
	for _, m := range logged {
		_, js, ok := strings.Cut(m, "plan:\n")
		if !ok {
			continue
		}
		var p Plan
		if err := json.Unmarshal([]byte(js), &p); err != nil {
			t.Fatalf("outboxtest: Plans: a plan auto_explain logged: %v\n%s", err, m)
		}
		plans = append(plans, p)
	}
	return plans
}

// CheckBounded fails the test unless plans read relation through indexes
// only: no scan of it is sequential, each uses one of indexes, each of
// indexes is used, and they read at most maxRows of its rows in all. It
// returns the rows read.
func CheckBounded(t testing.TB, plans []Plan, relation string, maxRows int64, indexes ...string) int64 {
	t.Helper()
	if len(plans) == 0 {
		t.Errorf("outboxtest: no plan was logged")
		return 0
	}
	var read int64
	used := map[string]bool{}
	for _, p := range plans {
		for _, n := range p.Scans(relation) {
			switch {
			case n.Type == "Seq Scan":
				t.Errorf("a sequential scan of %s in\n%s", relation, p)
			case !slices.Contains(indexes, n.Index):
				t.Errorf("%s of %s through %q, not one of %q, in\n%s", n.Type, relation, n.Index, indexes, p)
			}
			used[n.Index] = true
		}
		read += p.RowsRead(relation)
	}
	for _, ix := range indexes {
		if !used[ix] {
			t.Errorf("no scan through %s", ix)
		}
	}
	if read > maxRows {
		t.Errorf("%d rows of %s read, more than %d", read, relation, maxRows)
	}
	return read
}
