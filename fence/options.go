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
	// renewed every lease/3 (3 s) while the holder lives. It bounds how
	// long a crashed holder keeps the lock from the next waiter (a lease
	// at most), and sets how long a pause a holder survives (at least
	// 2/3 of it less the drift margin, about 5.9 s): see "Crashes and
	// pauses" in the package documentation.
	DefaultLease = 9 * time.Second
	// MinLease is the shortest lease accepted. Below it the renewal period
	// (lease/3) nears the round trip of a loaded network and the drift
	// margin leaves no useful validity.
	MinLease = 100 * time.Millisecond
	// DefaultWaitLimit bounds how long Acquire waits when neither the
	// caller's context has a deadline nor [WithWaitLimit] was given, so
	// that a wait always ends.
	DefaultWaitLimit = time.Minute
	// DefaultLiveness is how long a waiter keeps its place in a lock's
	// queue without a heartbeat (see [WithLiveness]).
	DefaultLiveness = 6 * time.Second
	// LongWait is how long an Acquire waits before it says, once, who
	// holds the lock and until when: at Info to the client's logger
	// ([WithLogger], else slog.Default()) and to [LongWaitObserver]s.
	// A Campaign says nothing: a candidate waits while a leader leads,
	// which [Election.Leader] and [Election.Observe] tell.
	LongWait = 5 * time.Second
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
	prefix   string
	lease    time.Duration
	leaseArg any // lease in ms, boxed once for the acquire script
	liveness time.Duration
	// modeArgs are acquire.lua's ARGV[3] per mode (see modeTry), made once
	// per config.
	modeArgs       [numModes]any
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
	// campaign is set for a Campaign call: its election and value (nil
	// for a lock).
	campaign *campaign
	// longWait is LongWait (tests shorten it).
	longWait time.Duration
	// given names, per setting, the option that set it in the list being
	// applied: a second option for the same setting in one list is a
	// contradiction (WithLease and WithFixedLease, say), not "last wins".
	given [numSettings]string
}

// setting is what an option sets; WithObserver adds and is not one.
type setting uint8

const (
	setLease setting = iota // WithLease, WithFixedLease
	setMaxHold
	setWaitLimit
	setLiveness
	setReplicaSync
	setPrefix
	setLogger
	setHolder
	numSettings
)

var settingNames = [numSettings]string{"the lease", "the max hold", "the wait limit", "the liveness", "replica sync",
	"the key prefix", "the logger", "the holder id"}

// set records that the option desc sets s, or refuses a second option
// for s in the same list.
func (c *config) set(s setting, desc string) error {
	if prev := c.given[s]; prev != "" {
		return invalidOption("%s and %s both set %s; pass one of them", prev, desc, settingNames[s])
	}
	c.given[s] = desc
	return nil
}

func defaultConfig() config {
	return config{
		prefix:       DefaultPrefix,
		lease:        DefaultLease,
		leaseArg:     DefaultLease.Milliseconds(),
		liveness:     DefaultLiveness,
		waitLimit:    DefaultWaitLimit,
		waitLimitErr: waitLimitErr(DefaultWaitLimit),
		logger:       slog.New(slog.DiscardHandler),
		longWait:     LongWait,
	}
}

func (c *config) applyClient(opts []ClientOption) error {
	c.given = [numSettings]string{}
	for _, o := range opts {
		if o == nil {
			return invalidOption("New: nil ClientOption")
		}
		if err := o.applyClient(c); err != nil {
			return err
		}
	}
	return c.finish()
}

func (c *config) applyLock(opts []LockOption) error {
	c.given = [numSettings]string{}
	for _, o := range opts {
		if o == nil {
			return invalidOption("nil LockOption")
		}
		if err := o.applyLock(c); err != nil {
			return err
		}
	}
	return c.finish()
}

// finish derives the values made once per config rather than per call.
func (c *config) finish() error {
	c.leaseArg = c.lease.Milliseconds()
	c.modeArgs = modeArgs(c.liveness, grantLease(c))
	c.waitLimitErr = waitLimitErr(c.waitLimit)
	return nil
}

func waitLimitErr(d time.Duration) error {
	// No "fence:" prefix: it is the cause inside ErrNotAcquired's message.
	return fmt.Errorf("wait limit %v reached: %w", d, context.DeadlineExceeded)
}

func checkLease(what string, d time.Duration) error {
	if d < MinLease {
		return invalidOption("%s(%v): a lease must be at least %v", what, d, MinLease)
	}
	return nil
}

// WithPrefix sets the prefix of every key (default "fence:"). It must not
// be empty, nor contain '{' or '}' (the lock name is the keys' hash tag),
// and it follows the rules of names: valid UTF-8, no control characters.
//
// An empty prefix is refused rather than allowed: the keys would be
// "{<name>}" and "{<name>}:seq", among the application's own keys, where
// an operator (or fencectl's listing, which scans for the prefix) cannot
// tell locks apart and a lock could overwrite an application key that
// happens to have that form.
func WithPrefix(p string) ClientOption {
	return clientOnly(func(c *config) error {
		desc := fmt.Sprintf("WithPrefix(%q)", p)
		switch {
		case p == "":
			return invalidOption("WithPrefix(\"\"): an empty prefix mixes lock keys with the application's; "+
				"keep the default %q or give a prefix of your own such as \"myapp:fence:\"", DefaultPrefix)
		case strings.ContainsAny(p, "{}"):
			return invalidOption("%s: a prefix must not contain '{' or '}', the lock name is the keys' hash tag", desc)
		}
		if why := textProblem(p); why != "" {
			return invalidOption("%s: the prefix %s; use printable UTF-8 text", desc, why)
		}
		if err := c.set(setPrefix, desc); err != nil {
			return err
		}
		c.prefix = p
		return nil
	})
}

// WithLease sets the watchdog lease (default 9 s, at least [MinLease]):
// the lock expires on the server one lease after the last renewal, and the
// watchdog renews it every lease/3 while the holder lives.
func WithLease(d time.Duration) Option {
	return both(func(c *config) error {
		if err := checkLease("WithLease", d); err != nil {
			return err
		}
		if err := c.set(setLease, fmt.Sprintf("WithLease(%v)", d)); err != nil {
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
		if err := c.set(setLease, fmt.Sprintf("WithFixedLease(%v)", d)); err != nil {
			return err
		}
		c.lease, c.fixed = d, true
		return nil
	})
}

// WithMaxHold bounds how long a lock may be held: at d after acquisition
// the watchdog stops renewing and the lock's context is cancelled with
// [ErrMaxHold], so a hung holder cannot keep a lock forever. 0 (default)
// means no limit; a limit is at least [MinLease].
func WithMaxHold(d time.Duration) Option {
	return both(func(c *config) error {
		switch {
		case d < 0:
			return invalidOption("WithMaxHold(%v): must be positive, or 0 for no limit", d)
		case d > 0 && d < MinLease:
			return invalidOption("WithMaxHold(%v): a max hold must be at least %v (MinLease), or 0 for no limit", d, MinLease)
		}
		if err := c.set(setMaxHold, fmt.Sprintf("WithMaxHold(%v)", d)); err != nil {
			return err
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
		if err := c.set(setWaitLimit, fmt.Sprintf("WithWaitLimit(%v)", d)); err != nil {
			return err
		}
		c.waitLimit, c.waitLimitSet = d, true
		return nil
	})
}

// WithLiveness sets how long a waiter keeps its place in a lock's queue
// without a heartbeat (default [DefaultLiveness], at least [MinLease]).
// While Acquire waits, its client heartbeats every d/3 (with the
// renewals: one pipelined round trip per node per period); a waiter whose
// process died or was cut off is skipped once d passed since its last
// heartbeat, so it delays the others by at most d. A handover gives a
// watchdog-renewed lock a lease of min(lease, d) until its first renewal,
// so that a handover to a waiter that died since its last heartbeat
// holds the lock for at most d too. A waiter alive but cut off for longer
// than d loses its place and joins the queue again at the tail.
func WithLiveness(d time.Duration) Option {
	return both(func(c *config) error {
		if d < MinLease {
			return invalidOption("WithLiveness(%v): a liveness must be at least %v (MinLease)", d, MinLease)
		}
		if err := c.set(setLiveness, fmt.Sprintf("WithLiveness(%v)", d)); err != nil {
			return err
		}
		c.liveness = d
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
		if err := c.set(setReplicaSync, fmt.Sprintf("WithReplicaSync(%d, %v)", replicas, timeout)); err != nil {
			return err
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
		if err := c.set(setLogger, "WithLogger"); err != nil {
			return err
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
			return invalidOption("WithObserver(%T): it implements none of AcquireObserver, WaitObserver, LongWaitObserver, RenewObserver, LossObserver, ReleaseObserver", o)
		}
		c.observers = append(c.observers[:len(c.observers):len(c.observers)], o)
		return nil
	})
}

// WithHolder sets the holder id stored with the lock (default: one that
// names the process and is new per acquisition, "<host>:<pid>:<random>",
// the host name's first label cut to 32 bytes, 64 random bits in 11
// characters of base64url; at most 52 bytes). An id names one holder: an
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
		if why := textProblem(id); why != "" {
			return invalidOption("WithHolder(%q): the id %s; use printable UTF-8 text (encode binary ids, e.g. in hex)", id, why)
		}
		if err := c.set(setHolder, fmt.Sprintf("WithHolder(%q)", id)); err != nil {
			return err
		}
		c.holder = id
		return nil
	})
}
