package outbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is what a Relay needs of Postgres: *pgxpool.Pool and *pgx.Conn
// satisfy it. A Relay uses it from one goroutine at a time, and sends
// every statement unnamed (pgx.QueryExecModeExec), so any address works,
// a transaction pooler such as PgBouncer included.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// acquirer is what WithListen needs: a connection of its own.
type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Relay delivers the effects recorded in fencelock.outbox: it claims due
// rows, hands each to its Sender, and deletes the rows delivered. Any
// number of relays, in any number of processes, may serve one database;
// each row is sent by one of them at a time (see the package
// documentation for what is promised).
type Relay struct {
	db     DB
	sender Sender
	cfg    relayConfig
	obs    observers
	wake   chan struct{}
	stats  relayCounters
	busy   atomic.Bool
}

// RelayStats counts what a relay did since it was made.
type RelayStats struct {
	// Claimed is the rows claimed (attempts started).
	Claimed uint64
	// Sent is the deliveries the Sender accepted (Send returned nil).
	Sent uint64
	// Failed is the attempts that failed and will be retried.
	Failed uint64
	// Dead is the rows marked dead: out of attempts, or refused for good.
	Dead uint64
	// Superseded is the deliveries the receiver refused as stale (409),
	// whose rows were deleted.
	Superseded uint64
	// AlreadyApplied is the deliveries the receiver had applied before
	// (Send returned guard.ErrAlreadyApplied), whose rows were deleted.
	AlreadyApplied uint64
}

type relayCounters struct {
	claimed, sent, failed, dead, superseded, alreadyApplied atomic.Uint64
}

// NewRelay returns a relay that delivers the effects in db's
// fencelock.outbox through sender. It does nothing until Run.
func NewRelay(db DB, sender Sender, opts ...RelayOption) (*Relay, error) {
	if db == nil {
		return nil, ErrNilDB
	}
	if sender == nil {
		return nil, ErrNilSender
	}
	cfg, err := newRelayConfig(opts)
	if err != nil {
		return nil, err
	}
	if _, ok := db.(acquirer); cfg.listen && !ok {
		return nil, invalid("WithListen needs a DB with connections of its own (*pgxpool.Pool), not %T", db)
	}
	return &Relay{db: db, sender: sender, cfg: cfg, obs: newObservers(cfg.observers), wake: make(chan struct{}, 1)}, nil
}

// Stats returns what the relay did so far.
func (r *Relay) Stats() RelayStats {
	return RelayStats{
		Claimed: r.stats.claimed.Load(), Sent: r.stats.sent.Load(), Failed: r.stats.failed.Load(),
		Dead: r.stats.dead.Load(), Superseded: r.stats.superseded.Load(), AlreadyApplied: r.stats.alreadyApplied.Load(),
	}
}

// Wake makes a running relay look for due rows now instead of at its next
// poll. Add wakes every relay of the process when the transaction
// commits; Wake is for effects recorded some other way (raw SQL).
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// MaxRedeliveryDelay is the longest time, while relays run, between the
// first attempt at an effect and its last one with this relay's options:
// every attempt's visibility timeout and poll interval, plus every
// backoff at its longest. A receiver that deduplicates by key must keep
// keys at least this long (pgfence's Prune with an age above it), or a
// redelivery after it may be applied again. Requeued dead rows start a
// new series of attempts.
func (r *Relay) MaxRedeliveryDelay() time.Duration {
	c := r.cfg
	total := time.Duration(c.maxAttempts-1) * (c.visibility + c.poll)
	for i := 1; i < c.maxAttempts; i++ {
		total += c.backoff(i)
	}
	return total
}

// backoff is the longest delay after the attempt-th failed attempt.
func (c *relayConfig) backoff(attempt int) time.Duration {
	d := c.minBackoff
	for i := 1; i < attempt && d < c.maxBackoff; i++ {
		d *= 2
	}
	return min(d, c.maxBackoff)
}

// jittered draws a delay between half and all of d.
func jittered(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d-d/2+1)
}

// Run delivers effects until ctx ends, then stops claiming, lets the
// sends in flight finish (each within the send timeout), records their
// outcomes and returns nil; a claim or a record under way when ctx ends
// is finished first (each within a timeout of its own), so a relay
// stopped while the database answers leaves no row claimed. While the
// database hangs, Run returns at most 20 s plus the longer of 10 s and
// the send timeout + 1 s after ctx ends (31 s at the default send
// timeout): a claim in flight (10 s), then the record of the outcomes
// gathered (10 s) while the sends still running finish (each within the
// send timeout + 1 s of its start), then a last record (10 s). Give an
// orchestrator's termination grace period at least that. It returns
// an error at once when the database cannot serve a relay (the fencelock
// schema, or its outbox migration, is missing; the role lacks USAGE on
// the schema or EXECUTE on the outbox functions: the error, matching
// guard.ErrPermission, names the GRANT); any other trouble (the database
// restarting, unreachable, read-only) is logged, reported to the
// observers and waited through, polling with backoff. A privilege lost
// after start-up (a REVOKE) is that kind of trouble: Run goes on polling,
// so that it delivers again as soon as the schema's owner runs the GRANT,
// without a restart, and effects recorded meanwhile wait in the outbox;
// the refusal, worded as at start-up, is logged at Error once per change
// and reported to the observers at every failed attempt (ErrorEvent.Err
// matches guard.ErrPermission). A Relay runs once at a time.
func (r *Relay) Run(ctx context.Context) error {
	if !r.busy.CompareAndSwap(false, true) {
		return errors.New("outbox: Relay.Run is already running; make another Relay for another loop")
	}
	defer r.busy.Store(false)
	if err := r.ready(ctx); err != nil {
		return err
	}
	register(r)
	defer unregister(r)
	l := &loop{Relay: r, octx: context.WithoutCancel(ctx), results: make(chan result, r.cfg.concurrency),
		listenErrs: make(chan ErrorEvent)}
	lctx, stopListen := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if r.cfg.listen {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.listen(lctx, l.listenErrs)
		}()
	}
	l.run(ctx)
	stopListen()
	wg.Wait()
	return nil
}

// ready checks once that the database has the schema this fencelock
// needs (read from the catalog, as the stores check it: the same error,
// matching guard.ErrSchemaMissing, with the same fix) and that the relay
// may use the outbox, waiting through errors that are not about that.
func (r *Relay) ready(ctx context.Context) error {
	var wait time.Duration
	for failures := 1; ; failures++ {
		err := checkSchema(ctx, r.db)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, guard.ErrSchemaMissing), errors.Is(err, guard.ErrPermission):
			return err
		case ctx.Err() != nil:
			return nil // stopped while checking: not the database's trouble
		}
		wait = min(max(2*wait, r.cfg.poll), 5*time.Second)
		r.cfg.logger.WarnContext(ctx, "outbox: relay waiting for the database", "err", describe(err), "retry_in", wait)
		r.obs.onError(context.WithoutCancel(ctx), ErrorEvent{Op: OpReady, Err: describe(err), Failures: failures})
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

type rowScanner interface{ Scan(dest ...any) error }

func (r *Relay) queryRow(ctx context.Context, sql string, args ...any) rowScanner {
	rows, err := r.db.Query(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...)
	if err != nil {
		return errRow{err}
	}
	return pgxRow{rows}
}

type errRow struct{ err error }

func (e errRow) Scan(...any) error { return e.err }

type pgxRow struct{ rows pgx.Rows }

func (p pgxRow) Scan(dest ...any) error {
	defer p.rows.Close()
	if !p.rows.Next() {
		if err := p.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := p.rows.Scan(dest...); err != nil {
		return err
	}
	p.rows.Close()
	return p.rows.Err()
}

// listen wakes the relay on every NOTIFY fencelock_outbox, reconnecting
// with backoff; polling goes on meanwhile. Its failures go to the loop on
// errs, which reports them to the observers: observers are called from
// the loop only.
func (r *Relay) listen(ctx context.Context, errs chan<- ErrorEvent) {
	pool := r.db.(acquirer)
	var wait time.Duration
	failures := 0
	for ctx.Err() == nil {
		err := func() error {
			pc, err := pool.Acquire(ctx)
			if err != nil {
				return err
			}
			// The connection leaves the pool: it keeps listening.
			conn := pc.Hijack()
			defer conn.Close(context.WithoutCancel(ctx))
			if _, err := conn.Exec(ctx, "LISTEN fencelock_outbox"); err != nil {
				return err
			}
			wait, failures = 0, 0
			r.Wake() // what was committed while no one listened
			for {
				if _, err := conn.WaitForNotification(ctx); err != nil {
					return err
				}
				r.Wake()
			}
		}()
		if ctx.Err() != nil {
			return
		}
		wait = min(max(2*wait, 100*time.Millisecond), 5*time.Second)
		failures++
		r.cfg.logger.WarnContext(ctx, "outbox: relay's LISTEN connection failed; polling meanwhile", "err", err, "retry_in", wait)
		select {
		case errs <- ErrorEvent{Op: OpListen, Err: err, Failures: failures}:
		case <-ctx.Done():
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// result is the outcome of one send.
type result struct {
	d     Delivery
	claim int64
	err   error
	took  time.Duration
	// outcome is what handle made of err.
	outcome DeliveryOutcome
	// until is when the claim expires: an ack that could not be recorded
	// is retried until then, and then left to the next claim.
	until time.Time
}

// loop is one Run: the only goroutine that talks to the database (but for
// WithListen's connection) and the only one that calls the observers.
// Sends run in goroutines of their own and report on results.
type loop struct {
	*Relay
	// octx is what observers get: Run's ctx without its cancellation.
	octx    context.Context
	results chan result
	// listenErrs carries the failures of WithListen's connection, for the
	// loop to report.
	listenErrs chan ErrorEvent
	inflight   int
	acks       []result // delivered, already applied or superseded: delete
	fails      []result // failed: retry or dead
	after      string   // the last ordered resource claimed, where the next claim starts
	dbErrs     int
	dbLogged   time.Time
	// denied is the server's message of the refusal last logged, "" when
	// the trouble (if any) is another.
	denied string
}

const (
	shutdownTimeout = 10 * time.Second
	// recordTimeout bounds each claim and each flush of outcomes. Run's
	// doc states the stop bound it makes: change both together.
	recordTimeout = 10 * time.Second
	maxErrorLen   = 1000
)

// ackLinger is how long a delivery's ack may wait for others to share its
// statement.
const ackLinger = 5 * time.Millisecond

func (l *loop) run(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	defer linger.Stop()
	// Claims and acks go in batches: a claim waits until half a batch of
	// sends has finished (or none runs), an ack until half a batch of
	// outcomes is there (or none runs, or ackLinger has passed), instead of
	// one statement per send.
	size := min(l.cfg.batch, l.cfg.concurrency)
	half := max(size/2, 1)
	due, lingering := true, false
	for {
		l.drain()
		switch pending := len(l.acks) + len(l.fails); {
		case pending == 0:
		case pending >= half || l.inflight == 0 || ctx.Err() != nil:
			l.flush(ctx)
			linger.Stop()
			lingering = false
		case !lingering:
			linger.Reset(ackLinger)
			lingering = true
		}
		if ctx.Err() != nil {
			break
		}
		// Outcomes not yet recorded hold their slot too: a relay never
		// holds more than its concurrency of rows sent or being sent and
		// not recorded, which is what its death can make go out twice.
		if free := l.cfg.concurrency - l.inflight - len(l.acks) - len(l.fails); due && free > 0 && (free >= half || l.inflight == 0) {
			want := min(l.cfg.batch, free)
			n, err := l.claim(ctx, want)
			switch {
			case err != nil:
				due = false
				timer.Reset(l.dbTrouble(OpClaim, err))
			default:
				l.dbFine()
				// A full batch means there may be more: claim again as
				// soon as there is room.
				due = n == want
				if !due {
					timer.Reset(jittered(l.cfg.poll))
				}
			}
		}
		select {
		case res := <-l.results:
			l.handle(res)
		case <-linger.C:
			l.flush(ctx)
			lingering = false
		case <-l.wake:
			due = true
		case e := <-l.listenErrs:
			l.obs.onError(l.octx, e)
		case <-timer.C:
			due = true
		case <-ctx.Done():
		}
	}
	// Stopping: no more claims; the sends in flight finish within their
	// timeout, and their outcomes are recorded.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.sendTimeout+shutdownTimeout)
	defer cancel()
	for l.inflight > 0 {
		select {
		case res := <-l.results:
			l.handle(res)
		case <-dctx.Done():
			l.cfg.logger.Warn("outbox: relay stopped with sends still running; their rows are claimed again after the visibility timeout", "sends", l.inflight)
			l.inflight = 0
		}
	}
	l.flush(dctx)
}

// dbTrouble reports a database error to the observers, logs it (the
// first, then every 30 s while it lasts) and returns how long to wait
// before trying again. A refused privilege (a grant revoked after
// start-up) is worded as at start-up and logged at Error once per change
// (a REVOKE does not mend itself, but the owner's GRANT does, without a
// restart: the loop keeps polling).
func (l *loop) dbTrouble(op Op, err error) time.Duration {
	l.dbErrs++
	err = describe(relayDenied(l.octx, l.db, opDoing[op], err))
	l.obs.onError(l.octx, ErrorEvent{Op: op, Err: err, Failures: l.dbErrs})
	switch refusal, _ := pgcore.From(err); {
	case errors.Is(err, guard.ErrPermission):
		// Once per refusal, whichever statement meets it (a claim, a
		// record).
		if refusal.Message != l.denied {
			l.denied = refusal.Message
			l.cfg.logger.ErrorContext(l.octx, "outbox: relay refused by the database; polling until the grant is back", "err", err, "failures", l.dbErrs)
		}
	case l.dbErrs == 1 || l.denied != "" || time.Since(l.dbLogged) > 30*time.Second:
		l.dbLogged, l.denied = time.Now(), ""
		l.cfg.logger.WarnContext(l.octx, "outbox: relay cannot "+opDoing[op]+"; retrying", "err", err, "failures", l.dbErrs)
	}
	return jittered(min(l.cfg.poll<<min(l.dbErrs, 10), 5*time.Second))
}

// opDoing says what an Op of the loop does, for its log lines.
var opDoing = map[Op]string{OpClaim: "claim", OpAck: "record deliveries", OpRetry: "record failed attempts"}

func (l *loop) dbFine() {
	if l.dbErrs > 0 {
		l.cfg.logger.InfoContext(l.octx, "outbox: relay reaches the database again", "failures", l.dbErrs)
		l.dbErrs, l.denied = 0, ""
	}
}

// drain takes the outcomes that are already there.
func (l *loop) drain() {
	for {
		select {
		case res := <-l.results:
			l.handle(res)
		default:
			return
		}
	}
}

func (l *loop) handle(res result) {
	l.inflight--
	err := res.err
	res.outcome = l.cfg.outcome(err, res.d.Attempt)
	switch res.outcome {
	case Delivered:
		l.stats.sent.Add(1)
		l.acks = append(l.acks, res)
	case AlreadyApplied:
		l.stats.alreadyApplied.Add(1)
		l.cfg.logger.Debug("outbox: delivery already applied at the receiver, row deleted", "id", res.d.ID, "key", res.d.Key, "attempt", res.d.Attempt)
		l.acks = append(l.acks, res)
	case Superseded:
		l.stats.superseded.Add(1)
		l.cfg.logger.Info("outbox: delivery superseded at the receiver, row deleted", "id", res.d.ID, "resource", res.d.Resource, "token", res.d.Token, "key", res.d.Key, "err", err)
		l.acks = append(l.acks, res)
	case Dead:
		l.stats.dead.Add(1)
		l.cfg.logger.Warn("outbox: delivery failed for good, row marked dead (fencectl outbox list --dead; requeue to try again)",
			"id", res.d.ID, "resource", res.d.Resource, "key", res.d.Key, "destination", RedactDestination(res.d.Destination), "attempt", res.d.Attempt, "err", err)
		l.fails = append(l.fails, res)
	default:
		l.stats.failed.Add(1)
		l.cfg.logger.Debug("outbox: delivery failed, will retry", "id", res.d.ID, "key", res.d.Key, "attempt", res.d.Attempt, "err", err)
		l.fails = append(l.fails, res)
	}
	d := &res.d
	l.obs.onDelivery(l.octx, DeliveryEvent{ID: d.ID, Resource: d.Resource, Token: d.Token, Holder: d.Holder,
		Destination: d.Destination, Key: d.Key, Attempt: d.Attempt, Recorded: d.Recorded,
		Outcome: res.outcome, Duration: res.took, Err: err})
}

// flush records the outcomes gathered so far: deletes the rows sent and
// reschedules or buries the failed ones, each only if its claim still
// holds it. What cannot be recorded now is tried again at the next flush,
// until its claim expires.
//
// A record is not cut short by the relay's stop: ctx's cancellation does
// not reach its statements (each is bounded by recordTimeout instead), so
// a relay stopped while it records finishes the record, rather than
// leaving the rows to their visibility timeout and reporting its own stop
// as database trouble.
func (l *loop) flush(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	if len(l.acks) > 0 {
		claims, ids := make([]int64, len(l.acks)), make([]int64, len(l.acks))
		for i, a := range l.acks {
			claims[i], ids[i] = a.claim, a.d.ID
		}
		start := time.Now()
		var changed int
		if err := l.queryRow(ctx, `SELECT fencelock.outbox_ack($1, $2)`, claims, ids).Scan(&changed); err != nil {
			l.acks = l.unexpired(l.acks)
			l.dbTrouble(OpAck, err)
		} else {
			l.obs.onRecord(l.octx, RecordEvent{Op: OpAck, Outcomes: len(ids), Changed: changed, Duration: time.Since(start)})
			l.acks = l.acks[:0]
		}
	}
	if len(l.fails) > 0 {
		n := len(l.fails)
		claims, ids, errs, delays, dead := make([]int64, n), make([]int64, n), make([]string, n), make([]int64, n), make([]bool, n)
		for i, f := range l.fails {
			claims[i], ids[i], errs[i] = f.claim, f.d.ID, oneLine(f.err.Error(), maxErrorLen)
			dead[i] = f.outcome == Dead
			if !dead[i] {
				delays[i] = jittered(l.cfg.backoff(f.d.Attempt)).Milliseconds()
			}
		}
		start := time.Now()
		var changed int
		if err := l.queryRow(ctx, `SELECT fencelock.outbox_retry($1, $2, $3, $4, $5)`, claims, ids, errs, delays, dead).Scan(&changed); err != nil {
			l.fails = l.unexpired(l.fails)
			l.dbTrouble(OpRetry, err)
		} else {
			l.obs.onRecord(l.octx, RecordEvent{Op: OpRetry, Outcomes: n, Changed: changed, Duration: time.Since(start)})
			l.fails = l.fails[:0]
		}
	}
}

func (l *loop) unexpired(rs []result) []result {
	now := time.Now()
	kept := rs[:0]
	for _, r := range rs {
		if now.Before(r.until) {
			kept = append(kept, r)
		}
	}
	return kept
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > max {
		s = s[:max]
	}
	return s
}

// claim claims up to n due rows and starts their sends. It returns how
// many it claimed. Like a record, a claim is not cut short by the relay's
// stop: a claim cut short could commit on the server unseen, its rows then
// held by no one until their visibility timeout; finished, its rows are
// sent and recorded before Run returns.
func (l *loop) claim(ctx context.Context, n int) (int, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	claim := rand.Int64()
	start := time.Now()
	rows, err := l.db.Query(ctx, `SELECT id, resource, token, holder, destination, key, payload, headers, ordered, attempts, created_at
  FROM fencelock.outbox_claim($1, $2, $3 * interval '1 millisecond', $4)`,
		pgx.QueryExecModeExec, claim, n, l.cfg.visibility.Milliseconds(), l.after)
	if err != nil {
		return 0, err
	}
	var ds []Delivery
	for rows.Next() {
		var d Delivery
		var header map[string][]string
		if err := rows.Scan(&d.ID, &d.Resource, &d.Token, &d.Holder, &d.Destination, &d.Key, &d.Payload, &header,
			&d.Ordered, &d.Attempt, &d.Recorded); err != nil {
			rows.Close()
			return 0, err
		}
		d.Header = header
		ds = append(ds, d)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		// The claim's transaction did not commit: nothing is claimed.
		return 0, err
	}
	l.stats.claimed.Add(uint64(len(ds)))
	l.obs.onClaim(l.octx, ClaimEvent{Claimed: len(ds), Limit: n, Duration: time.Since(start)})
	until := start.Add(l.cfg.visibility)
	l.after = nextAfter(l.after, ds)
	for _, d := range ds {
		l.inflight++
		go l.send(d, claim, until)
	}
	return len(ds), nil
}

// nextAfter is where the next claim's walk over ordered resources starts:
// after the last resource this one reached, wrapping around.
func nextAfter(after string, ds []Delivery) string {
	var past, wrapped string
	for _, d := range ds {
		switch {
		case !d.Ordered:
		case d.Resource > after:
			past = max(past, d.Resource)
		default:
			wrapped = max(wrapped, d.Resource)
		}
	}
	switch {
	case wrapped != "":
		return wrapped
	case past != "":
		return past
	}
	return after
}

// send runs one Send, bounded by the send timeout even if the Sender
// ignores its context, with a panic counted as a failed attempt.
func (l *loop) send(d Delivery, claim int64, until time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.sendTimeout)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- fmt.Errorf("outbox: Sender panicked: %v", p)
			}
		}()
		done <- l.sender.Send(ctx, d)
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(l.cfg.sendTimeout + time.Second):
		err = fmt.Errorf("outbox: Send did not return within the send timeout (%v) and ignores its context; the relay moved on", l.cfg.sendTimeout)
	}
	l.results <- result{d: d, claim: claim, err: err, took: time.Since(start), until: until}
}
