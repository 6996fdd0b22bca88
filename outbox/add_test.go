package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// store is one of the two stores, with fn's tx as any.
type store struct {
	name string
	exec func(ctx context.Context, l guard.Lease, fn func(ctx context.Context, tx any) error, opts ...guard.Option) error
	// write inserts a row of the test's table through fn's tx.
	write func(ctx context.Context, tx any, n int) error
}

func stores(t *testing.T, db *testenv.DB) []store {
	ctx := ctxT(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS stock (n int)`)
	require.NoError(t, err)
	pg, err := pgfence.New(db.Pool)
	require.NoError(t, err)
	sdb, err := sql.Open("pgx", db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sdb.Close() })
	sq, err := sqlfence.New(sdb)
	require.NoError(t, err)
	return []store{
		{
			name: "pgfence",
			exec: func(ctx context.Context, l guard.Lease, fn func(context.Context, any) error, opts ...guard.Option) error {
				_, err := guard.Exec(ctx, pg, l, func(ctx context.Context, tx pgx.Tx) error { return fn(ctx, tx) }, opts...)
				return err
			},
			write: func(ctx context.Context, tx any, n int) error {
				_, err := tx.(pgx.Tx).Exec(ctx, `INSERT INTO stock VALUES ($1)`, n)
				return err
			},
		},
		{
			name: "sqlfence",
			exec: func(ctx context.Context, l guard.Lease, fn func(context.Context, any) error, opts ...guard.Option) error {
				_, err := guard.Exec(ctx, sq, l, func(ctx context.Context, tx *sql.Tx) error { return fn(ctx, tx) }, opts...)
				return err
			},
			write: func(ctx context.Context, tx any, n int) error {
				_, err := tx.(*sql.Tx).ExecContext(ctx, `INSERT INTO stock VALUES ($1)`, n)
				return err
			},
		},
	}
}

// add is outbox.Add on fn's tx held as any, with the store's handle type
// restored: Add's Tx is the store's, as in an fn that a user writes.
func add(ctx context.Context, tx any, effects ...outbox.Effect) error {
	switch tx := tx.(type) {
	case *sql.Tx:
		return outbox.Add(ctx, tx, effects...)
	case pgx.Tx:
		return outbox.Add(ctx, tx, effects...)
	}
	return outbox.Add(ctx, tx, effects...)
}

func effect(rc *receiver, key string) outbox.Effect {
	return outbox.Effect{Destination: rc.URL, Key: key, Payload: []byte("p-" + key)}
}

// Effects added in a guarded transaction are delivered once it commits,
// at once: the relay polls once an hour, the commit wakes it. Nothing is
// recorded when the transaction does not commit: fn's error, panic or
// cancelled context, a stale token at the commit (nothing sent), a retry
// under WithKey (ErrAlreadyApplied, nothing new sent).
func TestAddWithStores(t *testing.T) {
	db := newDB(t)
	rc := newReceiver(t, nil)
	startRelay(t, db.Pool, httpSender(t), outbox.WithPollInterval(time.Hour))
	for _, s := range stores(t, db) {
		t.Run(s.name, func(t *testing.T) {
			ctx := ctxT(t)
			res := "stock:" + s.name
			before, _ := rows(t, db.Pool)
			err := s.exec(ctx, guardtest.Lease{Resource: res, Tok: 10, Who: "a"}, func(ctx context.Context, tx any) error {
				if err := s.write(ctx, tx, 1); err != nil {
					return err
				}
				return add(ctx, tx, effect(rc, s.name+"-1"), effect(rc, s.name+"-2"))
			}, guard.WithKey("batch-1"))
			require.NoError(t, err)
			eventually(t, func() bool { k := rc.keys(); return k[s.name+"-1"] == 1 && k[s.name+"-2"] == 1 }, "delivered on the commit's wake-up")
			for _, g := range rc.deliveries() {
				if g.key == s.name+"-1" {
					assert.Equal(t, res, g.resource)
					assert.Equal(t, "10", g.token)
					assert.Equal(t, "a", g.holder)
					assert.Equal(t, "p-"+s.name+"-1", g.body)
				}
			}

			fail := map[string]func(ctx context.Context, tx any) error{
				"error": func(ctx context.Context, tx any) error {
					require.NoError(t, add(ctx, tx, effect(rc, s.name+"-error")))
					return errors.New("fn failed")
				},
				"panic": func(ctx context.Context, tx any) error {
					require.NoError(t, add(ctx, tx, effect(rc, s.name+"-panic")))
					panic("fn panicked")
				},
			}
			for name, fn := range fail {
				func() {
					defer func() { _ = recover() }()
					err := s.exec(ctx, guardtest.Lease{Resource: res, Tok: 10, Who: "a"}, fn)
					require.Error(t, err, name)
				}()
			}
			cctx, cancel := context.WithCancel(ctx)
			err = s.exec(cctx, guardtest.Lease{Resource: res, Tok: 10, Who: "a"}, func(ctx context.Context, tx any) error {
				require.NoError(t, add(ctx, tx, effect(rc, s.name+"-cancel")))
				cancel()
				return nil
			})
			require.ErrorIs(t, err, context.Canceled)

			// A newer holder commits while the old one is inside fn: the old
			// one's commit is refused, its effect never recorded.
			err = s.exec(ctx, guardtest.Lease{Resource: res, Tok: 10, Who: "a"}, func(ctx context.Context, tx any) error {
				if err := add(ctx, tx, effect(rc, s.name+"-stale")); err != nil {
					return err
				}
				return s.exec(context.WithoutCancel(ctx), guardtest.Lease{Resource: res, Tok: 11, Who: "b"}, func(ctx context.Context, tx any) error { return s.write(ctx, tx, 2) })
			})
			require.ErrorIs(t, err, guard.ErrStaleToken)
			t.Log(err)
			// The retry of the first batch, by the new holder.
			err = s.exec(ctx, guardtest.Lease{Resource: res, Tok: 11, Who: "b"}, func(ctx context.Context, tx any) error {
				return add(ctx, tx, effect(rc, s.name+"-1"))
			}, guard.WithKey("batch-1"))
			require.ErrorIs(t, err, guard.ErrAlreadyApplied)

			after, _ := rows(t, db.Pool)
			assert.Equal(t, before, after, "no row recorded by a transaction that did not commit")
			time.Sleep(100 * time.Millisecond)
			for k, n := range rc.keys() {
				if strings.HasPrefix(k, s.name+"-") {
					assert.Equal(t, 1, n, k)
					assert.Contains(t, []string{s.name + "-1", s.name + "-2"}, k, "only the committed transaction's effects are sent")
				}
			}
		})
	}
}

// Bad effects, and Add outside a guarded transaction: one clear error each,
// nothing of the call recorded, and the transaction is still fn's: it
// commits the rest when fn returns nil.
func TestAddBadInput(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	for _, s := range stores(t, db) {
		t.Run(s.name, func(t *testing.T) {
			ok := outbox.Effect{Destination: "https://x.example", Key: "k"}
			bad := map[string]outbox.Effect{
				"empty Destination":    {Key: "k"},
				"empty Key":            {Destination: "d"},
				"limit is 1048576":     {Destination: "d", Key: "k", Payload: make([]byte, outbox.MaxPayload+1)},
				"not a valid HTTP":     {Destination: "d", Key: "k", Header: http.Header{"Bad Name": {"v"}}},
				"control characters":   {Destination: "d", Key: "k", Header: http.Header{"X-Ok": {"a\r\nInjected: yes"}}},
				"set by the relay":     {Destination: "d", Key: "k", Header: http.Header{"fencing-token": {"1"}}},
				"Key \"a\\nb\" cannot": {Destination: "d", Key: "a\nb"},
			}
			err := s.exec(ctx, guardtest.Lease{Resource: "r-" + s.name, Tok: 1, Who: "a"}, func(ctx context.Context, tx any) error {
				for want, e := range bad {
					err := add(ctx, tx, ok, e)
					require.ErrorIs(t, err, outbox.ErrInvalidEffect, want)
					assert.Contains(t, err.Error(), "effect 1: ", want)
					assert.Contains(t, err.Error(), want)
				}
				require.ErrorIs(t, add(ctx, tx), outbox.ErrInvalidEffect, "no effect")
				return s.write(ctx, tx, 7)
			})
			require.NoError(t, err, "fn ignored the errors: its other writes commit")
			all, _ := rows(t, db.Pool)
			assert.Zero(t, all, "nothing of the refused calls was recorded")
		})
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM stock WHERE n = 7`).Scan(&n))
	assert.Equal(t, 2, n)

	// Outside a guarded transaction.
	plain, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = plain.Rollback(ctx) }()
	e := outbox.Effect{Destination: "d", Key: "k"}
	for _, tx := range []any{nil, plain, "a string", []int{1}} {
		err := outbox.Add(ctx, tx, e)
		require.ErrorIs(t, err, outbox.ErrNotGuarded, "%T", tx)
		assert.Equal(t, 1, strings.Count(err.Error(), "not an open guarded transaction"), err.Error())
	}
	// After Exec has returned.
	pg, err := pgfence.New(db.Pool)
	require.NoError(t, err)
	var kept pgx.Tx
	_, err = guard.Exec(ctx, pg, guardtest.Lease{Resource: "r", Tok: 2, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error { kept = tx; return nil })
	require.NoError(t, err)
	require.ErrorIs(t, outbox.Add(ctx, kept, e), outbox.ErrNotGuarded)
	all, _ := rows(t, db.Pool)
	assert.Zero(t, all)
}

// outboxKeys are the keys of the outbox's rows, oldest first.
func outboxKeys(t *testing.T, db *testenv.DB) []string {
	t.Helper()
	rs, err := db.Pool.Query(ctxT(t), `SELECT key FROM fencelock.outbox ORDER BY id`)
	require.NoError(t, err)
	keys, err := pgx.CollectRows(rs, pgx.RowTo[string])
	require.NoError(t, err)
	return keys
}

// With pgfence a savepoint of tx.Begin rolled back drops the effects added
// after it, through it or through tx; one made with SQL (SAVEPOINT and
// ROLLBACK TO SAVEPOINT sent through tx.Exec) rolls back fn's writes but
// not the effects queued meanwhile, which commit with the transaction:
// pgfence queues effects for the commit's round trip and does not read
// fn's SQL (docs/guarded-writes.md says so; use tx.Begin).
func TestAddSavepointPgfence(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	pg, err := pgfence.New(db.Pool)
	require.NoError(t, err)
	_, err = guard.Exec(ctx, pg, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error {
		if err := outbox.Add(ctx, tx, outbox.Effect{Destination: "d", Key: "kept"}); err != nil {
			return err
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if err := outbox.Add(ctx, sp, outbox.Effect{Destination: "d", Key: "dropped"}); err != nil {
			return err
		}
		if err := outbox.Add(ctx, tx, outbox.Effect{Destination: "d", Key: "dropped-through-tx"}); err != nil {
			return err
		}
		if err := sp.Rollback(ctx); err != nil {
			return err
		}
		sp, err = tx.Begin(ctx)
		if err != nil {
			return err
		}
		if err := outbox.Add(ctx, sp, outbox.Effect{Destination: "d", Key: "released"}); err != nil {
			return err
		}
		if err := sp.Commit(ctx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "CREATE TABLE t (v text); SAVEPOINT s; INSERT INTO t VALUES ('undone')"); err != nil {
			return err
		}
		if err := outbox.Add(ctx, tx, outbox.Effect{Destination: "d", Key: "sql-savepoint"}); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT s")
		return err
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"kept", "released", "sql-savepoint"}, outboxKeys(t, db),
		"a SQL ROLLBACK TO SAVEPOINT does not drop what was queued")
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n))
	assert.Zero(t, n, "while it undoes fn's writes")
}

// Notify wakes a relay that listens, in the commit: here one whose poll
// interval is an hour, and nothing else wakes it (no effect of this
// process is added), so only the NOTIFY can deliver the effect a raw
// writer recorded.
func TestNotify(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	rc := newReceiver(t, nil)
	// The relay's first claim delivers this one. Its LISTEN connection,
	// once listening, wakes it for one more claim (what was committed
	// while no one listened), which may come before or after the first
	// delivery: only after that second claim does the relay wait for its
	// next poll, an hour away, or a NOTIFY.
	require.NoError(t, raw(ctx, db.Pool, "r", 1, "h", effect(rc, "first")))
	rec := &recorder{}
	startRelay(t, db.Pool, httpSender(t), outbox.WithListen(), outbox.WithPollInterval(time.Hour), outbox.WithObserver(rec))
	eventually(t, func() bool { return rc.keys()["first"] == 1 }, "the relay's first claim")
	eventually(t, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.claims) >= 2
	}, "the claim after LISTEN")
	require.NoError(t, raw(ctx, db.Pool, "r", 1, "h", effect(rc, "raw")))
	time.Sleep(200 * time.Millisecond)
	assert.Zero(t, rc.keys()["raw"], "nothing woke the relay")
	pg, err := pgfence.New(db.Pool)
	require.NoError(t, err)
	_, err = guard.Exec(ctx, pg, guardtest.Lease{Resource: "r", Tok: 1, Who: "h"}, func(ctx context.Context, tx pgx.Tx) error { return outbox.Notify(ctx, tx) })
	require.NoError(t, err)
	eventually(t, func() bool { return rc.keys()["raw"] == 1 }, "delivered on NOTIFY")
	require.ErrorIs(t, outbox.Notify[pgx.Tx](ctx, nil), outbox.ErrNotGuarded)
}

// writeCounter counts a connection's writes to the server: pgx sends each
// round trip's messages in one write.
type writeCounter struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCounter) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// With pgfence, effects ride the commit's round trip: a guarded
// transaction with effects takes as many round trips as one without.
func TestAddNoRoundTrip(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	var writes atomic.Int64
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCounter{Conn: c, writes: &writes}, nil
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	s, err := pgfence.New(conn)
	require.NoError(t, err)
	exec := func(effects ...outbox.Effect) int64 {
		before := writes.Load()
		_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
				return err
			}
			if len(effects) == 0 {
				return nil
			}
			return outbox.Add(ctx, tx, effects...)
		})
		require.NoError(t, err)
		return writes.Load() - before
	}
	exec() // prepares pgfence's statements on the connection
	without := exec()
	with := exec(outbox.Effect{Destination: "d", Key: "k1"})
	many := exec(outbox.Effect{Destination: "d", Key: "k2"}, outbox.Effect{Destination: "d", Key: "k3", Payload: make([]byte, 4096)})
	assert.Equal(t, without, with, "one effect")
	assert.Equal(t, without, many, "two effects")
	all, _ := rows(t, db.Pool)
	assert.Equal(t, 3, all)
}

// With sqlfence, each Add is one round trip, in fn (database/sql sends one
// statement at a time), whatever the number of effects it records.
func TestAddSqlfenceRoundTrips(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	var writes atomic.Int64
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCounter{Conn: c, writes: &writes}, nil
	}
	sdb := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = sdb.Close() })
	sdb.SetMaxOpenConns(1)
	sq, err := sqlfence.New(sdb)
	require.NoError(t, err)
	exec := func(adds ...[]outbox.Effect) int64 {
		before := writes.Load()
		_, err := guard.Exec(ctx, sq, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(ctx context.Context, tx *sql.Tx) error {
			for _, effects := range adds {
				if err := outbox.Add(ctx, tx, effects...); err != nil {
					return err
				}
			}
			return nil
		})
		require.NoError(t, err)
		return writes.Load() - before
	}
	one := []outbox.Effect{{Destination: "d", Key: "k"}}
	two := []outbox.Effect{{Destination: "d", Key: "k"}, {Destination: "d", Key: "k2"}}
	exec() // the driver prepares each statement on its first use
	exec(one, two)
	without := exec()
	assert.Equal(t, without+1, exec(one), "one Add of one effect")
	assert.Equal(t, without+1, exec(two), "one Add of two effects")
	assert.Equal(t, without+2, exec(one, two), "two Adds")
}

// A fn that sends COMMIT itself through its tx after Add (a misuse: Exec
// returns guard.ErrTxEnded, "fn's writes may have committed without the
// fence check") records no effect with either store: both write effects
// with their own commit, which does not run.
func TestAddRawCommit(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	for _, s := range stores(t, db) {
		err := s.exec(ctx, guardtest.Lease{Resource: "raw-" + s.name, Tok: 1, Who: "a"}, func(ctx context.Context, tx any) error {
			if err := add(ctx, tx, outbox.Effect{Destination: "d", Key: s.name}); err != nil {
				return err
			}
			var err error
			switch tx := tx.(type) {
			case pgx.Tx:
				_, err = tx.Exec(ctx, "COMMIT")
			case *sql.Tx:
				_, err = tx.ExecContext(ctx, "COMMIT")
			}
			return err
		})
		require.ErrorIs(t, err, guard.ErrTxEnded, s.name)
	}
	assert.Empty(t, rowStates(t, db, "raw-pgfence"), "nothing recorded")
	assert.Empty(t, rowStates(t, db, "raw-sqlfence"), "nothing recorded, as with pgfence")
}

// outboxRow is a recorded effect as the table holds it.
type outboxRow struct {
	Resource, Holder, Destination, Key string
	Token                              int64
	Payload                            []byte
	Headers                            map[string][]string
	Ordered                            bool
}

func outboxRows(t *testing.T, db *testenv.DB, where string) []outboxRow {
	t.Helper()
	rs, err := db.Pool.Query(ctxT(t), `SELECT resource, holder, destination, key, token, payload, headers, ordered
		FROM fencelock.outbox WHERE `+where+` ORDER BY id`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rs, pgx.RowToStructByPos[outboxRow])
	require.NoError(t, err)
	return out
}

// Every shape of Add records the effects as given, in order, each stamped
// with the transaction's claim: one effect, a full row list (one
// statement), more than that (the JSON form), with headers or without,
// an empty payload, ordered or not, through either store.
func TestAddShapes(t *testing.T) {
	db := newDB(t)
	for _, s := range stores(t, db) {
		t.Run(s.name, func(t *testing.T) {
			ctx := ctxT(t)
			for _, n := range []int{1, 8, 20} {
				res := fmt.Sprintf("shape:%s:%d", s.name, n)
				var want []outboxRow
				var effects []outbox.Effect
				for i := range n {
					e := outbox.Effect{Destination: "https://x.example/" + strconv.Itoa(i), Key: res + "/" + strconv.Itoa(i), Ordered: i%2 == 0}
					r := outboxRow{Resource: res, Holder: "h-" + s.name, Token: int64(n), Destination: e.Destination, Key: e.Key, Ordered: e.Ordered, Payload: []byte{}}
					if i%3 != 0 {
						e.Payload = []byte("p\x00'\\" + strconv.Itoa(i))
						r.Payload = e.Payload
					}
					if i%4 == 1 {
						e.Header = http.Header{"content-type": {"application/json"}, "X-Many": {"a", "b"}}
						r.Headers = map[string][]string{"Content-Type": {"application/json"}, "X-Many": {"a", "b"}}
					}
					effects, want = append(effects, e), append(want, r)
				}
				err := s.exec(ctx, guardtest.Lease{Resource: res, Tok: int64(n), Who: "h-" + s.name}, func(ctx context.Context, tx any) error {
					return add(ctx, tx, effects...)
				})
				require.NoError(t, err, n)
				assert.Equal(t, want, outboxRows(t, db, fmt.Sprintf("resource = '%s'", res)), "%d effects", n)
			}
		})
	}
}

// An application role with only the documented grants (USAGE on the
// schema, EXECUTE on its functions) records effects through either store,
// live once committed; as raw SQL it may insert rows of its transaction's
// claim (dead ones too), never of another or without one, may read the
// rows' ids and nothing else of them, and cannot set a relay's columns,
// change or delete a row. A sqlfence commit with effects needs no EXECUTE
// on outbox_revive (which older releases called).
func TestAddRestrictedRole(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	role := "fl_outbox_app_" + strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 36)
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN NOSUPERUSER NOINHERIT`,
		`GRANT USAGE ON SCHEMA fencelock TO ` + role,
		`GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO ` + role,
	} {
		_, err := db.Pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+role)
	})
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	u.User = url.User(role)
	cfg, err := pgxpool.ParseConfig(u.String())
	require.NoError(t, err)
	app, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(app.Close)
	pg, err := pgfence.New(app)
	require.NoError(t, err)
	sdb, err := sql.Open("pgx", u.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sdb.Close() })
	sq, err := sqlfence.New(sdb)
	require.NoError(t, err)

	_, err = guard.Exec(ctx, pg, guardtest.Lease{Resource: "app", Tok: 1, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error {
		return outbox.Add(ctx, tx, outbox.Effect{Destination: "d", Key: "pg"}, outbox.Effect{Destination: "d", Key: "pg2", Header: http.Header{"X-A": {"1"}}})
	})
	require.NoError(t, err)
	_, err = guard.Exec(ctx, sq, guardtest.Lease{Resource: "app", Tok: 1, Who: "a"}, func(ctx context.Context, tx *sql.Tx) error {
		return outbox.Add(ctx, tx, outbox.Effect{Destination: "d", Key: "sql"})
	})
	require.NoError(t, err)
	assert.Len(t, outboxRows(t, db, "resource = 'app' AND token = 1 AND holder = 'a' AND dead_at IS NULL"), 3, "all live: sqlfence's commit revived its row")

	code := func(err error) string {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return pgErr.Code
		}
		return fmt.Sprint(err)
	}
	ins := `INSERT INTO fencelock.outbox (resource, token, holder, destination, key, payload) VALUES ('app', 2, 'b', 'd', 'raw', '')`
	for q, want := range map[string]string{
		ins: "FL002",
		`INSERT INTO fencelock.outbox (resource, token, holder, destination, key, payload, due_at) VALUES ('app', 2, 'b', 'd', 'k', '', now())`: "42501",
		`INSERT INTO fencelock.outbox (resource, token, holder, destination, key, payload, attempts) VALUES ('app', 2, 'b', 'd', 'k', '', 1)`:   "42501",
		`INSERT INTO fencelock.outbox (resource, token, holder, destination, key, payload, claim) VALUES ('app', 2, 'b', 'd', 'k', '', 1)`:      "42501",
		// dead_at and last_error are a writer's (sqlfence releases before
		// the one semantics recorded rows dead): past the privilege check,
		// the trigger decides.
		`INSERT INTO fencelock.outbox (resource, token, holder, destination, key, payload, dead_at, last_error) VALUES ('app', 2, 'b', 'd', 'k', '', now(), 'x')`: "FL002",
		`SELECT payload FROM fencelock.outbox`:       "42501",
		`SELECT id FROM fencelock.outbox`:            "<nil>", // older sqlfence releases read back the ids they inserted
		`UPDATE fencelock.outbox SET due_at = now()`: "42501",
		`DELETE FROM fencelock.outbox`:               "42501",
	} {
		_, err := app.Exec(ctx, q)
		assert.Equal(t, want, code(err), q)
	}
	tx, err := app.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT fencelock.claim('app', 2, 'b')`)
	require.NoError(t, err)
	for _, other := range []string{
		`INSERT INTO fencelock.outbox (resource, token, holder, destination, key, payload) VALUES ('app', 1, 'b', 'd', 'k', '')`,
		`INSERT INTO fencelock.outbox (resource, token, holder, destination, key, payload) VALUES ('app', 2, 'a', 'd', 'k', '')`,
		`INSERT INTO fencelock.outbox (resource, token, holder, destination, key, payload) VALUES ('ap', 2, 'pb', 'd', 'k', '')`,
	} {
		_, err = tx.Exec(ctx, "SAVEPOINT s; "+other)
		assert.Equal(t, "FL002", code(err), other)
		assert.ErrorContains(t, err, "not the transaction's claim", other)
		_, err = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT s")
		require.NoError(t, err)
	}
	_, err = tx.Exec(ctx, ins)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	assert.Len(t, outboxRows(t, db, "key = 'raw' AND resource = 'app' AND token = 2 AND holder = 'b'"), 1)

	// A role without EXECUTE on outbox_revive (a grant on all functions
	// made before migration 5) records effects with sqlfence all the
	// same: its commit writes them live, as pgfence's does, and calls
	// nothing of migration 5.
	_, err = db.Pool.Exec(ctx, `REVOKE EXECUTE ON FUNCTION fencelock.outbox_revive(bigint[], bigint) FROM `+role)
	require.NoError(t, err)
	_, err = guard.Exec(ctx, sq, guardtest.Lease{Resource: "app", Tok: 2, Who: "b"}, func(ctx context.Context, tx *sql.Tx) error {
		return outbox.Add(ctx, tx, outbox.Effect{Destination: "d", Key: "no-revive"})
	})
	require.NoError(t, err)
	assert.Len(t, outboxRows(t, db, "key = 'no-revive' AND dead_at IS NULL"), 1)
}

// An application role whose INSERT on fencelock.outbox was revoked (the
// migrations grant it to PUBLIC) is refused by Add through either store
// with one message: the role, what it lacks, and the GRANT the schema's
// owner runs in the database named; nothing is recorded. The refusal
// comes from the commit, which writes the effects, with either store. Run
// as printed, the fix lets the same Exec record its effect.
func TestAddInsertRevoked(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	role, roleURL := msgtest.NewAppRole(t, db)
	app, err := pgxpool.New(ctx, roleURL)
	require.NoError(t, err)
	t.Cleanup(app.Close)
	pg, err := pgfence.New(app)
	require.NoError(t, err)
	sdb, err := sql.Open("pgx", roleURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sdb.Close() })
	sq, err := sqlfence.New(sdb)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `REVOKE INSERT ON fencelock.outbox FROM PUBLIC`)
	require.NoError(t, err)

	for i, s := range []struct {
		name string
		add  func(key string) error
	}{
		{"sqlfence", func(key string) error {
			_, err := guard.Exec(ctx, sq, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(ctx context.Context, tx *sql.Tx) error {
				return outbox.Add(ctx, tx, outbox.Effect{Destination: "d", Key: key})
			})
			return err
		}},
		{"pgfence", func(key string) error {
			_, err := guard.Exec(ctx, pg, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error {
				return outbox.Add(ctx, tx, outbox.Effect{Destination: "d", Key: key})
			})
			return err
		}},
	} {
		if i > 0 {
			_, err = db.Pool.Exec(ctx, `REVOKE INSERT ON fencelock.outbox FROM `+role)
			require.NoError(t, err)
		}
		key := "revoked-" + s.name
		err := s.add(key)
		require.Error(t, err, s.name)
		assert.ErrorIs(t, err, guard.ErrPermission, s.name)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "%s: the server's error stays in the chain", s.name)
		assert.Equal(t, "42501", pgErr.Code, s.name)
		assert.Equal(t, s.name+`: role "`+role+`" lacks INSERT on table fencelock.outbox, so nothing was written: as the schema's owner (role "postgres"), run in database "`+db.Name+`":`+
			` psql -U postgres -d `+db.Name+` -c 'GRANT INSERT (resource, token, holder, destination, key, payload, headers, ordered, dead_at, last_error), SELECT (id) ON fencelock.outbox TO `+role+`;'`,
			err.Error(), s.name)
		assert.Empty(t, outboxRows(t, db, "key = '"+key+"'"), s.name)
		fix := msgtest.ParsePsql(t, err.Error())
		fix.Run(t, db.URL)
		require.NoError(t, s.add(key), "%s: after %s", s.name, fix)
		assert.Len(t, outboxRows(t, db, "key = '"+key+"' AND dead_at IS NULL"), 1, s.name)
	}
}
