// Package fence is a Redis lock whose every acquisition returns a strictly
// increasing fencing token, with a watchdog that keeps the lease alive while
// the holder lives and a context that is cancelled the moment the lock is
// lost.
//
// A [Client] wraps a go-redis client. [Client.Acquire] waits for a lock
// (event-driven: it wakes on the holder's release message or when the lock's
// expiry passes), [Client.TryAcquire] makes one attempt, and [Client.Do]
// acquires, runs a function and releases. The returned [Lock] carries its
// fencing token ([Lock.Token]): pass it with every write the lock protects,
// so that the storage can reject a holder whose lease ran out while it was
// paused (package guard does that for Postgres).
//
// The watchdog renews every held lock of a client every lease/3, in one
// pipelined round trip per Redis node. [Lock.Context] is cancelled, and
// [Lock.Err] says why, when:
//   - the holder calls [Lock.Release] ([ErrReleased]);
//   - a renewal finds the lock gone or held by someone else, or renewals
//     fail until the local deadline [Lock.Deadline] passes ([ErrLockLost]);
//     the local deadline is the start of the last successful renewal plus
//     the lease minus a drift margin of lease/100 + 2 ms, so the loss is
//     signalled before the server can have expired the lock;
//   - the max-hold limit passes ([ErrMaxHold], see [WithMaxHold]);
//   - the client is closed ([ErrClosed]).
//
// Tokens are max(counter + 1, Redis server time in µs), computed in the
// acquire script: they keep increasing when the counter key is lost
// (FLUSHALL, a restart without persistence, a failover to a replica that
// missed writes), as long as the server clock does not run backwards.
//
// Keys: <prefix>{<name>} (the lock, a string "<token>:<holder>"),
// <prefix>{<name>}:seq (the counter) and the channel <prefix>{<name>}:ch,
// all in one cluster slot. A name must be 1 to 512 bytes without '{' or '}'.
//
// The lock alone keeps workers from duplicating effort while the lease is
// valid; it cannot stop a paused holder's late write. Fencing tokens checked
// by the storage can.
package fence
