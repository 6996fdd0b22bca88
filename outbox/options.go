package outbox

import (
	"fmt"
	"log/slog"
	"time"
)

// RelayOption configures NewRelay.
type RelayOption interface {
	apply(*relayConfig) error
}

type relayOption func(*relayConfig) error

func (f relayOption) apply(c *relayConfig) error { return f(c) }

// Defaults of a Relay.
const (
	DefaultBatchSize    = 64
	DefaultConcurrency  = 64
	DefaultPollInterval = 100 * time.Millisecond
	DefaultSendTimeout  = 10 * time.Second
	DefaultVisibility   = 30 * time.Second
	DefaultMaxAttempts  = 20
	DefaultMinBackoff   = time.Second
	DefaultMaxBackoff   = 5 * time.Minute
)

type relayConfig struct {
	batch       int
	concurrency int
	poll        time.Duration
	sendTimeout time.Duration
	visibility  time.Duration
	maxAttempts int
	minBackoff  time.Duration
	maxBackoff  time.Duration
	listen      bool
	logger      *slog.Logger
	observers   []Observer
}

func newRelayConfig(opts []RelayOption) (relayConfig, error) {
	c := relayConfig{
		batch: DefaultBatchSize, concurrency: DefaultConcurrency, poll: DefaultPollInterval,
		sendTimeout: DefaultSendTimeout, visibility: DefaultVisibility, maxAttempts: DefaultMaxAttempts,
		minBackoff: DefaultMinBackoff, maxBackoff: DefaultMaxBackoff, logger: slog.Default(),
	}
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("%w: nil RelayOption", ErrInvalidOption)
		}
		if err := o.apply(&c); err != nil {
			return c, err
		}
	}
	if c.visibility < c.sendTimeout+time.Second {
		return c, fmt.Errorf("%w: the visibility timeout (%v) must exceed the send timeout (%v) by at least 1s, or a slow send's row would be claimed again while it is being sent",
			ErrInvalidOption, c.visibility, c.sendTimeout)
	}
	if c.minBackoff > c.maxBackoff {
		return c, fmt.Errorf("%w: WithBackoff: min %v is above max %v", ErrInvalidOption, c.minBackoff, c.maxBackoff)
	}
	return c, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidOption, fmt.Sprintf(format, args...))
}

// WithBatchSize sets how many rows one claim takes at most (default
// DefaultBatchSize, 1 to 10,000).
func WithBatchSize(n int) RelayOption {
	return relayOption(func(c *relayConfig) error {
		if n < 1 || n > 10000 {
			return invalid("WithBatchSize(%d): give 1 to 10000", n)
		}
		c.batch = n
		return nil
	})
}

// WithConcurrency sets how many sends run at once (default
// DefaultConcurrency, 1 to 10,000). It also bounds the rows a relay holds
// sent, or being sent, without their outcome recorded: what a relay that
// dies can make go out twice.
func WithConcurrency(n int) RelayOption {
	return relayOption(func(c *relayConfig) error {
		if n < 1 || n > 10000 {
			return invalid("WithConcurrency(%d): give 1 to 10000", n)
		}
		c.concurrency = n
		return nil
	})
}

// WithPollInterval sets how often an idle relay looks for due rows
// (default DefaultPollInterval, at least 1ms). Polling is always on: it is
// what finds effects committed by other processes without NOTIFY, retries
// coming due, and rows a dead relay left.
func WithPollInterval(d time.Duration) RelayOption {
	return relayOption(func(c *relayConfig) error {
		if d < time.Millisecond {
			return invalid("WithPollInterval(%v): give at least 1ms", d)
		}
		c.poll = d
		return nil
	})
}

// WithSendTimeout bounds each Send (default DefaultSendTimeout); a send
// that overruns it is a failed attempt.
func WithSendTimeout(d time.Duration) RelayOption {
	return relayOption(func(c *relayConfig) error {
		if d < time.Millisecond {
			return invalid("WithSendTimeout(%v): give at least 1ms", d)
		}
		c.sendTimeout = d
		return nil
	})
}

// WithVisibilityTimeout sets how long a claim holds a row (default
// DefaultVisibility): a relay that dies, or is cut off from the database,
// loses its rows to the next claim that long after claiming them. It must
// exceed the send timeout by at least a second.
func WithVisibilityTimeout(d time.Duration) RelayOption {
	return relayOption(func(c *relayConfig) error {
		if d <= 0 {
			return invalid("WithVisibilityTimeout(%v): give a positive duration", d)
		}
		c.visibility = d
		return nil
	})
}

// WithMaxAttempts sets how many attempts a row gets before it is marked
// dead (default DefaultMaxAttempts, 1 to 1,000).
func WithMaxAttempts(n int) RelayOption {
	return relayOption(func(c *relayConfig) error {
		if n < 1 || n > 1000 {
			return invalid("WithMaxAttempts(%d): give 1 to 1000", n)
		}
		c.maxAttempts = n
		return nil
	})
}

// WithBackoff sets the delay after a failed attempt: min after the first,
// doubling up to max (defaults DefaultMinBackoff, DefaultMaxBackoff), each
// delay drawn at random between half and all of it so that failing rows
// spread out.
func WithBackoff(min, max time.Duration) RelayOption {
	return relayOption(func(c *relayConfig) error {
		if min < time.Millisecond || max < time.Millisecond {
			return invalid("WithBackoff(%v, %v): give at least 1ms for both", min, max)
		}
		c.minBackoff, c.maxBackoff = min, max
		return nil
	})
}

// WithListen makes the relay LISTEN on channel fencelock_outbox, so that
// effects added with the Notify option by other processes wake it at
// once. It needs a DB with its own connections (*pgxpool.Pool) straight to
// Postgres: behind a transaction pooler such as PgBouncer LISTEN does not
// work, and polling (always on) is the mode to use.
func WithListen() RelayOption {
	return relayOption(func(c *relayConfig) error {
		c.listen = true
		return nil
	})
}

// WithLogger sends the relay's messages (failed attempts at Debug, dead
// rows and database trouble at Warn) to l instead of slog.Default().
func WithLogger(l *slog.Logger) RelayOption {
	return relayOption(func(c *relayConfig) error {
		if l == nil {
			return invalid("WithLogger(nil): pass a logger, or omit the option for slog.Default()")
		}
		c.logger = l
		return nil
	})
}
