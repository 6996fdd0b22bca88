package main

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/outbox/outboxtest"
	"github.com/fencelock/fencelock/testenv"
)

// addEffects records effects the way a writer in raw SQL does (claim, then
// outbox_add) and returns how many it recorded.
func addEffects(t *testing.T, db *testenv.DB, resource string, token int64, effects string) int {
	t.Helper()
	ctx := ctxT(t)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, `SELECT fencelock.claim($1, $2, 'w1')`, resource, token)
	require.NoError(t, err)
	var n int
	require.NoError(t, tx.QueryRow(ctx, `SELECT fencelock.outbox_add($1::jsonb)`, effects).Scan(&n))
	require.NoError(t, tx.Commit(ctx))
	return n
}

func sqlExec(t *testing.T, db *testenv.DB, sql string, args ...any) {
	t.Helper()
	_, err := db.Pool.Exec(ctxT(t), sql, args...)
	require.NoError(t, err, sql)
}

// An outbox that no relay drains: effects due for hours (one the head of
// an ordered resource, with a row behind it), dead rows, claims that
// outlived their visibility timeout, and rows that none of the checks
// counts as stuck (one backing off, one waiting behind its head, a head
// due for less than --outbox-stuck). Each is one warning whose fix names the --db given,
// masked; the fixes work: requeue clears the dead rows, a relay the rest.
func TestDoctorOutbox(t *testing.T) {
	t.Parallel()
	db := migratedDB(t)
	n := addEffects(t, db, "stock:eu", 7, `[
		{"d": "https://shop.example/stock", "k": "stuck-1"}, {"d": "https://shop.example/stock", "k": "stuck-2"},
		{"d": "https://shop.example/stock", "k": "stuck-3"},
		{"d": "https://shop.example/stock", "k": "ordered-1", "o": true}, {"d": "https://shop.example/stock", "k": "ordered-2", "o": true},
		{"d": "https://shop.example/stock", "k": "claimed-1"}, {"d": "https://shop.example/stock", "k": "claimed-2"},
		{"d": "https://shop.example/stock", "k": "dead-1"}, {"d": "https://shop.example/stock", "k": "dead-2"},
		{"d": "https://shop.example/stock", "k": "waiting"}]`)
	require.Equal(t, 10, n)
	// Ordered rows wait for their head: us-2 for us-1, which backs off.
	addEffects(t, db, "stock:us", 8, `[{"d": "https://shop.example/stock", "k": "us-1", "o": true}, {"d": "https://shop.example/stock", "k": "us-2", "o": true}]`)
	sqlExec(t, db, `UPDATE fencelock.outbox SET attempts = 3, due_at = now() + interval '1 hour' WHERE key = 'us-1'`)
	sqlExec(t, db, `UPDATE fencelock.outbox SET due_at = now() - interval '2 hours' WHERE key = 'us-2'`)
	// A head due for 2 minutes: stuck at the default 1m, not at 10m.
	addEffects(t, db, "stock:ap", 9, `[{"d": "https://shop.example/stock", "k": "ap-1", "o": true}]`)
	sqlExec(t, db, `UPDATE fencelock.outbox SET due_at = now() - interval '2 minutes' WHERE key = 'ap-1'`)
	sqlExec(t, db, `UPDATE fencelock.outbox SET due_at = now() - interval '2 hours', created_at = now() - interval '2 hours' WHERE key LIKE 'stuck-%' OR key LIKE 'ordered-%'`)
	sqlExec(t, db, `UPDATE fencelock.outbox SET claim = 42, attempts = 1, due_at = now() - interval '5 minutes' WHERE key LIKE 'claimed-%'`)
	sqlExec(t, db, `UPDATE fencelock.outbox SET dead_at = now() - interval '3 hours', attempts = 20, last_error = 'POST https://shop.example/stock: 422 Unprocessable Entity' WHERE key LIKE 'dead-%'`)
	sqlExec(t, db, `UPDATE fencelock.outbox SET attempts = 3, due_at = now() + interval '1 hour', last_error = 'POST https://shop.example/stock: 503' WHERE key = 'waiting'`)
	dbURL := withPassword(t, db.URL, "postgres", pgSecret)

	code, out, errOut := fencectlProc(t, nil, "doctor", "--db", dbURL, "--outbox-stuck", "10m")
	requireNoSecret(t, pgSecret, out, errOut)
	assert.Equal(t, exitOK, code, out+errOut)
	assert.Empty(t, errOut)
	assert.Subset(t, verdicts(out)["warn"], []string{"outbox.backlog", "outbox.dead", "outbox.claims"}, out)
	assert.Contains(t, out, "4 effects due for more than 10m0s (the oldest for 2h0m0s; 1 of them the next of an ordered resource): no relay claims them")
	assert.Contains(t, out, "2 dead rows (refused for good, out of attempts, or recorded by a transaction whose fence check did not run, the oldest dead for 3h0m0s)")
	assert.Contains(t, out, "2 rows whose relay's claim expired without an outcome (the oldest 5m0s ago)")
	masked := shellQuote(redactAddr(dbURL))
	assert.Contains(t, out, "fix: fencectl outbox list --dead --db "+masked+" shows why each failed; once that is fixed: fencectl outbox requeue --all --db "+masked)
	assert.Contains(t, out, "(with the password in place of xxxxx)")
	golden(t, "outbox", normalize(out, doctorLiterals(nil, db)))

	// The claims' rows are due for 5 minutes: stuck at the default 1m.
	code, out, _ = fencectlProc(t, nil, "doctor", "--db", dbURL)
	assert.Equal(t, exitOK, code)
	assert.Contains(t, out, "7 effects due for more than 1m0s (the oldest for 2h0m0s; 2 of them the next of an ordered resource)")

	// The fixes, pasted with the password back: requeue, then a relay.
	code, out, errOut = fencectl(t, "outbox", "requeue", "--all", "--db", dbURL)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "requeued 2 dead rows")
	var delivered sync.Map
	relay, err := outbox.NewRelay(db.Pool, outbox.SenderFunc(func(_ context.Context, d outbox.Delivery) error {
		delivered.Store(d.Key, true)
		return nil
	}), outbox.WithPollInterval(20*time.Millisecond), outbox.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	require.Eventually(t, func() bool {
		var n int
		err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM fencelock.outbox WHERE due_at <= now() AND key <> 'us-2'`).Scan(&n)
		return err == nil && n == 0
	}, time.Minute, 20*time.Millisecond, "the relay delivers every due row but the one behind its head")
	cancel()
	require.NoError(t, <-done)
	_, ok := delivered.Load("claimed-1")
	assert.True(t, ok, "a row whose claim expired is sent again")

	code, out, _ = fencectlProc(t, nil, "doctor", "--db", dbURL)
	assert.Equal(t, exitOK, code)
	for _, check := range []string{"outbox.backlog", "outbox.dead", "outbox.claims"} {
		assert.Contains(t, verdicts(out)["ok"], check, out)
	}
	assert.Contains(t, out, "no effect due for more than 1m0s\n")

	code, _, errOut = fencectl(t, "doctor", "--db", dbURL, "--outbox-stuck", "0s")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "--outbox-stuck 0s: want a positive duration")
}

// A role that may not read fencelock.outbox (the migrations grant SELECT
// on it to no one: payloads may be private) gets, instead of counts, the
// GRANT: an application role's check is left to an operator (skip), a role
// without the schema's USAGE is warned; pasted as printed (as the owner, in
// the database named), the checks run.
func TestDoctorOutboxNeedsSelect(t *testing.T) {
	t.Parallel()
	db := migratedDB(t)
	addEffects(t, db, "stock:eu", 7, `[{"d": "https://shop.example/stock", "k": "a"}]`)
	for _, tc := range []struct {
		name   string
		setup  []string
		line   string
		grants string
	}{
		{"the application's grants", []string{"GRANT USAGE ON SCHEMA fencelock TO %[1]s", "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO %[1]s"},
			`(?m)^skip\s+outbox\s+not checked as role (\S+), which may not read fencelock.outbox \(an operator's grant; the application needs none\)\n\s+an operator: run fencectl doctor as the fencelock schema's owner \(role postgres\), or grant what it reads: as that owner, connected`,
			"GRANT SELECT ON fencelock.outbox TO %[1]s"},
		{"no grant", nil, `(?m)^warn\s+outbox\s+not checked: user (\S+) may not read fencelock.outbox\n\s+fix: run fencectl doctor as the fencelock schema's owner \(role postgres\), or grant what it reads: as that owner, connected`,
			"GRANT USAGE ON SCHEMA fencelock TO %[1]s; GRANT SELECT ON fencelock.outbox TO %[1]s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			role, u := plainRole(t, db, fmt.Sprintf("ob%d", len(tc.setup)))
			for _, g := range tc.setup {
				sqlExec(t, db, fmt.Sprintf(g, role))
			}
			_, out, errOut := fencectlProc(t, nil, "doctor", "--db", u)
			requireNoSecret(t, pgSecret, out, errOut)
			m := regexp.MustCompile(tc.line).FindStringSubmatch(out)
			require.NotNil(t, m, out)
			assert.Equal(t, role, m[1])
			i := strings.Index(out, m[0])
			fix := fixIn(t, out[i:])
			assert.Equal(t, fmt.Sprintf(tc.grants, role), strings.Join(fix.stmts, "; "))
			assert.Equal(t, db.Name, fix.db)
			assert.NotContains(t, out, "outbox.backlog")
			paste(t, db, fix, nil)
			_, out, _ = fencectlProc(t, nil, "doctor", "--db", u)
			assert.NotContains(t, verdicts(out)["warn"], "outbox", out)
			assert.NotContains(t, verdicts(out)["skip"], "outbox", out)
			assert.Contains(t, verdicts(out)["ok"], "outbox.backlog", out)
		})
	}
}

// A backlog of a million rows no relay drains (outboxtest.LoadBacklog:
// every thousandth dead, one in ten ordered over 1,000 resources, never a
// dead one): doctor's queries walk indexes under their limits, never the
// table (the plans Postgres ran, with the rows they read), and the report
// says what it read: what a limit cut short as "at least", the dead rows
// exactly. outbox list's counts and its dead rows read as few rows.
func TestDoctorOutboxMillion(t *testing.T) {
	t.Parallel()
	db := migratedDB(t)
	loaded := time.Now() // the rows' ages are counted from the load's transaction, begun after this
	outboxtest.LoadBacklog(t, db.Pool, 1_000_000)

	var s outboxScan
	start := time.Now()
	plans := outboxtest.Plans(t, db.URL, func(ctx context.Context, conn *pgx.Conn) {
		var err error
		s, err = scanOutbox(ctx, conn, time.Minute)
		require.NoError(t, err)
	})
	t.Logf("doctor's outbox queries ran in %v", time.Since(start).Round(time.Millisecond))
	for _, p := range plans {
		t.Logf("%s", p)
	}
	// The due rows, a loose scan of the ordered resources with a probe for
	// each one's head, the dead rows.
	read := outboxtest.CheckBounded(t, plans, "outbox", outboxDueRead+3*outboxHeadsRead+outboxDeadRead,
		"outbox_due_idx", "outbox_ordered_idx", "outbox_dead_idx")
	t.Logf("doctor's outbox queries read %d rows of the outbox", read)
	assert.EqualValues(t, outboxDueRead, s.dueRead)
	assert.EqualValues(t, outboxHeadsRead, s.headsRead)
	assert.EqualValues(t, outboxHeadsRead, s.headsStuck)
	assert.EqualValues(t, 1000, s.dead, "every thousandth row")

	start = time.Now()
	code, out, errOut := fencectlProc(t, nil, "doctor", "--db", db.URL)
	t.Logf("doctor took %v", time.Since(start).Round(time.Millisecond))
	assert.Equal(t, exitOK, code, out+errOut)
	// The ages grew while the rows were loaded and read (a minute or more
	// on a loaded machine); doctor rounds them to the minute.
	since := time.Since(loaded)
	assertAge(t, out, `warn\s+outbox.backlog\s+at least 11000 effects due for more than 1m0s \(the oldest for (\S+); 1000 of them the next of an ordered resource\)`,
		outboxtest.BacklogDue, since)
	assertAge(t, out, `warn\s+outbox.dead\s+1000 dead rows \(refused for good, out of attempts, or recorded by a transaction whose fence check did not run, the oldest dead for (\S+)\)`,
		outboxtest.BacklogDead, since)
	assert.Regexp(t, `ok\s+outbox.claims\s+no claim past its visibility timeout among the 10000 oldest due rows`, out)

	code, out, errOut = fencectl(t, "outbox", "list", "--dead", "--db", db.URL)
	require.Equal(t, exitOK, code, errOut)
	assert.Equal(t, "at least 10000 due, at least 0 waiting, at least 0 claimed, 1000 dead (each state counted up to 10000 rows)", strings.SplitN(out, "\n", 2)[0])
	assert.Equal(t, 1+1+100, strings.Count(out, "\n"), "the counts, the table's header, 100 dead rows:\n%s", out)
}

// assertAge checks that out matches pattern, whose one group is an age
// doctor printed, rounded to the minute: at least want, at most want plus
// grown, the time that passed since the rows got their ages.
func assertAge(t *testing.T, out, pattern string, want, grown time.Duration) {
	t.Helper()
	m := regexp.MustCompile(pattern).FindStringSubmatch(out)
	if !assert.NotNil(t, m, "no line matches %s in:\n%s", pattern, out) {
		return
	}
	got, err := time.ParseDuration(m[1])
	require.NoError(t, err, "the age in %q", m[0])
	assert.GreaterOrEqual(t, got, want.Round(time.Minute), m[0])
	assert.LessOrEqual(t, got, (want + grown).Round(time.Minute), "%s (%v passed since the rows were written)", m[0], grown)
}
