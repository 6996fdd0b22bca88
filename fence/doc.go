// Package fence is a Redis lock whose every acquisition returns a strictly
// increasing fencing token, with a watchdog that keeps the lease alive while
// the holder lives and a context that is cancelled the moment the lock is
// lost.
//
// A [Client] wraps a go-redis client ([RedisClient]: one server, a
// Sentinel failover client or a Cluster; a Ring is refused, see there).
// [Client.Acquire] waits for a lock in a queue kept in Redis, fair across
// processes: the holder's release hands the lock to the first waiter in
// the same script (see "Waiting"). [Client.TryAcquire] makes one attempt,
// and [Client.Do] acquires, runs a function and releases. The returned [Lock] carries its fencing token ([Lock.Token]):
// pass it with every write the lock protects, so that the storage can
// reject a holder whose lease ran out while it was paused (package guard
// does that for Postgres).
//
// # Options
//
// [New] takes [ClientOption]s, the acquisition calls take [LockOption]s.
// An [Option] is both: given to New it sets the client's default, given to
// an acquisition it overrides it for that call. Client-only options
// ([WithPrefix], [WithLogger], [WithObserver]) do not compile as lock
// options. A bad value is an error ([ErrInvalidOption]) from the call that
// got it.
//
// # Waiting
//
// [Client.Acquire] (and [Client.Do]) wait while another holder has the
// lock. The wait ends at the earlier of
//   - ctx's end (cancellation or deadline), and
//   - the wait limit: [WithWaitLimit]'s when it was given (to New or to the
//     call), else [DefaultWaitLimit], which applies only when ctx has no
//     deadline (so that a wait always ends).
//
// Both count from the call. The error then matches [ErrNotAcquired] and the
// reason: ctx's error, or for the wait limit an error that says so and
// matches [context.DeadlineExceeded]. A ctx that is done before the call
// sends nothing and fails the same way, for [Client.TryAcquire] too.
//
// The first attempt, when ctx cannot be cancelled (Background, values on
// it) and the limit is the client's, takes its end from a bound the
// client's calls of a moment share, rather than a timer of its own: it
// has the limit as its deadline (which dials and, with go-redis's
// ContextTimeoutEnabled, reads and writes keep to), and what waits on
// its Done (go-redis's pool, its retries' backoff) ends up to a 64th of
// the limit later (under a second of the default minute). A client limit
// under 640 ms is kept exactly.
//
// A waiter is in the name's queue in Redis, in arrival order among every
// process: the attempt that finds the lock held queues the caller in the
// same round trip. The holder's release hands the lock over in its own
// script: the first live waiter becomes the holder, with a token issued
// by the same rule as an acquisition's, and is told by a message on the
// name's channel; it holds the lock when the message arrives, with no
// round trip of its own. Every waiter heartbeats every liveness/3
// ([WithLiveness], default [DefaultLiveness]), in the watchdog's pipelined
// rounds (one round trip per node per period, shared with renewals), and
// a heartbeat that finds the lock handed to it takes it: a lost message
// (a pub/sub connection down, a Redis user without PUBLISH) costs at most
// one heartbeat period. When the lock frees without a handover (its
// holder's lease ran out, a version without the queue released it), the
// next call that touches the name (a heartbeat, the first waiter's poll at
// the holder's expiry, a TryAcquire) hands it to the first live waiter.
//
// A waiter whose process died or was cut off is skipped once its liveness
// deadline passes (its heartbeats move the deadline); a handover to a
// waiter that died since its last heartbeat lapses after min(lease,
// liveness), the lease it gets until its first renewal. Each call drops
// at most a few dead waiters at the head, so a call's work stays bounded
// however many died; the next call goes on. A wait that ends without the
// lock (ctx, the wait limit, Close) leaves the queue; a handover that
// raced its end is passed on at once. A queue whose waiters all died
// expires by itself, two liveness periods after the last heartbeat.
//
// On a cluster the channel is a sharded one in the name's slot, and each
// node has its own pub/sub connection whose commands are sent by a
// goroutine of that node: no lock is held across a network call, so a
// slow or unreachable node stalls only the waiters whose names it serves
// (their channels move to the promoted master after a failover; on
// Sentinel a probe finds a connection left on a demoted master). With
// [WithReplicaSync] a handed-over lock is confirmed before Acquire
// returns, by a renewal and WAIT on the waiter's own connection (WAIT
// counts only the writes of the connection it runs on, and the handover
// was written by the releaser's); too few acknowledgements pass the lock
// on and fail the call with a [*ReplicaSyncError].
//
// # Fairness and its cost
//
// There is no barging: while a live waiter queues, a free lock goes to it,
// not to a [Client.TryAcquire] or a new Acquire that comes later (that
// call hands it over instead). The cost: a newcomer never gets a lock that
// happens to be free while others queue, so under contention each
// handover goes to a waiter that may be slower to use it (the message's
// travel, its process's wake-up) than a caller already running would
// have been; and a dead waiter at the head delays the others by up to its
// liveness. There is no option to barge: fairness across processes holds
// only if every caller obeys the queue, and one caller that jumps it
// brings back the starvation the queue removes (the fastest re-acquirer
// winning again and again). Callers that need a lock at once, or not at
// all, use TryAcquire, which fails while others wait.
//
// # Holders
//
// Each acquisition stores a holder id with its token: by default one that
// names the process, new per call, "<host>:<pid>:<random>" (the host
// name's first label, cut to 32 bytes in its middle when longer; 64
// random bits), so that an operator who sees a lock held (fencectl locks
// list, a waiter's "still waiting" line) can find the process behind it.
// With [WithHolder], an acquisition by the holder that has
// the lock already gets that lock back (same token, lease restarted)
// instead of waiting: the retry after a lost reply, or a restarted process
// that kept its id. It is not re-entrancy (there is no count; one
// [Lock.Release] ends it), so an id must name one holder, never goroutines
// that must exclude each other.
//
// # Crashes and pauses
//
// With guard refusing a late writer, the lease buys pause tolerance, not
// safety, and it is also how long a crashed holder keeps the lock from
// the others: a process that dies without releasing (SIGKILL, a node
// lost) holds its lock until its lease runs out, at most one lease after
// its last renewal, and then the first waiter gets it (it polls at the
// holder's expiry). A holder survives a pause (GC, SIGSTOP, a VM freeze)
// that ends before its local deadline: at least 2/3 of the lease less
// the drift margin when the pause starts just before a renewal, up to
// the whole lease when it starts just after one. At the defaults (a 9 s
// lease, renewed every 3 s) a crashed holder's lock passes within 9 s and
// a holder survives any pause shorter than about 5.9 s. A longer lease
// (WithLease) buys a longer pause tolerance at the price of a longer wait
// after a crash; a waiter that has waited [LongWait] says who holds the
// lock and until when (at Info on the client's logger, and to a
// [LongWaitObserver]). Measured on one machine with a SIGKILLed holder
// process and a waiter in another, the holder killed at three phases of
// its renewals, and a holder SIGSTOPped just before a renewal was due:
// at a 30 s lease (the default before) the waiter got the lock 23.1 to
// 29.7 s after the kill, and a holder kept its lock through a 19.6 s
// pause, not a 20.2 s one; at the 9 s default, 6.7 to 8.7 s and 5.8 s
// kept, 6.2 s lost. (Figures of one machine; the bounds above are what
// the protocol guarantees.)
//
// # Loss
//
// The watchdog renews every held lock of a client every lease/3 (3 s at
// [DefaultLease]), in one
// pipelined round trip per Redis node. [Lock.Context] is cancelled, and
// [Lock.Err] says why, when:
//   - the holder calls [Lock.Release] ([ErrReleased]);
//   - a renewal finds the lock gone or held by someone else, renewals fail
//     until the local deadline [Lock.Deadline] passes, or a fixed lease
//     runs out (a [*LostError] matching [ErrLockLost], whose Reason says
//     which and, when known, who took over); the local deadline is the
//     start of the last successful renewal plus the lease minus a drift
//     margin of lease/100 + 2 ms, so the loss is signalled before the
//     server can have expired the lock;
//   - the max-hold limit passes ([ErrMaxHold], see [WithMaxHold]);
//   - the client is closed ([ErrClosed]).
//
// A lock that ended is forgotten by its client at once: locks left to
// expire cost the client nothing afterwards, and [Client.Close] releases
// only the locks still valid. A nil *Lock answers every method: getters
// return zero values, the others [ErrNotHeld].
//
// # Elections
//
// [Client.Election] returns a leader election on a name: [Election.Campaign]
// waits until its caller leads and returns the term, a [*Lock] of the
// election's name whose token is the term's fencing token. A term is a
// lock in every way: its context ([Lock.Context]) ends the moment the
// leadership does (resigned, lost, max hold, client closed), its token goes
// with the leader's writes, and package guard refuses the writes of a term
// that a later one superseded, whatever the old leader believes. Its
// Release resigns: the release script hands the term to the next
// candidate, who leads when the message arrives, with no lease-long gap.
// Candidates wait in the lock's queue, so they are served in the order they
// campaigned, across processes (see "Waiting").
//
// A term has a lease of its own, [DefaultTermLease] (5 s) unless the
// Election's options give [WithLease] (the client's lease does not apply),
// renewed every lease/3 by the watchdog while the leader lives. A leader
// that dies, pauses or is cut off loses its term when the lease runs out
// (its last renewal plus the lease), and the first candidate leads within
// that lease plus one heartbeat (liveness/3): it polls when the lease runs
// out, and heartbeats anyway. A campaign waits for as long as its context
// lets it (no default wait limit: a standby waits for the leader's end),
// through short outages and failovers; a candidate whose calls fail for a
// whole liveness period has lost its place in the queue, and its Campaign
// ends with an error matching [ErrNotAcquired] that names the last error.
// A Campaign returns only a term Redis granted it; after Redis lost its
// data a candidate joins the queue again, and its term's token is greater
// than every earlier one's (see "Tokens").
//
// The leader's value (an address, say, at most [MaxValueLen] bytes) is set
// by Campaign and changed by [Election.Proclaim], without a new term;
// [Election.Leader] reads the leader, its value and what is left of its
// lease. [Election.Observe] follows the election: the current state first,
// then every change in order, vacancies included, each a [LeaderEvent]
// with the holder, token and value. Every change is published by the
// script that makes it (a new term, a proclaim, a resignation), with the
// token of the term before and how it ended, so an observer needs no read
// and can tell that it saw every term. A term that expires is published by
// no one (Redis runs no script at an expiry): an observer reads the
// election when the term it knows would expire (its lease, then the TTL
// each read finds, since renewals move it), and reports the vacancy then,
// no later than the lease after the leader's last renewal; a candidate
// that takes the term after an expiry says so in the new term's record.
// An observer cut off from Redis says so (an event with Err) and, once it
// can read again, reports the state, marked Missed when terms may have
// come and gone unseen (a Redis restart without persistence, say).
// Observers of one election on one client share one subscription. A Redis
// user that may not SUBSCRIBE makes observers read the election every
// liveness/3 instead; one that may not PUBLISH (the leaders' user) leaves
// observers to learn of a change at their next read: when the term they
// know would have expired, or every term lease while they know of none.
// A term's beginning and end also
// reach the client's observers ([WithObserver]) as the acquisition,
// release and loss of the election's lock.
//
// An election is the lock of its name, plus two keys (see "Keys and
// scripts"); [Client.Acquire] of that name would compete with the
// candidates but change no record, so observers would not see it: use
// Campaign. Its scripts are the lock's with the election's lines made
// code, so plain locks pay nothing for elections.
//
// The shape is etcd's concurrency.Election (Campaign, Proclaim, Resign,
// Leader, Observe) over our [Lock], with three differences. Fencing: a
// term's token is checked by the database (package guard), so a leader
// that was paused past its lease cannot write over its successor, which
// neither etcd's Election nor client-go's leaderelection guarantee
// (client-go says in its documentation that it does not ensure a single
// acting leader; its leader-only work must watch the leader's context,
// as work under a term's [Lock.Context] does). Vacancies: Observe reports
// a resignation and an expiry, where etcd's Observe reports only the next
// leader. Lost connections: a candidate cut off from Redis ends its
// Campaign with an error, and an observer says it cannot see, where an
// etcd Campaign whose session expired may go on waiting and later report
// leadership without a lease.
//
// # Observing
//
// [WithObserver] takes any value that implements some of
// [AcquireObserver], [WaitObserver], [LongWaitObserver], [RenewObserver],
// [LossObserver] and [ReleaseObserver]; events carry a context with the
// values of the call they belong to. [WithLogger] logs renewal failures
// and losses, one line each, with the reason; warnings about the server's
// configuration, and the Info line of a wait longer than [LongWait], go
// to slog.Default() without it (see "Server configuration").
//
// # Tokens
//
// Tokens are max(counter + 1, Redis server time in µs), computed in the
// acquire script: they keep increasing when the counter key is lost
// (FLUSHALL, a restart without persistence, a failover to a replica that
// missed writes, eviction) as long as the server clock does not run
// backwards, and while the counter is kept they increase whatever the
// clock does. See queue.lua for the argument, and [Client.RaiseCounter]
// for the repair when both happened.
//
// # Errors
//
// Each message names its cause once, with one "fence:" prefix: a wait that
// ends says why it ended and, when it was riding out an outage, the last
// error it met ("last error: dial tcp ...: connection refused", so an
// outage is not read as contention); a call on a lock that ended says how
// it ended. The errors match the sentinels and types of [ErrNotAcquired]
// and its siblings with errors.Is and errors.As. Bad input — an unusable
// name, prefix or holder id, an option out of range, two options that set
// the same thing in one call — is refused with [ErrInvalidName] or
// [ErrInvalidOption] before anything is sent, with a message that says
// what to change.
//
// A refused login (WRONGPASS, NOAUTH) or command (NOPERM, or a command
// refused inside a script, which Redis does not name) keeps the server's
// words and ends with the fix: for a login, where the password goes (the
// client's Options.Username and Options.Password, or user:password@ in its
// URL), naming the user the client logs in as and never a password; for a
// command, the ACL SETUSER addition for that user (EVALSHA and EVAL
// together: fence sends EVAL after a script-cache miss) and a link to the
// whole ACL line fence needs. Such an error still matches the server's
// (errors.As a redis.Error, redis.IsAuthError, redis.IsPermissionError),
// and is not [ErrNotAcquired]: [Client.Acquire] returns it at once.
//
// # Keys and scripts
//
// Per lock name (a name is 1 to 512 bytes of UTF-8 without control
// characters, '{' or '}'; every key shares the hash tag {<name>}, so all
// live in one cluster slot and one script touches them):
//   - <prefix>{<name>}, the lock: a string "<token>:<holder>" (16 digits,
//     ':', the holder id: by default "<host>:<pid>:<random>", at most 52
//     bytes: the host part at most 32, the random part 11 characters of
//     base64url), present while the lock is held, with the lease as its
//     expiry;
//   - <prefix>{<name>}:seq, the token counter: a 16-digit string written
//     by every acquisition, expiring 30 days after the last one;
//   - <prefix>{<name>}:q, the queue: a list of the waiting holder ids, in
//     arrival order, present while someone waits;
//   - <prefix>{<name>}:w, the waiters: a hash from holder id to
//     "<deadline ms>:<grant lease ms>" (server clock), present while
//     someone waits; both queue keys expire two liveness periods after the
//     last heartbeat;
//   - <prefix>{<name>}:ch, the channel: no memory unless a waiter
//     subscribes; a channel stays subscribed about a second after its
//     client's last waiter left. A handover publishes
//     "grant:<server µs>:<token>:<holder>" (SPUBLISH on a cluster), a
//     release with nobody queued the released value.
//
// An election adds, for its name:
//   - <prefix>{<name>}:v, the record of the last term: a string
//     "<state><how>:<token>:<seq>:<prev>:<lease ms>:<holder length>:<holder><value>"
//     (state L leading, R resigned; prev the term before and how it
//     ended; see elect.lua), expiring 30 days after its last change, as
//     the counter;
//   - <prefix>{<name>}:cv, the candidates' values: a hash from holder id
//     to value while they wait, expiring with the queue;
//   - <prefix>{<name>}:ev, the channel of the records: every change of
//     the record is published whole (SPUBLISH on a cluster).
//
// So a held lock costs two short keys, each waiter a list entry and a hash
// field of about its holder id's length (under 200 bytes with a default
// id, a 63-character host name included), and every name used in the last
// 30 days one key (its counter): high-cardinality names (one lock per
// order, per user) add up.
//
// The scripts: acquire.lua (acquire, or queue, or a waiter's heartbeat),
// release.lua (release and hand over), leave.lua (a waiter leaves; a
// handover that raced it is passed on), renew.lua and raise.lua; for
// elections elect.lua (put in front of the first three, whose "--elect"
// lines it makes code), proclaim.lua and leader.lua (a read). The first
// three share queue.lua: the token rule, the queue, and the handover, so
// that an acquisition and a handover issue tokens by the same code. They
// exist twice, notifying with PUBLISH or (on a cluster) SPUBLISH, and each
// derives the channel from the lock's key: every argument and every
// command costs the server, and these run on every acquisition. An
// uncontended acquisition costs an EXISTS (the lock and its queue at
// once), a TIME and two SETs; its release a GET, an LPOP (nobody
// queued), a DEL and a PUBLISH.
//
// # Rolling upgrades
//
// Clients of versions before the queue (no :q and :w keys) and of this
// version can share a name during an upgrade. Holders never overlap: both
// versions take the lock only when its key is absent, and a handover
// replaces the releaser's own value within one script. Tokens keep
// increasing: one counter, one rule. What an old client does not do: it
// barges (takes a free lock whatever the queue holds), and its release
// hands nothing over; its release message, a plain one, makes this
// version's first waiter heartbeat at once and take the lock, and a
// handover's message wakes old waiters, which find the lock held and wait
// on. Fairness across processes therefore starts once every client runs
// this version.
//
// # Server configuration
//
// Under memory pressure an eviction policy may evict counters (they have
// an expiry) without breaking the tokens (the clock floor above), but it
// may also evict held locks, which their holders then lose while a
// competitor acquires at once. A Redis that serves locks should run with
// maxmemory-policy noeviction (the default) and enough memory.
//
// [New] checks this once per client: it reads INFO memory of every master
// in the background and, when a policy may evict lock keys, logs one
// warning naming the nodes and the command that fixes them. The check
// belongs to New rather than only to [Client.Inspect] and fencectl doctor
// because the operator who left an evicting policy in place is the one who
// does not run doctor: the warning must reach them without opt-in, so it
// goes to slog.Default() unless [WithLogger] names another logger. New has
// no context and must not block on the network, so the check runs in a
// goroutine of the client, bounded by a few seconds and waited for by
// [Client.Close]; a server that cannot be read (INFO denied, unreachable
// at start) is not reported there. [Client.Inspect] reports the policy of
// the node that holds a given lock ([LockInfo.Eviction]).
//
// The same logger, once per client each, gets the other warnings about
// what the server or the client allows: a Redis user that may not PUBLISH
// (with the ACL SETUSER line), one that may not SUBSCRIBE (the server's
// NOPERM and its fix), and a Redis that a waiting Acquire cannot reach at
// all: "Redis is unreachable while Acquire waits", with the error its
// calls met and what ends the wait (its context's deadline, its wait
// limit, or the default wait limit of a minute), since Acquire waits
// through an outage as through a failover, and without that line a wait
// would read as a held lock. A subscription that failed with the
// outage is part of it, not reported apart; it is made once Redis answers.
// A pub/sub connection that alone fails (killed, its redials refused)
// while the waiter's calls are answered is a subscription matter: "cannot
// subscribe to lock notifications", with its error.
//
// On a cluster, fence sends every call as a pipeline, which go-redis
// routes by the key's slot alone. go-redis's single-command path first
// loads the server's COMMAND table, once per client, from random nodes,
// replicas included, bounded only by the nodes' ReadTimeout and under a
// mutex every such call of the client waits on: a client whose first such
// call came while any node was stopped would hold up every call on every
// master, and a Redis user without COMMAND (the ACL line does not grant
// it) would pay refused round trips on every call. The slot map is read
// the same way, one node at a time, each for as long as its ReadTimeout:
// a reload that asks a stopped replica first stays stale that long, while
// the calls for a master that failed over go to the dead address, and a
// slot the map has no master for goes to a random node, a stopped
// replica perhaps. So fence bounds each slot-map read of a cluster
// client's nodes (half a second, after which the next node is asked; a
// slow network that fails six in a row gets one unbounded read), reads
// the map again itself after an error that says it may be stale, and
// sends no call to a node that was not a master of the last map it read:
// a stopped replica holds up no call of fence and costs no lock on
// another master. The bound reaches the node clients the cluster client
// makes after New and those of every map read since (a node client made
// before New that was in no map since, a seed that is not a cluster
// node, has none). A cluster client that reads from replicas
// (ReadOnly, RouteByLatency, RouteRandomly) looks every call up in that
// table, pipelines too: [New] warns about it once; give fence a
// *redis.ClusterClient of its own that reads from masters.
//
// The lock alone keeps workers from duplicating effort while the lease is
// valid; it cannot stop a paused holder's late write. Fencing tokens checked
// by the storage can.
package fence
