package pgtext

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestChecks(t *testing.T) {
	invalid, kind := errors.New("invalid input"), errors.New("invalid lease")
	assert.NoError(t, Len("name", "abc", 3, invalid, kind))
	err := Len("name", "abcd", 3, invalid, kind)
	assert.ErrorIs(t, err, invalid)
	assert.ErrorIs(t, err, kind)
	assert.Contains(t, err.Error(), "name is 4 bytes, at most 3")
	assert.NoError(t, Text("key", "é", invalid))
	assert.ErrorIs(t, Text("key", "a\x00b", invalid), invalid)
	assert.ErrorIs(t, Text("key", "\xff", invalid), invalid)
}
