package outbox

import (
	"context"
	"fmt"
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
// dead is true, else the live ones.
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
		return nil, fmt.Errorf("outbox: list: %w", describe(err))
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
		return nil, fmt.Errorf("outbox: list: %w", describe(err))
	}
	return out, nil
}

// Count counts the outbox rows by state.
func Count(ctx context.Context, db DB) (Counts, error) {
	if db == nil {
		return Counts{}, ErrNilDB
	}
	rows, err := db.Query(ctx, `SELECT due, waiting, claimed, dead FROM fencelock.outbox_counts()`, pgx.QueryExecModeExec)
	if err != nil {
		return Counts{}, fmt.Errorf("outbox: count: %w", describe(err))
	}
	var c Counts
	if err := (pgxRow{rows}).Scan(&c.Due, &c.Waiting, &c.Claimed, &c.Dead); err != nil {
		return Counts{}, fmt.Errorf("outbox: count: %w", describe(err))
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
		return 0, fmt.Errorf("outbox: requeue: %w", describe(err))
	}
	var n int
	if err := (pgxRow{rows}).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: requeue: %w", describe(err))
	}
	wakeAll()
	return n, nil
}
