package guard_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/stretchr/testify/assert"
)

// A lost lease's message names its cause once, even when what the loss
// ended (a store's begin failing on the lease's cancelled context) carries
// the same cause again.
func TestLeaseLostNamesCauseOnce(t *testing.T) {
	cause := errors.New("fence: lock lost: \"x\": no renewal before the deadline")
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, `guard: lease lost (fence: lock lost: "x": no renewal before the deadline)`},
		{cause, `guard: lease lost (fence: lock lost: "x": no renewal before the deadline)`},
		{fmt.Errorf("sqlfence: begin: %w", cause), `guard: lease lost (fence: lock lost: "x": no renewal before the deadline); sqlfence: begin`},
		{errors.New("context canceled"), `guard: lease lost (fence: lock lost: "x": no renewal before the deadline); context canceled`},
	} {
		err := &guard.LeaseLostError{Cause: cause, Err: tc.err}
		assert.Equal(t, tc.want, err.Error())
		assert.ErrorIs(t, err, cause)
		if tc.err != nil {
			assert.ErrorIs(t, err, tc.err)
		}
	}
	assert.Equal(t, "guard: lease lost; store: begin: boom", (&guard.LeaseLostError{Err: errors.New("store: begin: boom")}).Error())
}
