package chaos

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver for goose
)

// Config describes a chaos run.
type Config struct {
	// Trials is the number of trials; each injects one fault.
	Trials int
	// Seed drives every random choice (fault order, victims, sizes, the
	// workers' choices). The same seed gives the same fault schedule;
	// thread timing still varies between runs.
	Seed int64
	// Guard selects fenced writes through guard.Exec (true) or plain
	// transactions under the lock (false: the control, which must fail).
	Guard bool
	// Cluster runs the trials against a Redis Cluster (3 masters with a
	// replica each) instead of one Redis; Kinds then default to
	// ClusterFaultKinds and Lease to 1s.
	Cluster bool
	// PartialCoverage sets cluster-require-full-coverage no: the healthy
	// masters keep answering while a dead one's slots have no master
	// (default: yes, as Redis, where the whole cluster answers CLUSTERDOWN
	// until the failover).
	PartialCoverage bool
	// StopAtViolation ends the run after the first trial with violations
	// (a control run needs only one).
	StopAtViolation bool
	// Kinds restricts the fault kinds (default: all of FaultKinds, or of
	// ClusterFaultKinds for a cluster run). Trials
	// cycle through a seeded shuffle of them, so every kind runs once per
	// len(Kinds) trials.
	Kinds []string
	// Workers per trial (default 3) and resources per trial (default 2).
	Workers   int
	Resources int
	// Contenders are worker processes added to every trial (default 2)
	// that contend for the same resources with short, random wait limits
	// (a quarter of a lease to two leases): they join and leave the locks'
	// queues while handovers race them, and do the same fenced work when
	// they get a lock. Negative: none.
	Contenders int
	// Lease is the lock lease (default 400ms).
	Lease time.Duration
	// BareLeases makes odd-numbered workers hand guard.Exec a bare lease
	// (name, token, holder) instead of the *fence.Lock: guard cannot then
	// stop a lost holder early, and the database's check alone stands
	// between a stale holder and a commit. Even workers always pass the
	// lock itself, as applications do.
	BareLeases bool
	// IdleTimeout, when set, makes the workers' stores end a guarded
	// transaction left idle that long (pgstore.WithIdleTimeout), so a
	// holder frozen mid-transaction stops blocking the next one.
	IdleTimeout time.Duration
	// WorkerCommand returns the command that starts one worker process
	// (the caller's own binary, re-executed); the suite adds WorkerEnv to
	// its environment and uses its stdin, stdout and stderr.
	WorkerCommand func() *exec.Cmd
	// Out receives the progress lines and the report (default os.Stdout).
	Out io.Writer
	// Verbose prints one line per trial.
	Verbose bool
}

func (c *Config) setDefaults() error {
	if c.Trials <= 0 {
		return errors.New("chaos: Trials must be > 0")
	}
	known := FaultKinds
	if c.Cluster {
		known = ClusterFaultKinds
	}
	if len(c.Kinds) == 0 {
		c.Kinds = known
	}
	for _, k := range c.Kinds {
		if !contains(known, k) {
			return fmt.Errorf("chaos: unknown fault kind %q for this topology (known: %v; cluster faults need Cluster)", k, known)
		}
	}
	if c.Workers <= 0 {
		c.Workers = 3
		if c.Cluster {
			// Two per resource (one per master): a waiter is there when a
			// failover hands the lock over, so takeover measures fence,
			// not when a busy worker happens to pick the resource.
			c.Workers = 6
		}
	}
	if c.Resources <= 0 {
		c.Resources = 2
	}
	switch {
	case c.Contenders == 0:
		c.Contenders = 2
	case c.Contenders < 0:
		c.Contenders = 0
	}
	if c.Lease <= 0 {
		c.Lease = 400 * time.Millisecond
		if c.Cluster {
			c.Lease = clusterLease
		}
	}
	if c.WorkerCommand == nil {
		return errors.New("chaos: WorkerCommand is required (re-execute the binary: see SelfCommand)")
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	return nil
}

// SelfCommand re-executes the running binary as a worker. A binary that
// uses it must call WorkerMain first thing when IsWorker() is true.
func SelfCommand() *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	return exec.Command(exe)
}

// env is the servers of a run, shared by its trials.
type env struct {
	redis   *testenv.Redis   // single-node runs
	cluster *testenv.Cluster // cluster runs
	pg      *testenv.Postgres
	dbURL   string
	admin   *pgxpool.Pool
}

const schema = `
CREATE TABLE IF NOT EXISTS chaos_register (
    resource text PRIMARY KEY,
    value    bigint NOT NULL DEFAULT 0,
    version  bigint NOT NULL DEFAULT 0  -- bumped by every write: the per-resource commit order
);
-- One row per committed write, written in the write's own transaction.
CREATE TABLE IF NOT EXISTS chaos_log (
    resource text   NOT NULL,
    version  bigint NOT NULL,
    kind     text   NOT NULL,
    token    bigint NOT NULL,
    op_id    text   NOT NULL,
    batch    bigint NOT NULL DEFAULT 0,
    value    bigint NOT NULL DEFAULT 0,
    worker   int    NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS chaos_log_res ON chaos_log (resource, kind);
-- Business rows. Deliberately no unique key on (resource, batch, item):
-- only fencing and idempotency keep duplicates out.
CREATE TABLE IF NOT EXISTS chaos_items (
    resource text   NOT NULL,
    batch    bigint NOT NULL,
    item     int    NOT NULL,
    token    bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS chaos_items_res ON chaos_items (resource);
`

func startEnv(ctx context.Context, cfg *Config) (*env, error) {
	e := &env{}
	var err error
	if cfg.Cluster {
		if e.cluster, err = startCluster(ctx, cfg.PartialCoverage); err != nil {
			return nil, err
		}
	} else if e.redis, err = testenv.StartRedis(); err != nil {
		return nil, err
	}
	if e.pg, err = testenv.StartPostgres(); err != nil {
		e.stop()
		return nil, err
	}
	if _, e.dbURL, err = e.pg.CreateDatabase(ctx); err != nil {
		e.stop()
		return nil, err
	}
	sqlDB, err := sql.Open("pgx", e.dbURL)
	if err != nil {
		e.stop()
		return nil, err
	}
	err = migrations.Up(ctx, sqlDB)
	_ = sqlDB.Close()
	if err != nil {
		e.stop()
		return nil, fmt.Errorf("chaos: migrations: %w", err)
	}
	if e.admin, err = pgxpool.New(ctx, e.dbURL); err != nil {
		e.stop()
		return nil, err
	}
	if _, err = e.admin.Exec(ctx, schema); err != nil {
		e.stop()
		return nil, fmt.Errorf("chaos: schema: %w", err)
	}
	return e, nil
}

func (e *env) stop() {
	if e.admin != nil {
		e.admin.Close()
	}
	if e.pg != nil {
		_ = e.pg.Stop()
	}
	if e.redis != nil {
		_ = e.redis.Stop()
	}
	if e.cluster != nil {
		_ = e.cluster.Stop()
	}
}

// proc is one worker process of a trial.
type proc struct {
	id         int
	cmd        *exec.Cmd
	stdin      io.WriteCloser
	done       chan struct{}             // closed when the process has exited and its output is read
	redisProxy *testenv.Proxy            // single-node runs
	nodeProxy  map[string]*testenv.Proxy // cluster runs: node address -> this worker's proxy to it
	pgProxy    *testenv.Proxy
	stderr     *lockedBuffer
	contender  bool // see Config.Contenders
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 64<<10 {
		return len(p), nil // enough to diagnose; do not grow without bound
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// trial is one fault against fresh resources and fresh worker processes.
type trial struct {
	n         int
	kind      string
	cfg       *Config
	env       *env
	rec       *Recorder
	resources []string
	seed      uint64

	mu     sync.Mutex
	procs  []*proc
	nextID int
}

func (t *trial) alive() []*proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*proc
	for _, p := range t.procs {
		select {
		case <-p.done:
		default:
			out = append(out, p)
		}
	}
	return out
}

// spawn starts one more worker with its own proxies to Redis and Postgres.
func (t *trial) spawn(ctx context.Context, contender bool) (*proc, error) {
	t.mu.Lock()
	id := t.nextID
	t.nextID++
	t.mu.Unlock()
	var rp *testenv.Proxy
	var nps map[string]*testenv.Proxy
	closeRedisSide := func() {
		if rp != nil {
			_ = rp.Close()
		}
		for _, np := range nps {
			_ = np.Close()
		}
	}
	var err error
	if t.env.cluster != nil {
		if nps, err = nodeProxies(t.env.cluster); err != nil {
			return nil, err
		}
	} else if rp, err = testenv.NewProxy(t.env.redis.Addr); err != nil {
		return nil, err
	}
	pp, err := testenv.NewProxy(t.env.pg.Addr)
	if err != nil {
		closeRedisSide()
		return nil, err
	}
	wc := workerConfig{
		ID: id, PGURL: "postgres://postgres@" + pp.Addr + "/" + dbName(t.env.dbURL) + "?sslmode=disable",
		Prefix: fmt.Sprintf("chaos%d:", t.n), Resources: t.resources, Lease: t.cfg.Lease, Guard: t.cfg.Guard,
		Seed: t.seed + uint64(id)*7919, Think: t.cfg.Lease / 10, OpsPerHold: 12, Items: 3,
		BareLease: t.cfg.BareLeases && id%2 == 1, IdleTimeout: t.cfg.IdleTimeout, Contender: contender,
	}
	if contender {
		wc.OpsPerHold = 3
	}
	if rp != nil {
		wc.RedisAddr = rp.Addr
	} else {
		wc.ClusterAddrs = t.env.cluster.Addrs()
		wc.NodeProxies = map[string]string{}
		for addr, np := range nps {
			wc.NodeProxies[addr] = np.Addr
		}
	}
	js, _ := json.Marshal(wc)
	cmd := t.cfg.WorkerCommand()
	// GORACE: a race-enabled worker would otherwise sleep a second at exit.
	cmd.Env = append(os.Environ(), WorkerEnv+"="+string(js), "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
	// The worker dies with us, whatever happens to this process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		closeRedisSide()
		_ = pp.Close()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		closeRedisSide()
		_ = pp.Close()
		return nil, err
	}
	p := &proc{id: id, cmd: cmd, stdin: stdin, done: make(chan struct{}), redisProxy: rp, nodeProxy: nps, pgProxy: pp,
		stderr: &lockedBuffer{}, contender: contender}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		closeRedisSide()
		_ = pp.Close()
		return nil, fmt.Errorf("chaos: start worker: %w", err)
	}
	go func() {
		t.rec.ReadFrom(id, stdout)
		_ = cmd.Wait()
		close(p.done)
	}()
	t.mu.Lock()
	t.procs = append(t.procs, p)
	t.mu.Unlock()
	return p, nil
}

// stopAll asks every worker to stop (stdin closed), kills the ones that do
// not within the grace period, and closes the proxies.
func (t *trial) stopAll() {
	t.mu.Lock()
	procs := append([]*proc(nil), t.procs...)
	t.mu.Unlock()
	for _, p := range procs {
		_ = p.stdin.Close()
	}
	deadline := time.After(3 * t.cfg.Lease)
	for _, p := range procs {
		select {
		case <-p.done:
		case <-deadline:
		}
	}
	for _, p := range procs {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		_ = p.pgProxy.Close()
		if p.redisProxy != nil {
			_ = p.redisProxy.Close()
		}
		for _, np := range p.nodeProxy {
			_ = np.Close()
		}
	}
}

func dbName(url string) string {
	// postgres://user@host:port/name?params
	s := url
	if i := lastIndexByte(s, '?'); i >= 0 {
		s = s[:i]
	}
	if i := lastIndexByte(s, '/'); i >= 0 {
		return s[i+1:]
	}
	return s
}

func lastIndexByte(s string, c byte) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// TrialResult is the outcome of one trial.
type TrialResult struct {
	N        int
	Kind     string
	Fault    Fault
	Ops      []Op
	DB       DBState
	Events   []Event
	Check    CheckResult
	Loss     []time.Duration // fault -> Lock.Context() cancellation, per affected holder
	Takeover []time.Duration // fault -> first committed write of a newer holder, per affected resource
	// LostElsewhere counts locks lost during a cluster fault on resources
	// the fault did not touch (other masters'): see lostElsewhere.
	LostElsewhere int
	Outcomes      map[Outcome]int
	Stderr        map[int]string
	BadLines      []string
	Err           error // the trial could not run (infrastructure); not a verdict
	Phases        []string
}

func (t *trial) run(ctx context.Context, rng *rand.Rand) TrialResult {
	res := TrialResult{N: t.n, Kind: t.kind}
	t0 := time.Now()
	phase := func(name string) {
		res.Phases = append(res.Phases, fmt.Sprintf("%s=%v", name, time.Since(t0).Round(10*time.Millisecond)))
	}
	if t.env.cluster != nil {
		// Back to a healthy cluster (the last trial's victim restarted),
		// and one resource per master.
		rs, err := t.prepareCluster(ctx)
		if err != nil {
			res.Err = err
			return res
		}
		t.resources = rs
		phase("cluster")
	} else {
		for j := 0; j < t.cfg.Resources; j++ {
			t.resources = append(t.resources, fmt.Sprintf("t%d-r%d", t.n, j))
		}
	}
	for _, r := range t.resources {
		if _, err := t.env.admin.Exec(ctx, `INSERT INTO chaos_register (resource) VALUES ($1) ON CONFLICT DO NOTHING`, r); err != nil {
			res.Err = fmt.Errorf("chaos: register row: %w", err)
			return res
		}
	}
	for i := 0; i < t.cfg.Workers+t.cfg.Contenders; i++ {
		if _, err := t.spawn(ctx, i >= t.cfg.Workers); err != nil {
			res.Err = err
			t.stopAll()
			return res
		}
	}
	// Wait until every worker is connected, so the fault meets work.
	L := t.cfg.Lease
	readyBy := time.Now().Add(15 * time.Second)
	for time.Now().Before(readyBy) {
		n := 0
		for _, e := range t.rec.Events() {
			if e.Type == evReady {
				n++
			}
		}
		if n >= t.cfg.Workers+t.cfg.Contenders {
			break
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
	phase("ready")
	// Cluster trials wait for the same times whatever the lease (a control
	// runs a long one): the fault's window matters, not the lease's.
	W := L
	if t.env.cluster != nil {
		W = clusterLease
	}
	sleepCtx(ctx, W+time.Duration(rng.Int64N(int64(W))))
	res.Fault = t.inject(ctx, t.kind, rng)
	phase("fault")
	// Recovery: long enough for the lock to expire and a new holder to
	// commit, so takeover can be measured.
	sleepCtx(ctx, 3*W)
	t.stopAll()
	phase("stopped")

	res.Events = t.rec.Events()
	res.BadLines = t.rec.BadLines()
	res.Ops = Ops(res.Events)
	res.Stderr = map[int]string{}
	for _, p := range t.procs {
		if s := p.stderr.String(); s != "" {
			res.Stderr[p.id] = s
		}
	}
	db, err := t.readDB(ctx)
	if err != nil {
		res.Err = err
		return res
	}
	res.DB = db
	res.Check = Check(res.Ops, db)
	res.Outcomes = map[Outcome]int{}
	for _, o := range res.Ops {
		res.Outcomes[o.Outcome]++
	}
	res.Loss, res.Takeover = measure(res.Fault, res.Events, db.Commits)
	res.LostElsewhere = lostElsewhere(res.Fault, res.Events, t.cfg.Lease)
	phase("checked")
	return res
}

func (t *trial) readDB(ctx context.Context) (DBState, error) {
	st := DBState{Values: map[string]int64{}}
	// The admin pool may have lost its connections to a Postgres restart;
	// retry briefly.
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if err = t.readDBOnce(ctx, &st); err == nil {
			return st, nil
		}
		st = DBState{Values: map[string]int64{}}
		sleepCtx(ctx, 250*time.Millisecond)
	}
	return st, fmt.Errorf("chaos: read database state: %w", err)
}

func (t *trial) readDBOnce(ctx context.Context, st *DBState) error {
	rows, err := t.env.admin.Query(ctx, `SELECT resource, version, kind, token, op_id, batch, value, worker,
		(extract(epoch from at) * 1e9)::bigint FROM chaos_log WHERE resource = ANY($1) ORDER BY resource, version`, t.resources)
	if err != nil {
		return err
	}
	for rows.Next() {
		var c Commit
		if err := rows.Scan(&c.Resource, &c.Version, &c.Kind, &c.Token, &c.OpID, &c.Batch, &c.Value, &c.Worker, &c.At); err != nil {
			rows.Close()
			return err
		}
		st.Commits = append(st.Commits, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = t.env.admin.Query(ctx, `SELECT resource, value FROM chaos_register WHERE resource = ANY($1)`, t.resources)
	if err != nil {
		return err
	}
	for rows.Next() {
		var r string
		var v int64
		if err := rows.Scan(&r, &v); err != nil {
			rows.Close()
			return err
		}
		st.Values[r] = v
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = t.env.admin.Query(ctx, `SELECT resource, batch, item, count(*) FROM chaos_items WHERE resource = ANY($1)
		GROUP BY resource, batch, item HAVING count(*) > 1`, t.resources)
	if err != nil {
		return err
	}
	for rows.Next() {
		var it ItemCount
		if err := rows.Scan(&it.Resource, &it.Batch, &it.Item, &it.Count); err != nil {
			rows.Close()
			return err
		}
		st.Items = append(st.Items, it)
	}
	rows.Close()
	return rows.Err()
}

// measure computes, for the holders the fault affected, how long until
// their lock's context was cancelled (loss detection) and how long until a
// newer holder committed on the same resource (takeover).
func measure(f Fault, events []Event, commits []Commit) (loss, takeover []time.Duration) {
	if f.At == 0 {
		return nil, nil
	}
	for _, h := range f.affected() {
		for _, e := range events {
			if e.At < f.At || e.Worker != h.Worker || e.Token != h.Token || e.Resource != h.Resource {
				continue
			}
			if e.Type == evLost {
				loss = append(loss, time.Duration(e.At-f.At))
				break
			}
			if e.Type == evRelease {
				break // released normally before noticing anything
			}
		}
		first := int64(0)
		for _, c := range commits {
			if c.Resource == h.Resource && c.Token > h.Token && c.At >= f.At && (first == 0 || c.At < first) {
				first = c.At
			}
		}
		if first > 0 {
			takeover = append(takeover, time.Duration(first-f.At))
		}
	}
	// A cluster fault's resource that no one held: takeover is how long
	// until anyone committed on it again (the node's slots usable again).
	for _, r := range f.Resources {
		heldAtFault := false
		for _, h := range f.Held {
			heldAtFault = heldAtFault || h.Resource == r
		}
		if heldAtFault {
			continue
		}
		first := int64(0)
		for _, c := range commits {
			if c.Resource == r && c.At >= f.At && (first == 0 || c.At < first) {
				first = c.At
			}
		}
		if first > 0 {
			takeover = append(takeover, time.Duration(first-f.At))
		}
	}
	return loss, takeover
}
