package testenv

import "fmt"

// optionFunc is an option of any of testenv's servers as a function: the
// one option style of the library (an interface with an unexported apply
// method, as fence's), with an error for an option that cannot apply.
type optionFunc[C any] func(*C) error

func (f optionFunc[C]) apply(c *C) error { return f(c) }

// applyOptions applies opts to cfg in order; a nil option is an error.
func applyOptions[C any, O interface{ apply(*C) error }](cfg *C, opts []O) error {
	for i, o := range opts {
		if any(o) == nil {
			return fmt.Errorf("testenv: option %d of %d is nil", i+1, len(opts))
		}
		if err := o.apply(cfg); err != nil {
			return err
		}
	}
	return nil
}
