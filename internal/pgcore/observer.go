package pgcore

import (
	"fmt"

	"github.com/fencelock/fencelock/guard"
)

// CheckObserver validates o for a store's WithObserver option.
func CheckObserver(o guard.Observer) error {
	if o == nil {
		return fmt.Errorf("%w: WithObserver(nil): pass an observer, or omit the option", guard.ErrInvalidOption)
	}
	if _, ok := o.(guard.ExecObserver); !ok {
		return fmt.Errorf("%w: WithObserver(%T): it implements none of guard's observer interfaces (guard.ExecObserver)", guard.ErrInvalidOption, o)
	}
	return nil
}
