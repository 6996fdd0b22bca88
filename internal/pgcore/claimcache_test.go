package pgcore

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCache(t *testing.T) {
	var c Cache
	assert.False(t, c.Has("r", 5, "h"))
	c.Add("r", 5, "h")
	assert.True(t, c.Has("r", 5, "h"))
	assert.False(t, c.Has("r", 5, "other"), "same token, another holder")
	c.Add("r", 4, "old")
	assert.True(t, c.Has("r", 5, "h"), "a lower token never replaces a higher one")
	assert.False(t, c.Has("r", 4, "old"))
	c.Add("r", 6, "new")
	assert.True(t, c.Has("r", 6, "new"))
	assert.False(t, c.Has("r", 5, "h"))

	for i := range 2 * CacheCap {
		c.Add(fmt.Sprint("x", i), 1, "h")
	}
	assert.LessOrEqual(t, len(c.m), CacheCap, "bounded")
	assert.True(t, c.Has(fmt.Sprint("x", 2*CacheCap-1), 1, "h"), "the newest entry is kept")
}
