package fencelockotel

import (
	"fmt"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Option configures New.
type Option interface {
	apply(*config) error
}

// optionFunc is an Option as a function.
type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	mp      metric.MeterProvider
	tp      trace.TracerProvider
	names   bool
	backlog *backlog
	// now is the backlog gauge's clock (time.Now; the tests set theirs).
	now func() time.Time
}

// WithMeterProvider sets where the metrics go (default: the global one,
// otel.GetMeterProvider(), as it is when New runs).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) error {
		if mp == nil {
			return fmt.Errorf("%w: WithMeterProvider(nil): pass a provider, or omit the option for the global one", ErrInvalidOption)
		}
		c.mp = mp
		return nil
	})
}

// WithTracerProvider sets where the spans go (default: the global one,
// otel.GetTracerProvider(), as it is when New runs).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) error {
		if tp == nil {
			return fmt.Errorf("%w: WithTracerProvider(nil): pass a provider, or omit the option for the global one", ErrInvalidOption)
		}
		c.tp = tp
		return nil
	})
}

// WithNameAttribute adds the lock name (fencelock.lock.name) and the
// guarded resource (fencelock.resource) to every metric of locks, guarded
// writes and outbox deliveries. Off by default:
// each name becomes a series of every instrument, which is fine for a
// handful of fixed lock names and costly for one lock per customer or
// batch. Spans always carry them.
func WithNameAttribute() Option {
	return optionFunc(func(c *config) error {
		c.names = true
		return nil
	})
}
