package fence

import "time"

// SetHost makes the default holder ids of this test binary name host (as
// os.Hostname would give it) until the returned func restores them. Call
// it before the clients that use it start.
func SetHost(host string) (restore func()) {
	prev := processPart
	processPart = hostPart(host) + processPart[len(hostPart(hostname())):]
	return func() { processPart = prev }
}

// HostPart is how a default holder id carries a host name.
func HostPart(host string) string { return hostPart(host) }

// WithLongWait makes a client's (or a call's) waits report after d
// instead of LongWait.
func WithLongWait(d time.Duration) Option {
	return both(func(c *config) error { c.longWait = d; return nil })
}
