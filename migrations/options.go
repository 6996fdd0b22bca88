package migrations

import (
	"fmt"
	"log"
)

// Option configures Up, Down and Status.
type Option interface {
	apply(*config) error
}

// Logger receives the rare messages Up logs: adopting a schema installed
// without a record in VersionTable. *log.Logger satisfies it.
type Logger interface {
	Printf(format string, v ...any)
}

type config struct {
	op     string // "up", "down" or "status": Force is for Down only
	force  bool
	logger Logger
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

func newConfig(op string, opts []Option) (*config, error) {
	c := &config{op: op, logger: log.Default()}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil Option", ErrInvalidOption)
		}
		if err := o.apply(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Force lets Down drop the schema while tables protected by pgfence's
// Protect still have their trigger: the triggers are dropped first, and
// those tables accept unfenced writes from then on. Without it Down refuses
// with a *ProtectedError. Down only.
func Force() Option {
	return optionFunc(func(c *config) error {
		if c.op != "down" {
			return fmt.Errorf("%w: Force applies to Down only, not %s", ErrInvalidOption, opName(c.op))
		}
		c.force = true
		return nil
	})
}

// WithLogger sends Up's messages to l instead of the standard library's
// default logger.
func WithLogger(l Logger) Option {
	return optionFunc(func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: WithLogger(nil): pass a logger, e.g. log.New(io.Discard, \"\", 0) to drop the messages", ErrInvalidOption)
		}
		c.logger = l
		return nil
	})
}

func opName(op string) string {
	switch op {
	case "up":
		return "Up"
	case "status":
		return "Status"
	}
	return op
}
