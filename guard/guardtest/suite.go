package guardtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
)

// errLost is the cause a losable lease reports.
var errLost = errors.New("guardtest: lease lost (test)")

// Timeout bounds each check's database calls: generous, so a loaded
// machine does not fail the suite, but a deadlock does.
const Timeout = 2 * time.Minute

// Run runs the whole contract against the store h describes, one subtest
// per check. Every check must pass for a store to keep guard's promise.
func Run[Tx any](t *testing.T, h Harness[Tx]) {
	t.Helper()
	if h.Open == nil || h.Run == nil {
		t.Fatal("guardtest: Harness needs Open and Run")
	}
	if missing := h.Facts.missing(); len(missing) > 0 {
		t.Fatalf("guardtest: Harness.Facts needs %s: how the suite reads the store's records", strings.Join(missing, ", "))
	}
	s := &suite[Tx]{h: h}
	s.db = h.Open(t)
	for _, c := range []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"CommitsAndRecordsToken", s.commits},
		{"StaleTokenRejected", s.staleRejected},
		{"OvertakenMidTransaction", s.overtaken},
		{"NewerBeginRefusesOlder", s.newerBeginRefusesOlder},
		{"EqualTokenOtherHolder", s.equalToken},
		{"KeyDedupe", s.keyDedupe},
		{"KeyDedupeConcurrent", s.keyDedupeConcurrent},
		{"Advance", s.advance},
		{"ResumableRun", s.resumableRun},
		{"RollbackOnError", s.rollbackOnError},
		{"RollbackOnPanic", s.rollbackOnPanic},
		{"RollbackOnCancel", s.rollbackOnCancel},
		{"RollbackOnLeaseLoss", s.rollbackOnLeaseLoss},
		{"CommitOrder12Writers", s.commitOrder},
		{"MisuseCommitThroughTx", s.misuseTxCommit},
		{"MisuseRawCommit", s.misuseRawCommit},
		{"MisuseCommitWhenOvertaken", s.misuseCommitOvertaken},
		{"ReadOnlyDatabase", s.readOnly},
		{"BadInput", s.badInput},
		{"SameRefusalSameError", s.sameErrors},
		{"CommitQueue", s.commitQueue},
	} {
		t.Run(c.name, c.fn)
	}
}

type suite[Tx any] struct {
	h  Harness[Tx]
	db Database[Tx]
	n  atomic.Int64
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	t.Cleanup(cancel)
	return ctx
}

// fresh returns a resource name and a table of (sku, writer) rows that no
// other check uses.
func (s *suite[Tx]) fresh(t *testing.T) (resource, table string) {
	t.Helper()
	n := s.n.Add(1)
	table = fmt.Sprintf("guardtest_rows_%d", n)
	s.exec(t, "CREATE TABLE "+table+" (sku text NOT NULL, writer text NOT NULL)")
	return fmt.Sprintf("guardtest:%d", n), table
}

func (s *suite[Tx]) exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if err := s.db.Exec(ctxFor(t), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func (s *suite[Tx]) count(t testing.TB, sql string, args ...any) int64 {
	t.Helper()
	n, err := s.db.QueryInt(ctxFor(t), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// rows is how many rows writer has committed to table.
func (s *suite[Tx]) rows(t testing.TB, table, writer string) int64 {
	t.Helper()
	return s.count(t, "SELECT count(*) FROM "+table+" WHERE writer = $1", writer)
}

// stored is the token the database holds for resource (0 if none).
func (s *suite[Tx]) stored(t testing.TB, resource string) int64 {
	t.Helper()
	tok, err := s.h.Facts.Token(ctxFor(t), s.db, resource)
	if err != nil {
		t.Fatalf("Facts.Token(%q): %v", resource, err)
	}
	return tok
}

// keyRecorded reports whether key is recorded for resource.
func (s *suite[Tx]) keyRecorded(t testing.TB, resource, key string) bool {
	t.Helper()
	ok, err := s.h.Facts.KeyApplied(ctxFor(t), s.db, resource, key)
	if err != nil {
		t.Fatalf("Facts.KeyApplied(%q, %q): %v", resource, key, err)
	}
	return ok
}

// insert returns an fn that writes n rows as writer to table, and counts
// its runs in ran.
func (s *suite[Tx]) insert(table, writer string, n int, ran *atomic.Int64) func(ctx context.Context, tx Tx) error {
	return func(ctx context.Context, tx Tx) error {
		if ran != nil {
			ran.Add(1)
		}
		for i := range n {
			if err := s.db.TxExec(ctx, tx, "INSERT INTO "+table+" (sku, writer) VALUES ($1, $2)", fmt.Sprintf("sku-%d", i), writer); err != nil {
				return err
			}
		}
		return nil
	}
}

// oneLine fails t if err's message spans lines: logs are read a line at a
// time.
func oneLine(t testing.TB, err error) {
	t.Helper()
	if err != nil && strings.ContainsAny(err.Error(), "\r\n") {
		t.Errorf("error message spans lines: %q", err.Error())
	}
}

// wantStale checks that err is a refusal of l naming current.
func wantStale(t testing.TB, err error, l Lease, current int64) {
	t.Helper()
	var se *guard.StaleTokenError
	if !errors.As(err, &se) {
		t.Fatalf("want a *guard.StaleTokenError for %+v, got %v", l, err)
	}
	if !errors.Is(err, guard.ErrStaleToken) {
		t.Errorf("errors.Is(err, guard.ErrStaleToken) is false for %v", err)
	}
	if se.Resource != l.Resource || se.Token != l.Tok || se.Current != current {
		t.Errorf("refusal = %+v, want resource %q, token %d, current %d", *se, l.Resource, l.Tok, current)
	}
	oneLine(t, err)
}
