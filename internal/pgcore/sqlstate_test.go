package pgcore_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// otherDriverError is a driver error with the method and fields lib/pq's
// *pq.Error has (Code of a named string type, Message, Detail).
type code string

type otherDriverError struct {
	Code    code
	Message string
	Detail  string
}

func (e *otherDriverError) Error() string    { return "other: " + e.Message }
func (e *otherDriverError) SQLState() string { return string(e.Code) }

// bareError has the method and no fields.
type bareError string

func (e bareError) Error() string    { return string(e) }
func (e bareError) SQLState() string { return "FL001" }

const staleDetail = `{"resource" : "r", "token" : 4, "current" : 5}`

func TestFromAnyDriver(t *testing.T) {
	for _, err := range []error{
		&pgconn.PgError{Code: "FL001", Message: "fencelock: stale", Detail: staleDetail},
		fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "FL001", Message: "fencelock: stale", Detail: staleDetail}),
		&otherDriverError{Code: "FL001", Message: "fencelock: stale", Detail: staleDetail},
	} {
		e, ok := pgcore.From(err)
		require.True(t, ok, "%T", err)
		assert.Equal(t, pgcore.Error{Code: "FL001", Message: "fencelock: stale", Detail: staleDetail}, e)
		mapped := pgcore.Map(err)
		var se *guard.StaleTokenError
		require.ErrorAs(t, mapped, &se, "%T", err)
		assert.Equal(t, guard.StaleTokenError{Resource: "r", Token: 4, Current: 5}, *se)
	}
	// No fields: the code still maps, without the figures.
	e, ok := pgcore.From(bareError("stale"))
	require.True(t, ok)
	assert.Equal(t, "FL001", e.Code)
	assert.ErrorIs(t, pgcore.Map(bareError("stale")), guard.ErrStaleToken)

	for _, err := range []error{nil, errors.New("not postgres"), &pgconn.PgError{}} {
		_, ok := pgcore.From(err)
		assert.False(t, ok, "%v", err)
		assert.Equal(t, err, pgcore.Map(err))
	}
}

func TestMapCodes(t *testing.T) {
	for _, tc := range []struct {
		code, msg string
		want      error
	}{
		{"FL003", "fencelock: applied", guard.ErrAlreadyApplied},
		{"FL004", "fencelock: finished", guard.ErrRunFinished},
		{"FL004", "fencelock: finished", guard.ErrAlreadyApplied},
		{"FL002", "fencelock: not claimed", guard.ErrNotClaimed},
		{"55P03", "canceling statement due to lock timeout", guard.ErrFenceBusy},
		{"25006", "cannot execute INSERT in a read-only transaction", guard.ErrReadOnly},
		{"0A000", "cannot set transaction read-write mode during recovery", guard.ErrReadOnly},
		{"22023", "fencelock: claim: empty resource name", guard.ErrInvalidInput},
		{"42883", "function fencelock.open(unknown) does not exist", guard.ErrSchemaMissing},
		{"3F000", `schema "fencelock" does not exist`, guard.ErrSchemaMissing},
	} {
		err := &otherDriverError{Code: code(tc.code), Message: tc.msg}
		mapped := pgcore.Map(err)
		assert.ErrorIs(t, mapped, tc.want, tc.code)
		var back *otherDriverError
		if tc.code != "FL003" {
			assert.ErrorAs(t, mapped, &back, "%s: the driver's error stays in the chain", tc.code)
		}
		assert.NotContains(t, mapped.Error(), "\n")
	}
	// Codes that name nothing of fencelock stay as they are.
	for _, err := range []error{
		&otherDriverError{Code: "22023", Message: "invalid value for parameter"},
		&otherDriverError{Code: "42883", Message: "function foo() does not exist"},
		&otherDriverError{Code: "0A000", Message: "not supported"},
		&otherDriverError{Code: "23505", Message: "duplicate key"},
	} {
		assert.Equal(t, error(err), pgcore.Map(err))
	}
}

// A fencelock function or table missing in raw SQL (MapError) is
// guard.ErrSchemaMissing, in a message that names the fix: a command that
// runs from any directory (the goose CLI's -dir migrations works only in a
// checkout of this repository). The driver's error stays in the chain.
func TestSchemaMissingFixWorksOutsideACheckout(t *testing.T) {
	raw := &pgconn.PgError{Severity: "ERROR", Code: "42883", Message: "function fencelock.claim(text, bigint, text) does not exist"}
	err := pgcore.Map(fmt.Errorf("insert: %w", raw))
	require.ErrorIs(t, err, guard.ErrSchemaMissing)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.NotContains(t, err.Error(), "-dir migrations")
	assert.Equal(t, `guard: fencelock schema not installed: run migrations.Up(ctx, db), or: `+
		`go run github.com/fencelock/fencelock/cmd/fencectl@latest migrate up --db "$DATABASE_URL" (insert: ERROR: function fencelock.claim(text, bigint, text) does not exist (SQLSTATE 42883))`, err.Error())
}
