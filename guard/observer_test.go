package guard_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder keeps the events it is told, tagged with its name.
type recorder struct {
	name string
	mu   sync.Mutex
	all  *[]string
	evs  []guard.ExecEvent
	// cancellable counts events whose ctx could be cancelled (it must
	// carry values only).
	cancellable int
}

func (r *recorder) OnExec(ctx context.Context, e guard.ExecEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, e)
	if ctx.Done() != nil {
		r.cancellable++
	}
	if r.all != nil {
		*r.all = append(*r.all, r.name)
	}
}

func (r *recorder) last(t *testing.T) guard.ExecEvent {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	require.NotEmpty(t, r.evs, "no event")
	return r.evs[len(r.evs)-1]
}

func observedStore(t *testing.T, db pgfence.DB, o guard.Observer) *pgfence.Store {
	t.Helper()
	s, err := pgfence.New(db, pgstore.WithObserver(o))
	require.NoError(t, err)
	return s
}

// Every way an Exec ends is one event with its outcome and reason, from
// real refusals by the database.
func TestObserverOutcomes(t *testing.T) {
	pool, _, ctx := setup(t)
	rec := &recorder{}
	s := observedStore(t, pool, rec)
	check := func(t *testing.T, res string, token int64, key string, outcome guard.Outcome, reason guard.Reason, err error) {
		t.Helper()
		e := rec.last(t)
		assert.Equal(t, res, e.Resource)
		assert.Equal(t, token, e.Token)
		assert.Equal(t, "h", e.Holder)
		assert.Equal(t, key, e.Key)
		assert.Equal(t, outcome, e.Outcome, "outcome %v", e.Outcome)
		assert.Equal(t, reason, e.Reason)
		assert.Positive(t, e.Duration)
		assert.Equal(t, err, e.Err, "the event carries Exec's error")
	}

	t.Run("committed", func(t *testing.T) {
		_, err := guard.Exec(ctx, s, newLease("r", 5), insert, guard.WithKey("k1"))
		require.NoError(t, err)
		check(t, "r", 5, "k1", guard.Committed, "", nil)
	})
	t.Run("already applied", func(t *testing.T) {
		_, err := guard.Exec(ctx, s, newLease("r", 5), insert, guard.WithKey("k1"))
		require.ErrorIs(t, err, guard.ErrAlreadyApplied)
		check(t, "r", 5, "k1", guard.Rejected, guard.ReasonAlreadyApplied, err)
	})
	t.Run("stale token", func(t *testing.T) {
		_, err := guard.Exec(ctx, s, newLease("r", 4), insert)
		require.ErrorIs(t, err, guard.ErrStaleToken)
		check(t, "r", 4, "", guard.Rejected, guard.ReasonStaleToken, err)
	})
	t.Run("stale at commit", func(t *testing.T) {
		// A newer holder advances while fn runs: the claim at commit
		// refuses.
		_, err := guard.Exec(ctx, s, newLease("c", 1), func(ctx context.Context, tx pgx.Tx) error {
			if err := insert(ctx, tx); err != nil {
				return err
			}
			return s.Advance(ctx, newLease("c", 2))
		})
		require.ErrorIs(t, err, guard.ErrStaleToken)
		check(t, "c", 1, "", guard.Rejected, guard.ReasonStaleToken, err)
	})
	t.Run("lease lost", func(t *testing.T) {
		l := newLease("r", 6)
		_, err := guard.Exec(ctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
			l.lose()
			return insert(ctx, tx)
		})
		require.ErrorIs(t, err, guard.ErrLeaseLost)
		check(t, "r", 6, "", guard.Rejected, guard.ReasonLeaseLost, err)
	})
	t.Run("fn fails", func(t *testing.T) {
		boom := errors.New("boom")
		_, err := guard.Exec(ctx, s, newLease("r", 7), func(context.Context, pgx.Tx) error { return boom })
		require.ErrorIs(t, err, boom)
		check(t, "r", 7, "", guard.Failed, "", err)
	})
	t.Run("tx ended by fn", func(t *testing.T) {
		_, err := guard.Exec(ctx, s, newLease("r", 8), func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "ROLLBACK")
			return err
		})
		require.ErrorIs(t, err, guard.ErrTxEnded)
		check(t, "r", 8, "", guard.Unknown, guard.ReasonTxEnded, err)
	})
	t.Run("run finished", func(t *testing.T) {
		run := s.Run(newLease("r", 8), "run-1")
		require.NoError(t, run.Step(ctx, "a", insert))
		check(t, "r", 8, "", guard.Committed, "", nil)
		require.NoError(t, run.Finish(ctx))
		err := run.Step(ctx, "b", insert)
		require.ErrorIs(t, err, guard.ErrRunFinished)
		check(t, "r", 8, "", guard.Rejected, guard.ReasonRunFinished, err)
	})
	t.Run("panic", func(t *testing.T) {
		require.Panics(t, func() {
			_, _ = guard.Exec(ctx, s, newLease("r", 9), func(context.Context, pgx.Tx) error { panic("fn") })
		})
		e := rec.last(t)
		assert.Equal(t, guard.Failed, e.Outcome)
		assert.ErrorContains(t, e.Err, "panicked")
	})
	t.Run("bad input is no event", func(t *testing.T) {
		n := len(rec.evs)
		_, err := guard.Exec(ctx, s, newLease("r", 0), insert)
		require.ErrorIs(t, err, guard.ErrInvalidLease)
		assert.Len(t, rec.evs, n)
	})
	stock, _ := rows(t, pool)
	assert.EqualValues(t, 2, stock, "the committed Exec and the committed step")
	assert.Zero(t, rec.cancellable, "observers get a ctx without cancellation")
}

// A read-only database's refusal is named (pgfence's reason).
func TestObserverReadOnly(t *testing.T) {
	pool, _, ctx := setup(t)
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
	require.NoError(t, err)
	rec := &recorder{}
	_, err = guard.Exec(ctx, observedStore(t, conn, rec), newLease("r", 1), insert)
	require.ErrorIs(t, err, guard.ErrReadOnly)
	e := rec.last(t)
	assert.Equal(t, guard.Rejected, e.Outcome)
	assert.Equal(t, guard.ReasonReadOnly, e.Reason)
}

// cutAfterCommit is a connection that, once armed, lets the commit round
// trip reach the server and then closes: the client loses the answer.
type cutAfterCommit struct {
	net.Conn
	armed *atomic.Bool
}

func (c cutAfterCommit) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if c.armed.Load() && (bytes.Contains(b, []byte("fencelock.close")) || bytes.Contains(b, []byte("fencelock_close_"))) {
		c.armed.Store(false)
		_ = c.Conn.Close()
	}
	return n, err
}

// A commit whose connection dies in flight is an unknown outcome, never a
// failure.
func TestObserverUnknownOutcome(t *testing.T) {
	pool, _, ctx := setup(t)
	cfg := pool.Config().ConnConfig.Copy()
	var armed atomic.Bool
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return cutAfterCommit{Conn: c, armed: &armed}, nil
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	rec := &recorder{}
	_, err = guard.Exec(ctx, observedStore(t, conn, rec), newLease("r", 1), func(ctx context.Context, tx pgx.Tx) error {
		armed.Store(true)
		return insert(ctx, tx)
	}, guard.WithKey("k"))
	require.ErrorIs(t, err, guard.ErrUnknownOutcome)
	e := rec.last(t)
	assert.Equal(t, guard.Unknown, e.Outcome)
	assert.Equal(t, guard.ReasonCommitInFlight, e.Reason)
}

// The store's observers and the call's all see the event, the store's
// first; a bad observer is a bad option.
func TestObserverAttach(t *testing.T) {
	pool, _, ctx := setup(t)
	var order []string
	st, call := &recorder{name: "store", all: &order}, &recorder{name: "call", all: &order}
	s := observedStore(t, pool, st)
	_, err := guard.Exec(ctx, s, newLease("r", 1), insert, guard.WithObserver(call))
	require.NoError(t, err)
	assert.Equal(t, []string{"store", "call"}, order)

	// A store without observers reports to the call's only.
	plain, err := pgfence.New(pool)
	require.NoError(t, err)
	_, err = guard.Exec(ctx, plain, newLease("r", 1), insert, guard.WithObserver(call))
	require.NoError(t, err)
	assert.Equal(t, []string{"store", "call", "call"}, order)

	_, err = guard.Exec(ctx, s, newLease("r", 1), insert, guard.WithObserver(nil))
	require.ErrorIs(t, err, guard.ErrInvalidOption)
	_, err = guard.Exec(ctx, s, newLease("r", 1), insert, guard.WithObserver(struct{}{}))
	require.ErrorIs(t, err, guard.ErrInvalidOption)
	assert.Contains(t, err.Error(), "ExecObserver")
	_, err = pgfence.New(pool, pgstore.WithObserver("not an observer"))
	require.ErrorIs(t, err, guard.ErrInvalidOption)
	_, err = pgfence.New(pool, pgstore.WithObserver(nil))
	require.ErrorIs(t, err, guard.ErrInvalidOption)
	assert.Len(t, order, 3, "refused calls report nothing")
}

// The log observer writes one line per event, at a level by outcome, with
// the duration as a duration.
func TestLogObserver(t *testing.T) {
	pool, _, ctx := setup(t)
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := observedStore(t, pool, guard.NewLogObserver(l))
	_, err := guard.Exec(ctx, s, newLease("r", 2), insert, guard.WithKey("k"))
	require.NoError(t, err)
	_, err = guard.Exec(ctx, s, newLease("r", 1), insert)
	require.ErrorIs(t, err, guard.ErrStaleToken)

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2, buf.String())
	assert.Contains(t, lines[0], `level=DEBUG msg="guard: committed" resource=r token=2 key=k took=`)
	assert.Contains(t, lines[1], `level=WARN msg="guard: rejected, nothing written" resource=r token=1 reason=stale_token took=`)
	assert.Contains(t, lines[1], "err=")
	took := lines[1][strings.Index(lines[1], "took=")+5:]
	took = took[:strings.IndexByte(took, ' ')]
	_, err = time.ParseDuration(took)
	assert.NoError(t, err, "took=%s is a duration", took)
}

// WithLogger, per call and per store, installs the log observer; nil is an
// invalid option.
func TestWithLogger(t *testing.T) {
	pool, _, ctx := setup(t)
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := pgfence.New(pool, pgstore.WithLogger(l))
	require.NoError(t, err)
	_, err = guard.Exec(ctx, s, newLease("wl", 2), insert)
	require.NoError(t, err)
	plain, err := pgfence.New(pool)
	require.NoError(t, err)
	_, err = guard.Exec(ctx, plain, newLease("wl", 1), insert, guard.WithLogger(l))
	require.ErrorIs(t, err, guard.ErrStaleToken)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2, buf.String())
	assert.Contains(t, lines[0], `msg="guard: committed" resource=wl token=2`)
	assert.Contains(t, lines[1], `msg="guard: rejected, nothing written" resource=wl token=1 reason=stale_token`)

	_, err = guard.Exec(ctx, plain, newLease("wl", 3), insert, guard.WithLogger(nil))
	require.ErrorIs(t, err, guard.ErrInvalidOption)
	_, err = pgfence.New(pool, pgstore.WithLogger(nil))
	require.ErrorIs(t, err, guard.ErrInvalidOption)
}
