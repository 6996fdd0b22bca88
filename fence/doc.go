// Package fence is a Redis lock whose every acquisition returns a strictly
// increasing fencing token, with a watchdog that keeps the lease alive while
// the holder lives and a context that is cancelled the moment the lock is
// lost.
package fence
