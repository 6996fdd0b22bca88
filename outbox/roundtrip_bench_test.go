package outbox_test

import (
	"context"
	"database/sql"
	"net"
	"sync/atomic"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// wire counts what a connection writes to the server: pgx sends each
// round trip's messages in one write.
type wire struct{ writes, bytes atomic.Int64 }

type wiredConn struct {
	net.Conn
	w *wire
}

func (c wiredConn) Write(b []byte) (int, error) {
	c.w.writes.Add(1)
	c.w.bytes.Add(int64(len(b)))
	return c.Conn.Write(b)
}

// wiredConfig is db's pgx config, its connections counted by w.
func wiredConfig(b *testing.B, url string, w *wire) *pgx.ConnConfig {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return wiredConn{Conn: c, w: w}, nil
	}
	return cfg
}

// BenchmarkGuardedRoundTrips reports the round trips and the bytes sent
// per guarded transaction of one INSERT, with and without an effect, for
// both stores: what a change to the Postgres seam must not grow.
//
//	go test -run '^$' -bench GuardedRoundTrips -benchmem ./outbox/
func BenchmarkGuardedRoundTrips(b *testing.B) {
	db := newDB(b)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE rt (n int)`); err != nil {
		b.Fatal(err)
	}
	effect := outbox.Effect{Destination: "d", Key: "k", Payload: []byte("p")}
	var w wire
	conn, err := pgx.ConnectConfig(ctx, wiredConfig(b, db.URL, &w))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	pg, err := pgfence.New(conn)
	if err != nil {
		b.Fatal(err)
	}
	sdb := stdlib.OpenDB(*wiredConfig(b, db.URL, &w))
	defer sdb.Close()
	sdb.SetMaxOpenConns(1)
	sq, err := sqlfence.New(sdb)
	if err != nil {
		b.Fatal(err)
	}
	lease := guardtest.Lease{Resource: "rt", Tok: 1, Who: "bench"}
	pgWrite := func(add bool) func() error {
		return func() error {
			_, err := guard.Exec(ctx, pg, lease, func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO rt VALUES (1)`); err != nil || !add {
					return err
				}
				return outbox.Add(ctx, tx, effect)
			})
			return err
		}
	}
	sqlWrite := func(add bool) func() error {
		return func() error {
			_, err := guard.Exec(ctx, sq, lease, func(ctx context.Context, tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, `INSERT INTO rt VALUES (1)`); err != nil || !add {
					return err
				}
				return outbox.Add(ctx, tx, effect)
			})
			return err
		}
	}
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"pgfence", pgWrite(false)}, {"pgfence+outbox", pgWrite(true)},
		{"sqlfence", sqlWrite(false)}, {"sqlfence+outbox", sqlWrite(true)},
	} {
		b.Run(c.name, func(b *testing.B) {
			// Warm up: statements are prepared on first use.
			if err := c.run(); err != nil {
				b.Fatal(err)
			}
			writes, bytes := w.writes.Load(), w.bytes.Load()
			b.ResetTimer()
			for b.Loop() {
				if err := c.run(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(w.writes.Load()-writes)/float64(b.N), "roundtrips/op")
			b.ReportMetric(float64(w.bytes.Load()-bytes)/float64(b.N), "wirebytes/op")
		})
	}
}
