package migrations

import (
	"context"
	"fmt"
	"log/slog"
)

// Option configures Up, Down and Status.
type Option interface {
	apply(*config) error
}

type config struct {
	op     string // "up", "down" or "status": Force is for Down only
	force  bool
	logger *slog.Logger
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

func newConfig(op string, opts []Option) (*config, error) {
	c := &config{op: op, logger: slog.Default()}
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

// WithLogger sends the messages of Up, Down and Status to l instead of
// slog.Default(). Adopting a schema (see Up) is logged at Info; goose's
// own messages (each migration applied, each statement run) at Debug,
// with the attribute logger=goose.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: WithLogger(nil): pass a logger, or omit the option for slog.Default()", ErrInvalidOption)
		}
		c.logger = l
		return nil
	})
}

// debugHandler hands goose's records to the caller's handler at Debug:
// goose logs every statement it runs, at Info, which is too loud for a
// library call that usually changes nothing.
type debugHandler struct{ h slog.Handler }

func (d debugHandler) Enabled(ctx context.Context, _ slog.Level) bool {
	return d.h.Enabled(ctx, slog.LevelDebug)
}

func (d debugHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Level = slog.LevelDebug
	return d.h.Handle(ctx, r)
}

func (d debugHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return debugHandler{d.h.WithAttrs(as)}
}

func (d debugHandler) WithGroup(name string) slog.Handler {
	return debugHandler{d.h.WithGroup(name)}
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
