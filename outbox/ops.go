package outbox

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// Row is an outbox row as operators see it (List): everything but the
// payload.
type Row struct {
	ID           int64      `json:"id"`
	Resource     string     `json:"resource"`
	Token        int64      `json:"token"`
	Holder       string     `json:"holder"`
	Destination  string     `json:"destination"`
	Key          string     `json:"key"`
	PayloadBytes int        `json:"payload_bytes"`
	Ordered      bool       `json:"ordered"`
	Attempts     int        `json:"attempts"`
	Recorded     time.Time  `json:"recorded"`
	Due          time.Time  `json:"due"`
	Claimed      bool       `json:"claimed"`
	LastError    string     `json:"last_error,omitempty"`
	Dead         *time.Time `json:"dead,omitempty"`
}

// Counts is how many outbox rows are in each state.
type Counts struct {
	// Due rows may be claimed now.
	Due int64 `json:"due"`
	// Waiting rows back off after a failed attempt.
	Waiting int64 `json:"waiting"`
	// Claimed rows are held by a relay within its visibility timeout.
	Claimed int64 `json:"claimed"`
	// Dead rows wait for Requeue.
	Dead int64 `json:"dead"`
}

// List returns up to limit outbox rows, oldest first: the dead ones when
// dead is true, else the live ones. Dead rows are read through an index
// of their own, as many as are listed; live ones by the primary key, which
// also steps over the dead rows older than the last one listed.
func List(ctx context.Context, db DB, dead bool, limit int) ([]Row, error) {
	if db == nil {
		return nil, ErrNilDB
	}
	if limit < 0 {
		return nil, fmt.Errorf("%w: negative limit %d", ErrInvalidOption, limit)
	}
	rows, err := db.Query(ctx, `SELECT id, resource, token, holder, destination, key, payload_bytes, ordered, attempts, created_at, due_at, claimed, coalesce(last_error, ''), dead_at
  FROM fencelock.outbox_list($1, $2)`, pgx.QueryExecModeExec, dead, limit)
	if err != nil {
		return nil, opError(ctx, db, "list", err)
	}
	var out []Row
	for rows.Next() {
		var r Row
		if err := rows.Scan(&r.ID, &r.Resource, &r.Token, &r.Holder, &r.Destination, &r.Key, &r.PayloadBytes, &r.Ordered,
			&r.Attempts, &r.Recorded, &r.Due, &r.Claimed, &r.LastError, &r.Dead); err != nil {
			rows.Close()
			return nil, fmt.Errorf("outbox: list: %w", err)
		}
		out = append(out, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, opError(ctx, db, "list", err)
	}
	return out, nil
}

// Count counts the outbox rows by state, exactly: one pass over the
// whole table, so its cost grows with the backlog. For monitoring, or any
// table that may grow large, use [Backlog], which reads a bounded number
// of rows.
func Count(ctx context.Context, db DB) (Counts, error) {
	if db == nil {
		return Counts{}, ErrNilDB
	}
	rows, err := db.Query(ctx, `SELECT due, waiting, claimed, dead FROM fencelock.outbox_counts()`, pgx.QueryExecModeExec)
	if err != nil {
		return Counts{}, opError(ctx, db, "count", err)
	}
	var c Counts
	if err := (pgxRow{rows}).Scan(&c.Due, &c.Waiting, &c.Claimed, &c.Dead); err != nil {
		return Counts{}, opError(ctx, db, "count", err)
	}
	return c, nil
}

// DefaultBacklogLimit is the limit Backlog counts up to when given 0.
const DefaultBacklogLimit = 10000

// CappedCounts are Counts read up to a limit ([Backlog]): each count is
// at most Limit, exact unless its Capped flag is set.
type CappedCounts struct {
	Counts
	// Limit is the limit the counts were read with.
	Limit int `json:"limit"`
	// Capped says which counts are lower bounds: there may be more rows in
	// that state than counted.
	Capped Capped `json:"capped"`
}

// Capped flags, per state, a count of CappedCounts that may be short.
type Capped struct {
	Due     bool `json:"due"`
	Waiting bool `json:"waiting"`
	Claimed bool `json:"claimed"`
	Dead    bool `json:"dead"`
}

// Backlog counts the outbox rows by state as Count does, reading at most
// limit+1 rows from each of four indexes (live unordered rows due now,
// and due later; live ordered rows; dead rows) whatever the table's size:
// fencelock.outbox_backlog. A count is exact when the rows it is read from
// number at most limit; otherwise it is a lower bound, at most limit, and
// its Capped flag is set. A state can be capped below limit: rows due
// later are read together for waiting and claimed, and ordered rows for
// all three live states, so when either read is cut short each of those
// counts is what the rows read held. limit 0 means DefaultBacklogLimit.
// It needs migration 5 (fencelock.outbox_backlog).
func Backlog(ctx context.Context, db DB, limit int) (CappedCounts, error) {
	if db == nil {
		return CappedCounts{}, ErrNilDB
	}
	if limit == 0 {
		limit = DefaultBacklogLimit
	}
	if limit < 0 || limit > math.MaxInt32 {
		return CappedCounts{}, fmt.Errorf("%w: Backlog limit %d: give 1 to %d, or 0 for the default (%d)", ErrInvalidOption, limit, math.MaxInt32, DefaultBacklogLimit)
	}
	rows, err := db.Query(ctx, `SELECT due, waiting, claimed, dead, due_capped, waiting_capped, claimed_capped, dead_capped
  FROM fencelock.outbox_backlog($1)`, pgx.QueryExecModeExec, limit)
	if err != nil {
		return CappedCounts{}, opError(ctx, db, "backlog", err)
	}
	c := CappedCounts{Limit: limit}
	if err := (pgxRow{rows}).Scan(&c.Due, &c.Waiting, &c.Claimed, &c.Dead,
		&c.Capped.Due, &c.Capped.Waiting, &c.Capped.Claimed, &c.Capped.Dead); err != nil {
		return CappedCounts{}, opError(ctx, db, "backlog", err)
	}
	return c, nil
}

// Requeue makes dead rows due again with their attempts reset: the rows
// ids, or every dead row when ids is nil. It returns how many it requeued;
// ids that are not dead rows are left alone.
func Requeue(ctx context.Context, db DB, ids []int64) (int, error) {
	if db == nil {
		return 0, ErrNilDB
	}
	if ids != nil && len(ids) == 0 {
		return 0, nil
	}
	rows, err := db.Query(ctx, `SELECT fencelock.outbox_requeue($1)`, pgx.QueryExecModeExec, ids)
	if err != nil {
		return 0, opError(ctx, db, "requeue", err)
	}
	var n int
	if err := (pgxRow{rows}).Scan(&n); err != nil {
		return 0, opError(ctx, db, "requeue", err)
	}
	wakeAll()
	return n, nil
}
