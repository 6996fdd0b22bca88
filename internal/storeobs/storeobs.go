// Package storeobs holds what pgfence and sqlfence share to report their
// guarded writes to guard's observers: the check of an observer option and
// the names of the refusals guard does not know by itself.
package storeobs

import (
	"errors"
	"fmt"

	"github.com/fencelock/fencelock/guard"
)

// Check validates o for a store's WithObserver option; the error matches
// invalid (the package's ErrInvalidOption).
func Check(o guard.Observer, invalid error) error {
	if o == nil {
		return fmt.Errorf("%w: WithObserver(nil): pass an observer, or omit the option", invalid)
	}
	if _, ok := o.(guard.ExecObserver); !ok {
		return fmt.Errorf("%w: WithObserver(%T): it implements none of guard's observer interfaces (guard.ExecObserver)", invalid, o)
	}
	return nil
}

// Reason names a finished run and a read-only database, given the
// store's own errors for them; "" for anything else.
func Reason(err, runFinished, readOnly error) guard.Reason {
	switch {
	case errors.Is(err, runFinished):
		return guard.ReasonRunFinished
	case errors.Is(err, readOnly):
		return guard.ReasonReadOnly
	}
	return ""
}
