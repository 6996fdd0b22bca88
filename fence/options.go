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
	// DefaultWaitLimit bounds how long Acquire waits when neither the
	// caller's context has a deadline nor [WithWaitLimit] was given, so
	// that a wait always ends.
	DefaultWaitLimit = time.Minute
	// DefaultPrefix is put in front of every key.
	DefaultPrefix = "fence:"
	// releaseTimeout bounds a release (and Close) that runs detached from
	// the caller's context.
	releaseTimeout = 5 * time.Second
	// closeTimeout bounds Close when its context has no deadline.
	closeTimeout = 5 * time.Second
)

// ClientOption configures a [Client]: given to [New], it sets the client's
// behaviour or the defaults of its acquisitions. Options that make sense
// only for a whole client ([WithPrefix], [WithLogger], [WithObserver]) are
// ClientOptions alone, so passing one to an acquisition does not compile.
type ClientOption interface {
	applyClient(*config) error
}

// LockOption configures one acquisition: given to [Client.Acquire],
// [Client.TryAcquire] or [Client.Do], it overrides the client's default
// for that call.
type LockOption interface {
	applyLock(*config) error
}

// Option is valid both for a client (as its default) and for one
// acquisition: it satisfies [ClientOption] and [LockOption].
type Option interface {
	ClientOption
	LockOption
}

// clientOnly is a ClientOption that is not a LockOption.
type clientOnly func(*config) error

func (f clientOnly) applyClient(c *config) error { return f(c) }

// both is an Option valid at either level.
type both func(*config) error

func (f both) applyClient(c *config) error { return f(c) }
func (f both) applyLock(c *config) error   { return f(c) }

type config struct {
	prefix         string
	lease          time.Duration
	leaseArg       any // lease in ms, boxed once for the acquire script
	fixed          bool
	maxHold        time.Duration
	waitLimit      time.Duration
	waitLimitSet   bool  // WithWaitLimit given: it applies even when ctx has a deadline
	waitLimitErr   error // the wait context's cause, made once per config
	replicas       int
	replicaTimeout time.Duration
	logger         *slog.Logger // discards unless WithLogger (configuration warnings: see configLogger)
	logSet         bool         // WithLogger given: losses and renewal failures are logged
	observers      []Observer
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
	}
}

func (c *config) applyClient(opts []ClientOption) error {
	for _, o := range opts {
		if o == nil {
			return invalidOption("New: nil ClientOption")
		}
		if err := o.applyClient(c); err != nil {
			return err
		}
	}
	c.finish()
	return nil
}

func (c *config) applyLock(opts []LockOption) error {
	for _, o := range opts {
		if o == nil {
			return invalidOption("nil LockOption")
		}
		if err := o.applyLock(c); err != nil {
			return err
		}
	}
	c.finish()
	return nil
}

// finish derives the values made once per config rather than per call.
func (c *config) finish() {
	c.leaseArg = c.lease.Milliseconds()
	c.waitLimitErr = waitLimitErr(c.waitLimit)
}

func waitLimitErr(d time.Duration) error {
	return fmt.Errorf("fence: wait limit %v reached: %w", d, context.DeadlineExceeded)
}

func checkLease(what string, d time.Duration) error {
	if d < MinLease {
		return invalidOption("%s(%v): a lease must be at least %v", what, d, MinLease)
	}
	return nil
}

// WithPrefix sets the prefix of every key (default "fence:"). It must not
// contain '{' or '}': the lock name is the keys' hash tag.
func WithPrefix(p string) ClientOption {
	return clientOnly(func(c *config) error {
		if strings.ContainsAny(p, "{}") {
			return invalidOption("WithPrefix(%q): a prefix must not contain '{' or '}', the lock name is the keys' hash tag", p)
		}
		c.prefix = p
		return nil
	})
}

// WithLease sets the watchdog lease (default 30 s, at least [MinLease]):
// the lock expires on the server one lease after the last renewal, and the
// watchdog renews it every lease/3 while the holder lives.
func WithLease(d time.Duration) Option {
	return both(func(c *config) error {
		if err := checkLease("WithLease", d); err != nil {
			return err
		}
		c.lease, c.fixed = d, false
		return nil
	})
}

// WithFixedLease makes the lock expire d after acquisition with no
// watchdog, for work of known duration; [Lock.Refresh] extends it. The
// lock's context is cancelled with [ErrLockLost] when the lease runs out
// locally, and the client forgets the lock then: a fixed-lease lock left
// to expire costs nothing afterwards.
func WithFixedLease(d time.Duration) Option {
	return both(func(c *config) error {
		if err := checkLease("WithFixedLease", d); err != nil {
			return err
		}
		c.lease, c.fixed = d, true
		return nil
	})
}

// WithMaxHold bounds how long a lock may be held: at d after acquisition
// the watchdog stops renewing and the lock's context is cancelled with
// [ErrMaxHold], so a hung holder cannot keep a lock forever. 0 (default)
// means no limit.
func WithMaxHold(d time.Duration) Option {
	return both(func(c *config) error {
		if d < 0 {
			return invalidOption("WithMaxHold(%v): must be positive, or 0 for no limit", d)
		}
		c.maxHold = d
		return nil
	})
}

// WithWaitLimit bounds how long [Client.Acquire] waits for a held lock.
// The wait ends at the earlier of ctx's deadline and this limit; see
// "Waiting" in the package documentation.
func WithWaitLimit(d time.Duration) Option {
	return both(func(c *config) error {
		if d <= 0 {
			return invalidOption("WithWaitLimit(%v): must be positive; use TryAcquire for a single attempt", d)
		}
		c.waitLimit, c.waitLimitSet = d, true
		return nil
	})
}

// WithReplicaSync makes an acquisition wait (Redis WAIT) until at least
// replicas replicas have the lock, for at most timeout; with fewer acks
// the lock is released and the call fails with a [*ReplicaSyncError]. It
// narrows, but does not close, the window in which a failover loses a
// lock; fencing tokens remain the safety net.
func WithReplicaSync(replicas int, timeout time.Duration) Option {
	return both(func(c *config) error {
		if replicas < 0 {
			return invalidOption("WithReplicaSync(%d, %v): replicas must be 0 (off) or more", replicas, timeout)
		}
		if replicas > 0 && timeout <= 0 {
			return invalidOption("WithReplicaSync(%d, %v): timeout must be positive (WAIT 0 would block forever)", replicas, timeout)
		}
		c.replicas, c.replicaTimeout = replicas, timeout
		return nil
	})
}

// WithLogger logs renewal failures and losses to l, one line each, with
// the reason of a loss (default: not logged; the lock's context says it),
// and sends the client's warnings about the server's configuration (an
// eviction policy that can lose locks, a user that may not PUBLISH) to l
// instead of slog.Default(). The loss lines come from an observer like
// those of [WithObserver].
func WithLogger(l *slog.Logger) ClientOption {
	return clientOnly(func(c *config) error {
		if l == nil {
			return invalidOption("WithLogger(nil): pass a logger, or omit the option")
		}
		c.logger, c.logSet = l, true
		return nil
	})
}

// WithObserver adds o to the client's observers (a metrics or tracing
// adapter, say); each call adds one. o must implement at least one of the
// event interfaces listed at [Observer].
func WithObserver(o Observer) ClientOption {
	return clientOnly(func(c *config) error {
		if o == nil {
			return invalidOption("WithObserver(nil): pass an observer, or omit the option")
		}
		if !isObserver(o) {
			return invalidOption("WithObserver(%T): it implements none of AcquireObserver, WaitObserver, RenewObserver, LossObserver, ReleaseObserver", o)
		}
		c.observers = append(c.observers[:len(c.observers):len(c.observers)], o)
		return nil
	})
}

// WithHolder sets the holder id stored with the lock (default: 16 random
// bytes in hex, new per acquisition). An id names one holder: an
// acquisition with the id of the lock's current holder gets that lock back
// (same token, lease restarted) instead of waiting, so a retry after a
// lost reply, or a restarted process that kept its id, resumes at once.
// That is not re-entrancy: there is no count, and one [Lock.Release] ends
// the lock for every caller that got it. Give goroutines that must exclude
// each other different ids (or none).
func WithHolder(id string) Option {
	return both(func(c *config) error {
		if id == "" || len(id) > MaxNameLen {
			return invalidOption("WithHolder(%q): the id must be 1 to %d bytes", id, MaxNameLen)
		}
		c.holder = id
		return nil
	})
}
