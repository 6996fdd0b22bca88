package pgcore

import (
	"strings"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/stretchr/testify/assert"
)

func TestChecks(t *testing.T) {
	assert.NoError(t, CheckLen("name", "abc", 3, guard.ErrInvalidLease))
	err := CheckLen("name", "abcd", 3, guard.ErrInvalidLease)
	assert.ErrorIs(t, err, guard.ErrInvalidInput)
	assert.ErrorIs(t, err, guard.ErrInvalidLease)
	assert.Contains(t, err.Error(), "name is 4 bytes, at most 3")
	err = CheckLen("run key", "abcd", 3, guard.ErrInvalidInput)
	assert.Equal(t, 1, strings.Count(err.Error(), "invalid input"), "the cause is named once: %v", err)
	assert.NoError(t, CheckText("key", "é"))
	assert.ErrorIs(t, CheckText("key", "a\x00b"), guard.ErrInvalidInput)
	assert.ErrorIs(t, CheckText("key", "\xff"), guard.ErrInvalidInput)
	assert.ErrorIs(t, CheckRunKey(""), guard.ErrInvalidInput)
	assert.ErrorIs(t, CheckCursor(strings.Repeat("x", guard.MaxCursorLen+1)), guard.ErrInvalidInput)
	assert.NoError(t, CheckCursor("42"))
}
