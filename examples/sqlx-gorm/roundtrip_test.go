package inventory_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/lib/pq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sentRecorder keeps what lib/pq sends to the server.
type sentRecorder struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

type recordingDialer struct{ r *sentRecorder }

func (d recordingDialer) Dial(network, address string) (net.Conn, error) {
	return d.DialTimeout(network, address, 0)
}

func (d recordingDialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, address, timeout)
	if err != nil {
		return nil, err
	}
	return recordingConn{Conn: c, r: d.r}, nil
}

type recordingConn struct {
	net.Conn
	r *sentRecorder
}

func (c recordingConn) Write(b []byte) (int, error) {
	c.r.mu.Lock()
	c.r.buf.Write(b)
	c.r.mu.Unlock()
	return c.Conn.Write(b)
}

// roundTrips counts the round trips in what the client sent after the
// startup message: each ends with a Sync (extended protocol) or is one
// simple Query, and the client waits for the server's answer to each.
func (r *sentRecorder) roundTrips(t *testing.T, from int) (int, int) {
	t.Helper()
	r.mu.Lock()
	sent := append([]byte(nil), r.buf.Bytes()[from:]...)
	end := r.buf.Len()
	r.mu.Unlock()
	b := pgproto3.NewBackend(bytes.NewReader(sent), io.Discard)
	n := 0
	for {
		msg, err := b.Receive()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("decoding what lib/pq sent: %v", err)
			}
			return n, end
		}
		switch msg.(type) {
		case *pgproto3.Sync, *pgproto3.Query:
			n++
		}
	}
}

// The round trips of a guarded one-row write through sqlfence over lib/pq,
// counted on the wire against the same write in a plain transaction.
// lib/pq sends a statement with arguments in two round trips (Parse and
// Describe, then Bind and Execute), so sqlfence writes its own statements'
// values in as literals (one round trip each); database/sql sends BEGIN and
// COMMIT on its own, so the check after BEGIN and the claim before COMMIT
// are a round trip each: two more than plain. Values with quotes and
// backslashes arrive as they are.
func TestRoundTripsLibPQ(t *testing.T) {
	url := newDB(t)
	ctx := testCtx(t)
	admin := openDB(t, "postgres", url)
	_, err := admin.ExecContext(ctx, "CREATE TABLE rt (v int)")
	require.NoError(t, err)
	var rec sentRecorder
	connector, err := pq.NewConnector(url)
	require.NoError(t, err)
	connector.Dialer(recordingDialer{&rec})
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	s, err := sqlfence.New(db)
	require.NoError(t, err)
	write := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO rt (v) VALUES ($1)", 1)
		return err
	}
	l := rtLease{}
	plain := func() {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, write(ctx, tx))
		require.NoError(t, tx.Commit())
	}
	guarded := func() {
		_, err := guard.Exec(ctx, s, l, write)
		require.NoError(t, err)
	}
	plain()
	guarded() // the token is stored: advance is not sent again
	rec.mu.Lock()
	mark := rec.buf.Len() // past the startup message
	rec.mu.Unlock()
	count := func(f func()) int {
		f()
		n, end := rec.roundTrips(t, mark)
		mark = end
		return n
	}
	p := count(plain)
	g := count(guarded)
	assert.Equal(t, 4, p, "plain: BEGIN, INSERT (two), COMMIT")
	assert.Equal(t, p+2, g, "guarded: BEGIN, the check, INSERT (two), the claim, COMMIT")

	odd := oddLease{`it's 'a' "name" \ é`}
	_, err = guard.Exec(ctx, s, odd, write, guard.WithKey(`k'\ey`))
	require.NoError(t, err)
	_, err = guard.Exec(ctx, s, odd, write, guard.WithKey(`k'\ey`))
	require.ErrorIs(t, err, guard.ErrAlreadyApplied)
	var holder, key string
	require.NoError(t, admin.QueryRowContext(ctx, "SELECT f.holder, a.key FROM fencelock.fence f JOIN fencelock.applied a USING (resource) WHERE f.resource = $1", odd.name).Scan(&holder, &key))
	assert.Equal(t, odd.name, holder)
	assert.Equal(t, `k'\ey`, key)
}

type rtLease struct{}

func (rtLease) Name() string   { return "rt" }
func (rtLease) Token() int64   { return 1 }
func (rtLease) Holder() string { return "a" }

type oddLease struct{ name string }

func (l oddLease) Name() string   { return l.name }
func (oddLease) Token() int64     { return 7 }
func (l oddLease) Holder() string { return l.name }
