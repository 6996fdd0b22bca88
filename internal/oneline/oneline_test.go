package oneline

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestJoin(t *testing.T) {
	a, b := errors.New("a"), errors.Join(errors.New("b1"), errors.New("b2"))
	err := Join(nil, a, b)
	assert.Equal(t, "a; b1; b2", err.Error(), "one line, nested joins folded")
	assert.ErrorIs(t, err, a)
	assert.ErrorIs(t, err, b)
	assert.Same(t, a, Join(nil, a), "a single error is returned as it is")
	assert.NoError(t, Join(nil, nil))
	assert.Equal(t, "x; y", Fold("x\r\ny"))
}
