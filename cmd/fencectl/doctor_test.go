package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
)

// Doctor's golden tests run fencectl as a process against real servers set
// up healthy or broken, and compare its report, with what varies from run
// to run (addresses, versions, clocks, database names) replaced by
// placeholders, with testdata/doctor_*.golden. go test -run TestDoctor
// -update rewrites them.

var normalizers = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`Redis \d+\.\d+\.\d+`), "Redis VERSION"},
	{regexp.MustCompile(`PostgreSQL [^,]+,`), "PostgreSQL VERSION,"},
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`), "TIME"},
	{regexp.MustCompile(`, \S+ from this machine's`), ", SKEW from this machine's"},
	{regexp.MustCompile(`\(by [^)]*\)`), "(by AGE)"},
	{regexp.MustCompile(`\(\d+ acknowledged\)`), "(N acknowledged)"},
	{regexp.MustCompile(`\b\d+ of \d+ applied`), "N of N applied"},
	{regexp.MustCompile(`\b\d+_[\w-]+\.sql\b`), "MIGRATION.sql"},
	{regexp.MustCompile(`\b\d{10,}\b`), "BIGNUM"},
	{regexp.MustCompile(`server process(es)? \d+( and \d+)?`), "server process PID"},
	{regexp.MustCompile(`port \d+ was dialled, the server listens on \d+`), "port N was dialled, the server listens on M"},
	// How a missing migration reads depends on how many exist (the fixture
	// removes the newest from the version table): asserted separately.
	{regexp.MustCompile(`(?m)^(FAIL  migrations\s+).*\n(\s+fix: ).*$`), "${1}(MIGRATIONS)\n${2}(MIGRATIONS)"},
}

// normalize replaces the given literal strings, then the patterns above.
func normalize(out string, literals map[string]string) string {
	keys := make([]string, 0, len(literals))
	for k := range literals {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return len(keys[i]) > len(keys[j]) })
	for _, k := range keys {
		out = strings.ReplaceAll(out, k, literals[k])
	}
	for _, n := range normalizers {
		out = n.re.ReplaceAllString(out, n.with)
	}
	return out
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	goldenFile(t, "doctor_"+name+".golden", got, "TestDoctor")
}

// goldenFile compares got with testdata/file; -update rewrites it (the
// fix names the test that does).
func goldenFile(t *testing.T, file, got, test string) {
	t.Helper()
	path := filepath.Join("testdata", file)
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "no golden file: run go test ./cmd/fencectl -run %s -update", test)
	assert.Equal(t, string(want), got, "%s changed (if on purpose: go test ./cmd/fencectl -run %s -update)", file, test)
}

// verdicts counts the report's lines by verdict and check.
func verdicts(out string) map[string][]string {
	v := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "ok" || f[0] == "warn" || f[0] == "FAIL" || f[0] == "skip") {
			v[f[0]] = append(v[f[0]], f[1])
		}
	}
	return v
}

const (
	redisSecret = "r3dis-Pa55word"
	pgSecret    = "pg-Pa55word"
)

// redisWithUser adds an ACL user with a password and every permission, and
// returns its URL.
func redisWithUser(t *testing.T, r *testenv.Redis) string {
	t.Helper()
	require.NoError(t, r.Client().Do(ctxT(t), "ACL", "SETUSER", "ops", "on", ">"+redisSecret, "~*", "&*", "+@all").Err())
	return withPassword(t, r.URL, "ops", redisSecret)
}

// guardedResource takes a lock and records its token in the database, as a
// guarded writer does.
func guardedResource(t *testing.T, r *testenv.Redis, db *testenv.DB, name string) {
	t.Helper()
	ctx := ctxT(t)
	store, err := pgfence.New(db.Pool)
	require.NoError(t, err)
	locks := newLocks(t, r)
	l, err := locks.Acquire(ctx, name)
	require.NoError(t, err)
	require.NoError(t, store.Advance(ctx, l))
	require.NoError(t, l.Release(ctx))
}

func doctorLiterals(r *testenv.Redis, db *testenv.DB) map[string]string {
	m := map[string]string{}
	if r != nil {
		m[r.Addr] = "REDIS_ADDR"
		m[r.Prefix] = "PREFIX:"
	}
	if db != nil {
		m[db.Server.Addr] = "PG_ADDR"
		m[db.Name] = "DBNAME"
	}
	return m
}

func TestDoctorHealthy(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	db := migratedDB(t)
	guardedResource(t, r, db, "stock-sync:eu")
	redisURL := redisWithUser(t, r)
	dbURL := withPassword(t, db.URL, "postgres", pgSecret)

	code, out, errOut := fencectlProc(t, nil, "doctor", "--redis", redisURL, "--db", dbURL, "--prefix", r.Prefix)
	requireNoSecret(t, redisSecret, out, errOut)
	requireNoSecret(t, pgSecret, out, errOut)
	assert.Equal(t, exitOK, code, out+errOut)
	assert.Empty(t, errOut)
	assert.Empty(t, verdicts(out)["FAIL"])
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "ok") {
			assert.NotContains(t, line, "fix:", "an ok line has no fix")
		}
	}
	golden(t, "healthy", normalize(out, doctorLiterals(r, db)))

	// -o json: the same checks, machine-readable.
	code, out, _ = fencectlProc(t, nil, "doctor", "--redis", redisURL, "--db", dbURL, "--prefix", r.Prefix, "-o", "json")
	require.Equal(t, exitOK, code)
	requireNoSecret(t, redisSecret, out)
	var rep struct {
		Checks []finding `json:"checks"`
		Failed int       `json:"failed"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	assert.Zero(t, rep.Failed)
	assert.NotEmpty(t, rep.Checks)
	for _, c := range rep.Checks {
		if c.Verdict == verdictOK {
			assert.Empty(t, c.Fix, c.Check)
		}
	}
}

// The "done when": allkeys-lru, a token mark ahead of the counter
// and the clock, passwords in both URLs, a missing migration. One failing
// verdict each, exit 1, no password anywhere.
func TestDoctorMisconfigured(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := testenv.NewRedisServer(t, testenv.WithRedisArgs("--maxmemory-policy", "allkeys-lru"))
	db := migratedDB(t)
	guardedResource(t, r, db, "fine")
	// A mark far ahead of the Redis clock: as after a counter loss plus a
	// clock that ran backwards, or a database restored from another system.
	_, err := db.Pool.Exec(ctx, `INSERT INTO fencelock.fence (resource, token, holder) VALUES ('job', 9000000000000000, 'old')`)
	require.NoError(t, err)
	// The newest migration is missing from the version table.
	_, err = db.Pool.Exec(ctx, `DELETE FROM `+migrations.VersionTable+` WHERE version_id = (SELECT max(version_id) FROM `+migrations.VersionTable+`)`)
	require.NoError(t, err)
	redisURL := redisWithUser(t, r)
	dbURL := withPassword(t, db.URL, "postgres", pgSecret)

	code, out, errOut := fencectlProc(t, nil, "doctor", "--redis", redisURL, "--db", dbURL, "--prefix", r.Prefix)
	requireNoSecret(t, redisSecret, out, errOut)
	requireNoSecret(t, pgSecret, out, errOut)
	assert.Equal(t, exitFailed, code)
	assert.Empty(t, errOut)
	assert.ElementsMatch(t, []string{"redis.eviction", "migrations", "tokens"}, verdicts(out)["FAIL"], out)
	assert.Regexp(t, `FAIL  migrations .*(pending|records none)`, out)
	assert.Contains(t, out, "fix: fencectl tokens repair job")
	assert.Regexp(t, `fix: .*fencectl migrate up`, out)
	assert.Contains(t, out, "maxmemory-policy allkeys-lru")
	golden(t, "misconfigured", normalize(out, doctorLiterals(r, db)))
}

func TestDoctorNotInstalled(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	db := testenv.NewDB(t)
	code, out, errOut := fencectlProc(t, nil, "doctor", "--redis", r.Addr, "--db", db.URL, "--prefix", r.Prefix)
	assert.Equal(t, exitFailed, code, errOut)
	assert.Equal(t, []string{"migrations"}, verdicts(out)["FAIL"], out)
	golden(t, "not_installed", normalize(out, doctorLiterals(r, db)))
}

func TestDoctorUnreachable(t *testing.T) {
	t.Parallel()
	code, out, errOut := fencectlProc(t, nil, "doctor",
		"--redis", "redis://ops:"+redisSecret+"@127.0.0.1:1",
		"--db", "postgres://postgres:"+pgSecret+"@127.0.0.1:1/app?sslmode=disable", "--timeout", "5s")
	requireNoSecret(t, redisSecret, out, errOut)
	requireNoSecret(t, pgSecret, out, errOut)
	assert.Equal(t, exitFailed, code)
	assert.Empty(t, errOut)
	assert.Equal(t, []string{"redis", "postgres"}, verdicts(out)["FAIL"], out)
	golden(t, "unreachable", normalize(out, nil))
}

// A user without EVALSHA, as an application's restricted user: ACL DRYRUN is
// refused to it (not an admin), so doctor tries the commands themselves.
func TestDoctorACLProbe(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := testenv.NewRedisServer(t)
	require.NoError(t, r.Client().Do(ctx, "ACL", "SETUSER", "app", "on", ">"+redisSecret, "~*", "&*", "+@all", "-@admin", "-evalsha").Err())
	u := withPassword(t, r.URL, "app", redisSecret)
	code, out, errOut := fencectlProc(t, nil, "doctor", "--redis", u, "--prefix", "fence:")
	requireNoSecret(t, redisSecret, out, errOut)
	assert.Equal(t, exitFailed, code, errOut)
	assert.Equal(t, []string{"redis.acl"}, verdicts(out)["FAIL"], out)
	assert.Contains(t, out, "EVALSHA")
	golden(t, "acl_probe", normalize(out, doctorLiterals(r, nil)))
}

// An admin checks the application's user with --acl-user (ACL DRYRUN): a
// user without EVAL fails; one without PUBLISH and SUBSCRIBE only slows
// waiters down, a warning.
func TestDoctorACLDryRun(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := testenv.NewRedisServer(t)
	require.NoError(t, r.Client().Do(ctx, "ACL", "SETUSER", "app", "on", ">"+redisSecret, "~fence:*", "&fence:*", "+@all", "-eval", "-publish").Err())
	require.NoError(t, r.Client().Do(ctx, "ACL", "SETUSER", "quiet", "on", ">"+redisSecret, "~fence:*", "&fence:*", "+@all", "-publish", "-subscribe").Err())

	code, out, errOut := fencectlProc(t, nil, "doctor", "--redis", r.Addr, "--acl-user", "app")
	assert.Equal(t, exitFailed, code, errOut)
	assert.Equal(t, []string{"redis.acl"}, verdicts(out)["FAIL"], out)
	assert.Contains(t, out, `user "app" may not run what fence needs (ACL DRYRUN): EVAL (`)
	assert.Contains(t, out, "nor PUBLISH")
	golden(t, "acl_dryrun", normalize(out, doctorLiterals(r, nil)))

	code, out, errOut = fencectlProc(t, nil, "doctor", "--redis", r.Addr, "--acl-user", "quiet")
	assert.Equal(t, exitOK, code, errOut)
	assert.Contains(t, verdicts(out)["warn"], "redis.acl", out)
	assert.Contains(t, out, "a waiter learns of it at its next heartbeat")

	// Keys outside the user's pattern: ACL DRYRUN sees it too, as keys.
	code, out, _ = fencectlProc(t, nil, "doctor", "--redis", r.Addr, "--acl-user", "quiet", "--prefix", "other:")
	assert.Equal(t, exitFailed, code)
	assert.Contains(t, out, `user "quiet" may not use fence's keys (ACL DRYRUN): the keys other:* (--prefix), outside its key patterns ~fence:*; nor PUBLISH (`)
	assert.NotContains(t, out, "EVALSHA (", "a key refused is not a command refused")
}

// Doctor pointed at a replica fails; on the master it sees the replica and
// WAIT; a volatile policy without maxmemory warns; AOF is ok.
func TestDoctorReplication(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	master := testenv.NewRedisServer(t, testenv.WithAOF(), testenv.WithRedisArgs("--maxmemory-policy", "volatile-lru"))
	host, port, _ := strings.Cut(master.Addr, ":")
	replica := testenv.NewRedisServer(t, testenv.WithRedisArgs("--replicaof", host, port))
	require.Eventually(t, func() bool {
		info, err := master.Client().Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online")
	}, 30*time.Second, 50*time.Millisecond, "the replica never came online")

	code, out, errOut := fencectlProc(t, nil, "doctor", "--redis", master.Addr)
	assert.Equal(t, exitOK, code, out+errOut)
	assert.Contains(t, out, "1 replicas, WAIT works")
	assert.Equal(t, []string{"redis.eviction", "postgres", "tokens"}, verdicts(out)["warn"], out)
	golden(t, "master", normalize(out, doctorLiterals(master, nil)))

	code, out, _ = fencectlProc(t, nil, "doctor", "--redis", replica.Addr)
	assert.Equal(t, exitFailed, code)
	assert.Equal(t, []string{"redis.role"}, verdicts(out)["FAIL"], out)
	golden(t, "replica", normalize(out, map[string]string{replica.Addr: "REDIS_ADDR"}))
}

// nameOn returns a lock name whose key the given master serves.
func nameOn(t *testing.T, c *testenv.Cluster, master *testenv.ClusterNode, prefix string) string {
	t.Helper()
	ctx := ctxT(t)
	for i := 0; i < 1000; i++ {
		name := fmt.Sprintf("job-%d", i)
		m, err := c.MasterFor(ctx, lockKey(prefix, name))
		require.NoError(t, err)
		if m.Addr == master.Addr {
			return name
		}
	}
	t.Fatal("no name maps to the master")
	return ""
}

// On a two-master cluster (one replica each) fencectl follows MOVED (a name
// on the other master), repairs there, and doctor checks every master.
func TestCluster(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	c := testenv.NewRedisCluster(t, testenv.WithMasters(2), testenv.WithReplicas(1))
	nodes := c.Nodes // the two masters first, then their replicas
	db := migratedDB(t)
	far := nameOn(t, c, nodes[1], "fence:")
	_, err := db.Pool.Exec(ctx, `INSERT INTO fencelock.fence (resource, token, holder) VALUES ($1, 9000000000000000, 'old')`, far)
	require.NoError(t, err)

	// Seeded with the first node, about a name the second one serves.
	code, out, errOut := fencectl(t, "locks", "inspect", far, "--redis", nodes[0].Addr, "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, `"name": "`+far+`"`)

	code, out, errOut = fencectlProc(t, nil, "doctor", "--redis", nodes[0].Addr, "--db", db.URL)
	assert.Equal(t, exitFailed, code, errOut)
	assert.Equal(t, []string{"tokens"}, verdicts(out)["FAIL"], out)
	assert.Contains(t, out, "on "+nodes[1].Addr, "the clock of the master that owns the name")
	lits := doctorLiterals(nil, db)
	lits[nodes[0].Addr], lits[nodes[1].Addr] = "NODE_SEED", "NODE_OTHER"
	lits[nodes[2].Addr], lits[nodes[3].Addr] = "REPLICA_1", "REPLICA_2"
	lits[far] = "FARNAME"
	golden(t, "cluster", normalize(out, lits))

	code, out, errOut = fencectl(t, "tokens", "repair", far, "--redis", nodes[0].Addr, "--db", db.URL)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, far+": counter is 9000000000000000")
	n, err := redis.NewClient(&redis.Options{Addr: nodes[1].Addr}).Get(ctx, lockKey("fence:", far)+":seq").Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(9000000000000000), n, "the counter was raised on the master that owns it")

	code, out, _ = fencectlProc(t, nil, "doctor", "--redis", nodes[1].Addr, "--db", db.URL)
	assert.Equal(t, exitOK, code, out)
}

// A cluster with slots nobody serves fails the cluster check.
func TestDoctorClusterState(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := testenv.NewRedisServer(t, testenv.WithRedisArgs("--cluster-enabled", "yes"))
	require.NoError(t, r.Client().Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 8191).Err())
	code, out, errOut := fencectlProc(t, nil, "doctor", "--redis", r.Addr)
	assert.Equal(t, exitFailed, code, errOut)
	assert.Contains(t, verdicts(out)["FAIL"], "redis.cluster", out)
	golden(t, "cluster_state", normalize(out, doctorLiterals(r, nil)))
}

// A master that is down: one failing line for it (not one per check), the
// cluster state fails on the live one, and doctor neither hangs nor skips.
func TestDoctorClusterMasterDown(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	c := testenv.NewRedisCluster(t, testenv.WithMasters(2), testenv.WithReplicas(0))
	live, dead := c.Nodes[0], c.Nodes[1]
	require.NoError(t, dead.Kill())
	require.Eventually(t, func() bool {
		info, err := live.Client().ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:fail")
	}, 30*time.Second, 50*time.Millisecond, "the live master never saw the other fail")

	code, out, errOut := fencectlProc(t, nil, "doctor", "--redis", live.Addr, "--timeout", "3s")
	assert.Equal(t, exitFailed, code, errOut)
	assert.Equal(t, []string{"redis.cluster", "redis.cluster"}, verdicts(out)["FAIL"], out)
	assert.Contains(t, out, "node "+dead.Addr+": a master that does not answer")
	golden(t, "cluster_master_down", normalize(out, map[string]string{live.Addr: "NODE_LIVE", dead.Addr: "NODE_DEAD"}))
}

// A schema whose versions are not recorded in fencelock_db_version (the
// goose CLI without -table) is a warning naming the fix; migrate up records
// it, and doctor is then clean.
func TestDoctorUnrecordedSchema(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := testenv.NewRedisServer(t)
	db := migratedDB(t)
	_, err := db.Pool.Exec(ctx, `DELETE FROM `+migrations.VersionTable+` WHERE version_id > 0`)
	require.NoError(t, err)
	code, out, errOut := fencectlProc(t, nil, "doctor", "--redis", r.Addr, "--db", db.URL)
	assert.Equal(t, exitOK, code, errOut)
	assert.Contains(t, verdicts(out)["warn"], "migrations", out)
	assert.Contains(t, out, "records 0 of them")

	code, out, errOut = fencectl(t, "migrate", "up", "--db", db.URL)
	require.Equal(t, exitOK, code, errOut)
	assert.Equal(t, "recorded "+strings.Join(migrationFiles(t), ", ")+" in fencelock_db_version: the schema in database \""+db.Name+"\" at "+db.URL+
		" was installed without it (nothing in it changed)\n", out, "up says it recorded, and applied nothing")
	code, out, _ = fencectlProc(t, nil, "doctor", "--redis", r.Addr, "--db", db.URL)
	assert.Equal(t, exitOK, code)
	assert.NotContains(t, verdicts(out)["warn"], "migrations", out)
}

// Through PgBouncer in transaction mode: doctor sees the pooler (two
// sessions on one server process) and fails while the address leaves pgx's
// exec mode at cache_statement; with default_query_exec_mode=exec it is ok.
func TestDoctorTransactionPooler(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	db := testenv.NewDBViaPgBouncer(t)
	code, _, errOut := fencectl(t, "migrate", "up", "--db", db.DirectURL)
	require.Equal(t, exitOK, code, errOut)
	guardedResource(t, r, db, "stock-sync:eu")

	code, out, errOut := fencectlProc(t, nil, "doctor", "--redis", r.Addr, "--db", db.URL, "--prefix", r.Prefix)
	assert.Equal(t, exitFailed, code, errOut)
	assert.Equal(t, []string{"postgres.pooler"}, verdicts(out)["FAIL"], out)
	assert.Contains(t, out, "a transaction pooler sits in between")
	assert.Contains(t, out, "default_query_exec_mode=exec")
	lits := doctorLiterals(r, db)
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	lits[u.Host] = "PGBOUNCER_ADDR"
	golden(t, "pooler", normalize(out, lits))

	code, out, errOut = fencectlProc(t, nil, "doctor", "--redis", r.Addr, "--db", db.URL+"&default_query_exec_mode=exec", "--prefix", r.Prefix)
	assert.Equal(t, exitOK, code, out+errOut)
	assert.Contains(t, out, "the address's exec mode exec works through it")

	// migrate refuses the pooler: goose's lock is a session lock.
	code, _, errOut = fencectl(t, "migrate", "up", "--db", db.URL)
	assert.Equal(t, exitFailed, code)
	assert.Contains(t, errOut, "transaction pooler")
	assert.Equal(t, 1, strings.Count(errOut, "\n"), errOut)
}

// A Sentinel's address leads to the master it monitors: locks are read and
// doctor checks that master.
func TestSentinel(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s := testenv.NewSentinel(t)
	master, err := s.Master(ctx)
	require.NoError(t, err)
	sentinel := s.SentinelAddrs()[0]

	code, out, errOut := fencectl(t, "locks", "inspect", "job", "--redis", sentinel, "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, `"name": "job"`)

	code, out, errOut = fencectlProc(t, nil, "doctor", "--redis", sentinel)
	assert.Equal(t, exitOK, code, out+errOut)
	assert.Contains(t, out, `master "`+testenv.SentinelMasterName+`" of a Sentinel, at `+sentinel)
	assert.Contains(t, out, "1 replicas, WAIT works", "the checks ran on the master, which has the replica")

	code, _, errOut = fencectl(t, "locks", "inspect", "job", "--redis", sentinel, "--sentinel-master", "nope")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, `monitors "`+testenv.SentinelMasterName+`"`)
	code, _, errOut = fencectl(t, "locks", "inspect", "job", "--redis", master.Addr, "--sentinel-master", "x")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "is not a Sentinel")
}

// doctor as an application role (the grants docs/operations.md gives)
// finds nothing wrong with a correct setup: the schema's version is read
// from the catalog, and what needs an operator's grant (the version table,
// the outbox's rows) is left to an operator, with the grant, not failed
// or warned; as the owner, every check runs.
func TestDoctorAsApplicationRole(t *testing.T) {
	t.Parallel()
	db := migratedDB(t)
	ctx := ctxT(t)
	role, u := plainRole(t, db, "docapp")
	var owner string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT current_user").Scan(&owner))
	for _, g := range msgtest.AppGrants {
		_, err := db.Pool.Exec(ctx, fmt.Sprintf(g, role, owner))
		require.NoError(t, err)
	}
	code, out, errOut := fencectlProc(t, nil, "doctor", "--db", u)
	require.Equal(t, exitOK, code, out+errOut)
	v := verdicts(out)
	assert.Empty(t, v["FAIL"], out)
	assert.Equal(t, []string{"redis", "tokens"}, v["warn"], "only what needs --redis: %s", out)
	assert.Regexp(t, `(?m)^ok\s+migrations\s+schema fencelock at version \d+, as this fencelock needs \(read from the catalog\)$`, out)
	assert.Equal(t, []string{"migrations.recorded", "outbox"}, v["skip"], out)
	assert.Contains(t, out, "left to an operator")

	code, out, errOut = fencectlProc(t, nil, "doctor", "--db", db.URL)
	require.Equal(t, exitOK, code, out+errOut)
	assert.Empty(t, verdicts(out)["skip"], "the owner runs every check: %s", out)
	assert.Regexp(t, `(?m)^ok\s+migrations\s+\d+ of \d+ applied`, out)
}
