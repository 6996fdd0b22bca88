package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Many goroutines on several pools claim the same and different resources
// with tokens handed out in acquisition order (as the lock does), then
// pause a little before writing, so lower tokens often arrive late. Every
// commit records its token and a per-resource commit counter; the test
// checks that committed tokens never decrease in commit order, that no
// update is lost, and that every refusal names a newer token.
func TestConcurrentClaims(t *testing.T) {
	db := newDB(t)
	ctx := testCtx(t)
	mustExec(t, db.Pool, "CREATE TABLE commits (resource text, seq bigint, token bigint, holder text, PRIMARY KEY (resource, seq))")
	mustExec(t, db.Pool, "CREATE TABLE counters (resource text PRIMARY KEY, n bigint NOT NULL)")
	mustExec(t, db.Pool, "CREATE TABLE everything (id int PRIMARY KEY, n bigint NOT NULL)")
	mustExec(t, db.Pool, "INSERT INTO everything VALUES (1, 0)")
	resources := []string{"r0", "r1", "r2"}
	for _, r := range resources {
		mustExec(t, db.Pool, "INSERT INTO counters VALUES ($1, 0)", r)
	}

	const pools, workers, iterations = 3, 12, 30
	stores := make([]interface {
		guard.Store[pgx.Tx]
		Advance(context.Context, guard.Lease) error
	}, pools)
	for i := range stores {
		cfg, err := pgxpool.ParseConfig(db.URL)
		require.NoError(t, err)
		cfg.MaxConns = 4
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		stores[i] = newStore(t, p)
	}

	var (
		next      [3]atomic.Int64 // the "lock server": one token counter per resource
		committed [3]atomic.Int64
		advanced  [3]atomic.Int64 // highest token accepted by Advance
		stale     atomic.Int64
		wg        sync.WaitGroup
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			store := stores[w%pools]
			for i := 0; i < iterations; i++ {
				ri := rng.IntN(len(resources))
				res := resources[ri]
				l := guardtest.Lease{Resource: res, Tok: next[ri].Add(1), Who: fmt.Sprintf("w%d-%d", w, i)}
				if rng.IntN(4) == 0 {
					err := store.Advance(ctx, l)
					if err == nil {
						atomicMax(&advanced[ri], l.Tok)
					} else if !checkStale(t, err, l) {
						return
					}
				}
				time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
				// Retry the same lease once in a while: the same token from
				// the same holder is accepted again.
				for range 1 + rng.IntN(2) {
					_, err := guard.Exec(ctx, store, l, func(ctx context.Context, tx pgx.Tx) error {
						var n int64
						if err := tx.QueryRow(ctx, "UPDATE counters SET n = n + 1 WHERE resource = $1 RETURNING n", res).Scan(&n); err != nil {
							return err
						}
						if _, err := tx.Exec(ctx, "UPDATE everything SET n = n + 1 WHERE id = 1"); err != nil {
							return err
						}
						_, err := tx.Exec(ctx, "INSERT INTO commits VALUES ($1, $2, $3, $4)", res, n, l.Tok, l.Who)
						return err
					})
					if err == nil {
						committed[ri].Add(1)
						continue
					}
					if !checkStale(t, err, l) {
						return
					}
					stale.Add(1)
				}
			}
		}()
	}
	wg.Wait()

	var total int64
	for ri, res := range resources {
		rows, err := db.Pool.Query(ctx, "SELECT seq, token FROM commits WHERE resource = $1 ORDER BY seq", res)
		require.NoError(t, err)
		var last, lastSeq, n, maxTok int64
		for rows.Next() {
			var seq, tok int64
			require.NoError(t, rows.Scan(&seq, &tok))
			require.Equal(t, lastSeq+1, seq, "%s: commit counter has a gap (lost update)", res)
			require.GreaterOrEqual(t, tok, last, "%s: token went back at commit %d", res, seq)
			last, lastSeq, n = tok, seq, n+1
			maxTok = max(maxTok, tok)
		}
		require.NoError(t, rows.Err())
		assert.Equal(t, committed[ri].Load(), n, "%s: every successful Exec committed exactly its row", res)
		assert.Equal(t, n, count(t, db.Pool, "SELECT n FROM counters WHERE resource = $1", res), "%s: lost update", res)
		assert.Equal(t, max(maxTok, advanced[ri].Load()), storedToken(t, db.Pool, res), "%s: the stored token is the highest accepted", res)
		total += n
	}
	assert.Equal(t, total, count(t, db.Pool, "SELECT n FROM everything"))
	t.Logf("commits %d, stale refusals %d", total, stale.Load())
	// The test means something only if both outcomes happened.
	assert.Positive(t, total)
	assert.Positive(t, stale.Load())
}

// checkStale reports whether err is a refusal that names a newer token.
func checkStale(t *testing.T, err error, l guardtest.Lease) bool {
	var se *guard.StaleTokenError
	if !errors.As(err, &se) {
		t.Errorf("lease %v: unexpected error: %v", l, err)
		return false
	}
	if se.Resource != l.Resource || se.Token != l.Tok || se.Current <= l.Tok {
		t.Errorf("lease %v: refusal does not name a newer token: %+v", l, *se)
		return false
	}
	return true
}

func atomicMax(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}
