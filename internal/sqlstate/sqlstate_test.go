package sqlstate_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/sqlstate"
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

var (
	sentinelReadOnly = errors.New("store: read-only")
	sentinelFinished = fmt.Errorf("store: run finished: %w", guard.ErrAlreadyApplied)
	sentinelMissing  = errors.New("store: schema missing")
	sentinelInput    = errors.New("store: invalid input")
	sentinelClaimed  = errors.New("store: not claimed")
	sentinelBusy     = errors.New("store: busy")
	m                = sqlstate.Mapper{
		SchemaMissing: sentinelMissing, NotClaimed: sentinelClaimed, RunFinished: sentinelFinished,
		FenceBusy: sentinelBusy, InvalidInput: sentinelInput, ReadOnly: sentinelReadOnly,
	}
)

const staleDetail = `{"resource" : "r", "token" : 4, "current" : 5}`

func TestFromAnyDriver(t *testing.T) {
	for _, err := range []error{
		&pgconn.PgError{Code: "FL001", Message: "fencelock: stale", Detail: staleDetail},
		fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "FL001", Message: "fencelock: stale", Detail: staleDetail}),
		&otherDriverError{Code: "FL001", Message: "fencelock: stale", Detail: staleDetail},
	} {
		e, ok := sqlstate.From(err)
		require.True(t, ok, "%T", err)
		assert.Equal(t, sqlstate.Error{Code: "FL001", Message: "fencelock: stale", Detail: staleDetail}, e)
		mapped := m.Map(err)
		var se *guard.StaleTokenError
		require.ErrorAs(t, mapped, &se, "%T", err)
		assert.Equal(t, guard.StaleTokenError{Resource: "r", Token: 4, Current: 5}, *se)
	}
	// No fields: the code still maps, without the figures.
	e, ok := sqlstate.From(bareError("stale"))
	require.True(t, ok)
	assert.Equal(t, "FL001", e.Code)
	assert.ErrorIs(t, m.Map(bareError("stale")), guard.ErrStaleToken)

	for _, err := range []error{nil, errors.New("not postgres"), &pgconn.PgError{}} {
		_, ok := sqlstate.From(err)
		assert.False(t, ok, "%v", err)
		assert.Equal(t, err, m.Map(err))
	}
}

func TestMapCodes(t *testing.T) {
	for _, tc := range []struct {
		code, msg string
		want      error
	}{
		{"FL003", "fencelock: applied", guard.ErrAlreadyApplied},
		{"FL004", "fencelock: finished", sentinelFinished},
		{"FL004", "fencelock: finished", guard.ErrAlreadyApplied},
		{"FL002", "fencelock: not claimed", sentinelClaimed},
		{"55P03", "canceling statement due to lock timeout", sentinelBusy},
		{"25006", "cannot execute INSERT in a read-only transaction", sentinelReadOnly},
		{"0A000", "cannot set transaction read-write mode during recovery", sentinelReadOnly},
		{"22023", "fencelock: claim: empty resource name", sentinelInput},
		{"42883", "function fencelock.open(unknown) does not exist", sentinelMissing},
		{"3F000", `schema "fencelock" does not exist`, sentinelMissing},
	} {
		err := &otherDriverError{Code: code(tc.code), Message: tc.msg}
		mapped := m.Map(err)
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
		assert.Equal(t, error(err), m.Map(err))
	}
	// A mapper without a sentinel leaves its code alone.
	var empty sqlstate.Mapper
	ro := &otherDriverError{Code: "25006", Message: "read-only"}
	assert.Equal(t, error(ro), empty.Map(ro))
}
