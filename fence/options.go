package fence

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// Defaults and limits.
const (
	// DefaultLease is the watchdog lease: the lock's expiry on the server,
	// renewed every lease/3 while the holder lives.
	DefaultLease = 30 * time.Second
	// MinLease is the shortest lease accepted. Below it the renewal period
	// (lease/3) nears the round trip of a loaded network and the drift
	// margin leaves no useful validity.
	MinLease = 100 * time.Millisecond
	// DefaultWaitLimit bounds how long Acquire waits when the caller's
	// context has no deadline, so that a wait always ends.
	DefaultWaitLimit = time.Minute
	// DefaultPrefix is put in front of every key.
	DefaultPrefix = "fence:"
	// releaseTimeout bounds a release (and Close) that runs detached from
	// the caller's context.
	releaseTimeout = 5 * time.Second
	// closeTimeout bounds Close when its context has no deadline.
	closeTimeout = 5 * time.Second
)

// Option configures a [Client] (given to [New]: the client's defaults) or
// one acquisition (given to [Client.Acquire], [Client.TryAcquire] or
// [Client.Do]). Options marked client-level are rejected per acquisition.
type Option func(c *config, perLock bool) error

type config struct {
	prefix         string
	lease          time.Duration
	leaseArg       any // lease in ms, boxed once for the acquire script
	fixed          bool
	maxHold        time.Duration
	waitLimit      time.Duration
	waitLimitErr   error // the wait context's cause, made once per config
	replicas       int
	replicaTimeout time.Duration
	logger         *slog.Logger
	observer       Observer
	holder         string
}

func defaultConfig() config {
	return config{
		prefix:       DefaultPrefix,
		lease:        DefaultLease,
		leaseArg:     DefaultLease.Milliseconds(),
		waitLimit:    DefaultWaitLimit,
		waitLimitErr: waitLimitErr(DefaultWaitLimit),
		logger:       slog.New(slog.DiscardHandler),
		observer:     NopObserver{},
	}
}

func (c *config) apply(perLock bool, opts []Option) error {
	for _, o := range opts {
		if o == nil {
			return invalidOption("nil Option")
		}
		if err := o(c, perLock); err != nil {
			return err
		}
	}
	c.leaseArg = c.lease.Milliseconds()
	c.waitLimitErr = waitLimitErr(c.waitLimit)
	return nil
}

func waitLimitErr(d time.Duration) error {
	return fmt.Errorf("fence: wait limit %v reached: %w", d, context.DeadlineExceeded)
}

func clientLevel(name string, perLock bool) error {
	if perLock {
		return invalidOption("%s is a client-level option; pass it to fence.New, not to Acquire", name)
	}
	return nil
}

func checkLease(what string, d time.Duration) error {
	if d < MinLease {
		return invalidOption("%s(%v): a lease must be at least %v", what, d, MinLease)
	}
	return nil
}

// WithPrefix sets the prefix of every key (default "fence:"). Client-level.
// It must not contain '{' or '}': the lock name is the keys' hash tag.
func WithPrefix(p string) Option {
	return func(c *config, perLock bool) error {
		if err := clientLevel("WithPrefix", perLock); err != nil {
			return err
		}
		if strings.ContainsAny(p, "{}") {
			return invalidOption("WithPrefix(%q): a prefix must not contain '{' or '}', the lock name is the keys' hash tag", p)
		}
		c.prefix = p
		return nil
	}
}

// WithLease sets the watchdog lease (default 30 s, at least [MinLease]):
// the lock expires on the server one lease after the last renewal, and the
// watchdog renews it every lease/3 while the holder lives.
func WithLease(d time.Duration) Option {
	return func(c *config, _ bool) error {
		if err := checkLease("WithLease", d); err != nil {
			return err
		}
		c.lease, c.fixed = d, false
		return nil
	}
}

// WithFixedLease makes the lock expire d after acquisition with no
// watchdog, for work of known duration; [Lock.Refresh] extends it. The
// lock's context is cancelled with [ErrLockLost] when the lease runs out
// locally.
func WithFixedLease(d time.Duration) Option {
	return func(c *config, _ bool) error {
		if err := checkLease("WithFixedLease", d); err != nil {
			return err
		}
		c.lease, c.fixed = d, true
		return nil
	}
}

// WithMaxHold bounds how long a lock may be held: at d after acquisition
// the watchdog stops renewing and the lock's context is cancelled with
// [ErrMaxHold], so a hung holder cannot keep a lock forever. 0 (default)
// means no limit.
func WithMaxHold(d time.Duration) Option {
	return func(c *config, _ bool) error {
		if d < 0 {
			return invalidOption("WithMaxHold(%v): must be positive, or 0 for no limit", d)
		}
		c.maxHold = d
		return nil
	}
}

// WithWaitLimit bounds how long [Client.Acquire] waits for a held lock
// (default [DefaultWaitLimit]); the caller's context can end it earlier.
func WithWaitLimit(d time.Duration) Option {
	return func(c *config, _ bool) error {
		if d <= 0 {
			return invalidOption("WithWaitLimit(%v): must be positive; use TryAcquire for a single attempt", d)
		}
		c.waitLimit = d
		return nil
	}
}

// WithReplicaSync makes an acquisition wait (Redis WAIT) until at least
// replicas replicas have the lock, for at most timeout; with fewer acks
// the lock is released and the call fails with a [*ReplicaSyncError]. It
// narrows, but does not close, the window in which a failover loses a
// lock; fencing tokens remain the safety net.
func WithReplicaSync(replicas int, timeout time.Duration) Option {
	return func(c *config, _ bool) error {
		if replicas < 0 {
			return invalidOption("WithReplicaSync(%d, %v): replicas must be 0 (off) or more", replicas, timeout)
		}
		if replicas > 0 && timeout <= 0 {
			return invalidOption("WithReplicaSync(%d, %v): timeout must be positive (WAIT 0 would block forever)", replicas, timeout)
		}
		c.replicas, c.replicaTimeout = replicas, timeout
		return nil
	}
}

// WithLogger sets the logger for renewal failures and losses (default: no
// logging). Client-level.
func WithLogger(l *slog.Logger) Option {
	return func(c *config, perLock bool) error {
		if err := clientLevel("WithLogger", perLock); err != nil {
			return err
		}
		if l == nil {
			return invalidOption("WithLogger(nil): pass a logger, or omit the option")
		}
		c.logger = l
		return nil
	}
}

// WithObserver sets the hook that receives lock events, e.g. a metrics
// adapter. Client-level.
func WithObserver(o Observer) Option {
	return func(c *config, perLock bool) error {
		if err := clientLevel("WithObserver", perLock); err != nil {
			return err
		}
		if o == nil {
			return invalidOption("WithObserver(nil): pass an observer, or omit the option")
		}
		c.observer = o
		return nil
	}
}

// WithHolder sets the holder id stored with the lock (default: 16 random
// bytes in hex, new per acquisition). Two acquisitions with the same
// holder id still exclude each other: release and renewal also check the
// token.
func WithHolder(id string) Option {
	return func(c *config, _ bool) error {
		if id == "" || len(id) > MaxNameLen {
			return invalidOption("WithHolder(%q): the id must be 1 to %d bytes", id, MaxNameLen)
		}
		c.holder = id
		return nil
	}
}
