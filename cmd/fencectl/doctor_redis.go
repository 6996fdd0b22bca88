package main

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// checkRedis connects and runs every Redis check; it returns nil (and a
// failing finding) when Redis is unreachable, an error only for a bad
// command line.
func (d *doctor) checkRedis(ctx context.Context) (*redisConn, error) {
	rc, err := openRedis(ctx, d.a.redisSrc(), d.a.sentinelMaster, d.a.prefix, d.a.timeout)
	if isUsage(err) {
		return nil, err
	}
	if err != nil {
		d.failErr("redis", err)
		return nil, nil
	}
	what := fmt.Sprintf("Redis %s, %s, at %s", orUnknown(rc.version), rc.mode(), rc.display)
	major, minor, known := redisVersion(rc.version)
	switch {
	case !known:
		d.warn("redis", what+"; the server does not tell its version (HELLO and INFO refused)",
			"check that it is Redis 6.2 or newer (7 or newer for a cluster)")
	case rc.cluster && major < 7:
		d.fail("redis", what+": fence releases wake waiters with sharded pub/sub (SPUBLISH), which a cluster has from Redis 7.0",
			"upgrade the cluster to Redis 7 or newer")
	case major < 6 || (major == 6 && minor < 2):
		d.warn("redis", what+": fencelock is tested on Redis 6.2 and newer", "upgrade Redis to 6.2 or newer")
	default:
		d.ok("redis", what)
	}

	nodes, err := masters(ctx, rc)
	if err != nil {
		d.fail("redis.cluster", "cannot list the masters: "+oneLine(err), d.redisFix(rc, err, "check CLUSTER SHARDS / CLUSTER NODES on any node"))
		return rc, nil
	}
	for _, n := range nodes {
		label, replica := "", false
		if rc.cluster {
			label = rc.nodeAddr(n)
			// A master that does not answer gets one line, not one per check.
			// HELLO, not PING: every user may run it.
			if err := n.Do(ctx, "HELLO").Err(); err != nil {
				if e := redisFailure("Redis", rc.src, rc.user, rc.prefix, rc.timeout, err); e != nil &&
					(e.kind == kindCredentials || e.kind == kindPermission) {
					// It answers, and refuses the login the seed took.
					d.fail("redis.cluster", nodeLabel(label)+"a master that refuses the login: "+e.reply(), e.Fix()+" (every node needs the same user)")
					continue
				}
				d.fail("redis.cluster", nodeLabel(label)+"a master that does not answer: "+oneLine(err),
					"bring it back, or fail it over to a replica (CLUSTER FAILOVER on the replica)")
				continue
			}
			d.checkClusterState(ctx, rc, n, label)
		} else if rc.role == "replica" || rc.role == "slave" {
			replica = true
			d.fail("redis.role", "this server is a replica: it refuses writes, and locks must be taken on the master",
				"point "+rc.src.where()+" (and your applications) at the master")
		}
		d.checkEviction(ctx, n, label)
		d.checkPersistence(ctx, n, label)
		if !replica {
			d.checkReplicas(ctx, n, label, rc.user)
		}
		d.checkClock(ctx, rc, n, label)
		d.checkACL(ctx, rc, n, label)
	}
	return rc, nil
}

// redisFix is the fix for err from a node: the one its cause calls for
// (the network, the login, a missing permission), else fallback.
func (d *doctor) redisFix(rc *redisConn, err error, fallback string) string {
	if e := redisFailure("Redis", rc.src, rc.user, rc.prefix, rc.timeout, err); e != nil {
		return e.Fix()
	}
	return fallback
}

func orUnknown(s string) string {
	if s == "" {
		return "(version unknown)"
	}
	return s
}

// masters returns the one server, or every master of a cluster: the one
// given first, then the others by address (so the report's order is
// stable).
func masters(ctx context.Context, rc *redisConn) ([]*redis.Client, error) {
	cc, ok := rc.rdb.(*redis.ClusterClient)
	if !ok {
		return []*redis.Client{rc.rdb.(*redis.Client)}, nil
	}
	var mu sync.Mutex
	var out []*redis.Client
	err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		out = append(out, c)
		mu.Unlock()
		return nil
	})
	sort.Slice(out, func(i, j int) bool {
		ai, aj := rc.nodeAddr(out[i]), rc.nodeAddr(out[j])
		if (ai == rc.seed) != (aj == rc.seed) {
			return ai == rc.seed
		}
		return ai < aj
	})
	return out, err
}

func (d *doctor) checkClusterState(ctx context.Context, rc *redisConn, n *redis.Client, label string) {
	info, err := n.ClusterInfo(ctx).Result()
	if isNoPerm(err) {
		// fence does not need CLUSTER INFO; only this check does.
		d.warn("redis.cluster", nodeLabel(label)+"cluster state not checked: CLUSTER INFO refused ("+oneLine(err)+")",
			fmt.Sprintf("ACL SETUSER %s +cluster|info (on every node) to let doctor check it, or run doctor as an admin user", rc.user))
		return
	}
	if err != nil {
		d.fail("redis.cluster", nodeLabel(label)+"CLUSTER INFO: "+oneLine(err), d.redisFix(rc, err, "check the node's logs"))
		return
	}
	f := infoFields(info)
	ev := fmt.Sprintf("%scluster_state:%s, %s of 16384 slots assigned, %s on failed masters, %s on masters not answering, %s masters, %s nodes",
		nodeLabel(label), f["cluster_state"], f["cluster_slots_assigned"], f["cluster_slots_fail"], f["cluster_slots_pfail"], f["cluster_size"], f["cluster_known_nodes"])
	if f["cluster_state"] != "ok" || f["cluster_slots_assigned"] != "16384" || (f["cluster_slots_fail"] != "" && f["cluster_slots_fail"] != "0") {
		d.fail("redis.cluster", ev+": locks on unserved slots cannot be taken or released",
			"assign every slot and bring failed masters back (redis-cli --cluster check / fix)")
		return
	}
	d.ok("redis.cluster", ev)
}

// configGet reads one CONFIG parameter; managed services often refuse CONFIG.
func configGet(ctx context.Context, n *redis.Client, key string) (string, error) {
	m, err := n.ConfigGet(ctx, key).Result()
	if err != nil {
		return "", err
	}
	v, ok := m[key]
	if !ok {
		return "", fmt.Errorf("CONFIG GET %s: no such parameter", key)
	}
	return v, nil
}

func (d *doctor) checkEviction(ctx context.Context, n *redis.Client, label string) {
	// INFO memory (what fence itself reads) needs less privilege than CONFIG.
	var policy, maxmem string
	if info, err := n.Info(ctx, "memory").Result(); err == nil {
		f := infoFields(info)
		policy, maxmem = f["maxmemory_policy"], f["maxmemory"]
	}
	if policy == "" {
		var err error
		if policy, err = configGet(ctx, n, "maxmemory-policy"); err != nil {
			d.warn("redis.eviction", nodeLabel(label)+"maxmemory-policy not readable (INFO and CONFIG refused: "+oneLine(err)+")",
				"check it is noeviction in your provider's settings, or run doctor as a user allowed INFO")
			return
		}
		maxmem, _ = configGet(ctx, n, "maxmemory")
	}
	ev := fmt.Sprintf("%smaxmemory-policy %s, maxmemory %s", nodeLabel(label), policy, orUnknown(maxmem))
	fix := "CONFIG SET maxmemory-policy noeviction (and set it in redis.conf or the provider's parameters)"
	switch {
	case policy == "noeviction":
		d.ok("redis.eviction", ev)
	case strings.HasPrefix(policy, "allkeys-"):
		d.fail("redis.eviction", ev+": under memory pressure Redis evicts any key, locks and token counters included (a lock can be taken twice)", fix)
	case strings.HasPrefix(policy, "volatile-") && maxmem != "0":
		d.fail("redis.eviction", ev+": every fence key has an expiry, so all are eviction candidates under memory pressure", fix)
	default:
		d.warn("redis.eviction", ev+": nothing is evicted while maxmemory is 0, but every fence key has an expiry and becomes an eviction candidate once a limit is set", fix)
	}
}

func (d *doctor) checkPersistence(ctx context.Context, n *redis.Client, label string) {
	aof, err := configGet(ctx, n, "appendonly")
	save, err2 := configGet(ctx, n, "save")
	if err != nil || err2 != nil {
		// INFO persistence is the fallback when CONFIG is refused.
		info, ierr := n.Info(ctx, "persistence").Result()
		if ierr != nil {
			d.warn("redis.persistence", nodeLabel(label)+"not readable (CONFIG and INFO refused: "+oneLine(ierr)+")",
				"check persistence in your provider's settings")
			return
		}
		f := infoFields(info)
		if f["aof_enabled"] == "1" {
			aof = "yes"
		} else {
			aof = "no"
		}
		save = "(unknown)"
	}
	fsync, _ := configGet(ctx, n, "appendfsync")
	switch {
	case aof == "yes":
		d.ok("redis.persistence", fmt.Sprintf("%sAOF on (appendfsync %s)", nodeLabel(label), orUnknown(fsync)))
	case save != "" && save != "(unknown)":
		d.ok("redis.persistence", fmt.Sprintf("%sRDB snapshots (save %s), no AOF: a restart loses the locks and counters written since the last snapshot; tokens still rise with the server clock", nodeLabel(label), save))
	default:
		d.warn("redis.persistence", nodeLabel(label)+"no AOF and no RDB snapshots: a restart loses every lock (a held lock can be taken again at once) and every token counter (tokens then rise only with the server clock)",
			"CONFIG SET appendonly yes (and in redis.conf), or accept it: guard still rejects the old holder's writes")
	}
}

func (d *doctor) checkReplicas(ctx context.Context, n *redis.Client, label, user string) {
	info, err := n.Info(ctx, "replication").Result()
	replicas := "unknown"
	if err == nil {
		replicas = infoFields(info)["connected_slaves"]
	}
	acked, werr := n.Do(ctx, "WAIT", 0, 0).Int()
	if werr != nil {
		// The documented ACL line leaves WAIT out: only WithReplicaSync
		// needs it, and doctor cannot know whether the application uses it.
		d.ok("redis.replicas", fmt.Sprintf("%s%s replicas; WAIT is refused (%s), which only fence.WithReplicaSync needs: with it, ACL SETUSER %s +wait",
			nodeLabel(label), replicas, oneLine(werr), user))
		return
	}
	ev := fmt.Sprintf("%s%s replicas, WAIT works (%d acknowledged)", nodeLabel(label), replicas, acked)
	if replicas == "0" {
		ev += ": fence.WithReplicaSync(n) fails for any n of 1 or more; a failover has no replica to promote"
	}
	d.ok("redis.replicas", ev)
}

func (d *doctor) checkClock(ctx context.Context, rc *redisConn, n *redis.Client, label string) {
	before := time.Now()
	t, err := n.Time(ctx).Result()
	if err != nil {
		d.fail("redis.clock", nodeLabel(label)+"TIME, which the acquire script reads: "+oneLine(err), d.redisFix(rc, err, "check the node's logs"))
		return
	}
	local := before.Add(time.Since(before) / 2)
	skew := t.Sub(local).Round(time.Millisecond)
	ev := fmt.Sprintf("%sserver clock %s, %v from this machine's", nodeLabel(label), t.UTC().Format(time.RFC3339), skew)
	if skew.Abs() > 2*time.Second {
		d.warn("redis.clock", ev+": tokens are floored by the server clock; if it is stepped back after a counter loss, new holders are rejected",
			"run NTP (chrony) on the Redis host and on this one")
		return
	}
	d.ok("redis.clock", ev)
}

// aclNeed is one command fence sends (or runs inside a script) with the
// keys and channels it touches. Optional ones cost only speed when denied:
// without PUBLISH or SUBSCRIBE a release still hands the lock over, and the
// waiter learns of it at its next heartbeat instead of at once.
type aclNeed struct {
	label    string
	args     []any
	optional bool
}

func aclNeeds(prefix string, cluster bool) []aclNeed {
	k := lockKey(prefix, "fencectl-doctor")
	seq, ch := k+":seq", k+":ch"
	q, w := k+":q", k+":w" // the queue of waiters (see fence's package doc)
	sum := sha1.Sum([]byte("return 1"))
	sha := hex.EncodeToString(sum[:])
	pub, sub := "PUBLISH", "SUBSCRIBE"
	if cluster {
		pub, sub = "SPUBLISH", "SSUBSCRIBE"
	}
	needs := []aclNeed{
		{label: "EVALSHA", args: []any{"EVALSHA", sha, 2, k, seq}},
		{label: "EVAL", args: []any{"EVAL", "return 1", 2, k, seq}},
		{label: "GET", args: []any{"GET", k}},
		{label: "EXISTS", args: []any{"EXISTS", k, q}},
		{label: "SET", args: []any{"SET", k, "1:x", "PX", 1000}},
		{label: "PEXPIRE", args: []any{"PEXPIRE", k, 1000}},
		{label: "PTTL", args: []any{"PTTL", k}},
		{label: "DEL", args: []any{"DEL", k}},
		{label: "TIME", args: []any{"TIME"}},
		{label: "LINDEX", args: []any{"LINDEX", q, 0}},
		{label: "LPOP", args: []any{"LPOP", q}},
		{label: "RPUSH", args: []any{"RPUSH", q, "x"}},
		{label: "LREM", args: []any{"LREM", q, 1, "x"}},
		{label: "HGET", args: []any{"HGET", w, "x"}},
		{label: "HSET", args: []any{"HSET", w, "x", "1:1"}},
		{label: "HDEL", args: []any{"HDEL", w, "x"}},
		{label: "HEXISTS", args: []any{"HEXISTS", w, "x"}},
		{label: pub, args: []any{pub, ch, "x"}, optional: true},
		{label: sub, args: []any{sub, ch}, optional: true},
	}
	if cluster {
		needs = append(needs, aclNeed{label: "CLUSTER SLOTS", args: []any{"CLUSTER", "SLOTS"}})
	}
	return needs
}

// aclCommands are the commands fence uses, as the ACL line of docs/operations.md
// gives them: INFO for the eviction check, PUBSUB NUMSUB for waiters on a
// failover client; a cluster adds the sharded pub/sub and CLUSTER SLOTS.
// fencectl needs nothing more (it opens with HELLO, which every user may
// run), except SCAN for locks list.
func aclCommands(cluster bool) string {
	cmds := "+evalsha +eval +get +exists +set +pexpire +pttl +del +time +lindex +lpop +rpush +lrem +hget +hset +hdel +hexists " +
		"+publish +subscribe +info +pubsub|numsub"
	if cluster {
		cmds += " +spublish +ssubscribe +cluster|slots"
	}
	return cmds
}

func aclFix(user, prefix string, cluster bool) string {
	return fmt.Sprintf("ACL SETUSER %s ~%s* &%s* %s (on every node)", user, prefix, prefix, aclCommands(cluster))
}

const slowWake = "releases still hand the lock over, but a waiter learns of it at its next heartbeat instead of at once"

func isNoPerm(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOPERM") }

func isUnknownCommand(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "unknown command") || strings.Contains(err.Error(), "unknown subcommand"))
}

// aclFound is what an ACL check found the user may not do. A command, a
// key and a channel refused are three causes with three fixes: the
// commands of the ACL line, or only the key and channel patterns (a user
// set up for another prefix, or fencectl not told the application's).
type aclFound struct {
	commands []string // required commands refused, as the report names them
	optional []string // PUBLISH, SUBSCRIBE refused: waiters wake later
	keys     bool     // fence's keys are outside the user's key patterns
	channels bool     // fence's channels are outside its channel patterns
	other    []string // probes that failed for another reason
	// The user's own patterns (ACL GETUSER), read when a key or channel
	// was refused; patternsErr when they cannot be read (a user may
	// usually not run ACL GETUSER on itself).
	keyPatterns, channelPatterns string
	patternsErr                  error
}

// add files a refusal, reply in the server's words, under what it is
// about; what is how the report names the command.
func (f *aclFound) add(what, reply string, optional bool) {
	switch denialOf(reply) {
	case deniedKey:
		f.keys = true
	case deniedChannel:
		f.channels = true
	default:
		if optional {
			f.optional = append(f.optional, what)
		} else {
			f.commands = append(f.commands, what)
		}
	}
}

// readPatterns reads user's key and channel patterns, when a key or a
// channel was refused.
func (f *aclFound) readPatterns(ctx context.Context, n *redis.Client, user string) {
	if !f.keys && !f.channels {
		return
	}
	reply, err := n.Do(ctx, "ACL", "GETUSER", user).Result()
	if err != nil {
		f.patternsErr = err
		return
	}
	f.keyPatterns = patternList(replyField(reply, "keys"), "~")
	f.channelPatterns = patternList(replyField(reply, "channels"), "&")
	if sel, ok := replyField(reply, "selectors").([]any); ok && len(sel) > 0 {
		// ACL DRYRUN allows what any selector allows: the root patterns
		// are not all there is.
		more := fmt.Sprintf(" and those of its %d selectors", len(sel))
		f.keyPatterns += more
		f.channelPatterns += more
	}
}

// patternList renders ACL GETUSER's keys or channels: Redis 7 gives them
// as one string ("~a:* ~b:*"), Redis 6 as a list without the sigil.
func patternList(v any, sigil string) string {
	var out []string
	switch p := v.(type) {
	case string:
		out = strings.Fields(p)
	case []any:
		for _, x := range p {
			out = append(out, sigil+fmt.Sprint(x))
		}
	}
	if len(out) == 0 {
		return "(none)"
	}
	return strings.Join(out, " ")
}

// outside says that fence's keys or channels are outside the user's
// patterns, naming the prefix fence uses and, when readable, the patterns.
func (d *doctor) outside(f *aclFound, what, patterns string, notePrefix, noteUnreadable bool) string {
	s := fmt.Sprintf("the %ss %s*", what, d.a.prefix)
	if notePrefix {
		s += " (" + prefixSource(d.a.prefix) + ")"
	}
	s += fmt.Sprintf(", outside its %s patterns", what)
	switch {
	case f.patternsErr == nil:
		return s + " " + patterns
	case noteUnreadable && isNoPerm(f.patternsErr):
		return s + " (not readable here: ACL GETUSER is refused)"
	case noteUnreadable:
		return s + " (not readable here: ACL GETUSER: " + oneLine(f.patternsErr) + ")"
	}
	return s
}

// aclVerdict reports what the user may not do: a missing command fails,
// and so do keys outside its patterns; channels outside them, like
// PUBLISH or SUBSCRIBE refused, only slow waiters down. The fix is the
// whole ACL line when a command is missing, else only the patterns.
func (d *doctor) aclVerdict(label, who, how string, f *aclFound, user string, cluster bool) {
	user = orDefault(user, "<user>")
	var keys, nor []string
	if f.keys {
		keys = append(keys, d.outside(f, "key", f.keyPatterns, true, true))
	}
	nor = append(nor, f.optional...)
	if f.channels {
		nor = append(nor, "publish or subscribe on "+d.outside(f, "channel", f.channelPatterns, !f.keys, !f.keys))
	}
	fix := aclFix(user, d.a.prefix, cluster)
	if len(f.commands) == 0 && len(f.optional) == 0 {
		fix = aclPatternFix(user, d.a.prefix, f.keys, f.channels) + otherPrefix(d.a.prefix)
	}
	switch {
	case len(f.commands) > 0 || f.keys:
		what := "run what fence needs"
		if len(f.commands) == 0 {
			what = "use fence's keys"
		}
		ev := fmt.Sprintf("%s%s may not %s (%s): %s", nodeLabel(label), who, what, how, strings.Join(append(f.commands, keys...), "; "))
		if len(nor) > 0 {
			ev += fmt.Sprintf("; nor %s (%s)", strings.Join(nor, "; "), slowWake)
		}
		d.fail("redis.acl", ev, fix)
	case len(nor) > 0:
		d.warn("redis.acl", fmt.Sprintf("%s%s may run the scripts, but not %s (%s): %s", nodeLabel(label), who,
			strings.Join(nor, "; "), how, slowWake), fix)
	default:
		d.ok("redis.acl", fmt.Sprintf("%s%s may run every command fence uses on keys and channels %s* (%s)", nodeLabel(label), who, d.a.prefix, how))
	}
}

func (d *doctor) checkACL(ctx context.Context, rc *redisConn, n *redis.Client, label string) {
	user := d.aclUser
	if user == "" {
		who, err := n.Do(ctx, "ACL", "WHOAMI").Text()
		switch {
		case isUnknownCommand(err):
			d.ok("redis.acl", nodeLabel(label)+"no ACLs (Redis before 6): every authenticated client may run every command")
			return
		case err == nil:
			user = who
		}
	}
	if user != "" {
		f, dryErr := d.dryRunACL(ctx, rc, n, user)
		if dryErr == nil {
			d.aclVerdict(label, fmt.Sprintf("user %q", user), "ACL DRYRUN", f, user, rc.cluster)
			return
		}
		if d.aclUser != "" {
			d.warn("redis.acl", fmt.Sprintf("%scannot dry-run for user %q: %s", nodeLabel(label), user, oneLine(dryErr)),
				"run doctor with an admin user's address (ACL DRYRUN needs it), or drop --acl-user to try the commands as the connected user")
			return
		}
		// ACL DRYRUN is refused (not an admin) or missing (Redis 6): try
		// the commands themselves.
	}
	// ACL WHOAMI refused too: the user is the one the address names.
	d.probeACL(ctx, rc, n, orDefault(user, rc.user), label)
}

// dryRunACL asks ACL DRYRUN about each command fence sends, with its keys
// and channels. Redis checks the command first, then the keys, then the
// channels, so a missing command shows even where the keys are refused.
func (d *doctor) dryRunACL(ctx context.Context, rc *redisConn, n *redis.Client, user string) (*aclFound, error) {
	f := &aclFound{}
	for _, nd := range aclNeeds(d.a.prefix, rc.cluster) {
		res, err := n.Do(ctx, append([]any{"ACL", "DRYRUN", user}, nd.args...)...).Text()
		if err != nil {
			return nil, err
		}
		if res != "OK" {
			f.add(nd.label+" ("+res+")", res, nd.optional)
		}
	}
	f.readPatterns(ctx, n, user)
	return f, nil
}

// probeScript makes, with no declared keys, the reads fence's scripts make
// on the keys in ARGV, and returns each refusal as its command and error:
// inside a script Redis checks the command before the key, so a missing
// command shows even where the keys are refused, which a script with
// declared keys would not reach. Without ARGV it does nothing (EVALSHA).
const probeScript = `if #ARGV == 0 then return {} end
local k, seq, q, w = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local out = {}
local function try(name, ...)
  local r = redis.pcall(name, ...)
  if type(r) == 'table' and r.err then
    out[#out + 1] = name
    out[#out + 1] = r.err
  end
end
try('GET', seq)
try('EXISTS', k, q)
try('PTTL', k)
try('TIME')
try('LINDEX', q, 0)
try('HGET', w, 'x')
try('HEXISTS', w, 'x')
return out`

// probeACL runs harmless versions of what fence sends, as the connected
// user, on a name no application uses. It cannot try the writes inside
// scripts without writing, and says so.
func (d *doctor) probeACL(ctx context.Context, rc *redisConn, n *redis.Client, user, label string) {
	k := lockKey(d.a.prefix, "fencectl-doctor")
	seq, q, w, ch := k+":seq", k+":q", k+":w", k+":ch"
	f := &aclFound{}
	try := func(what string, optional bool, err error) {
		switch {
		case err == nil || err == redis.Nil:
		case denialOf(err.Error()) != deniedNothing:
			f.add(what, err.Error(), optional)
		default:
			f.other = append(f.other, what+": "+oneLine(err))
		}
	}
	// The script reaches its keys undeclared, so it must run on their node:
	// on a cluster, the master of the name's slot.
	r := rc.rdb
	var script redis.Scripter = r
	if cc, ok := r.(*redis.ClusterClient); ok {
		m, err := cc.MasterForKey(ctx, k)
		if err != nil {
			d.fail("redis.acl", nodeLabel(label)+"cannot find the node of "+k+": "+oneLine(err), d.redisFix(rc, err, "check CLUSTER SLOTS on any node"))
			return
		}
		script = m
	}
	refused, err := script.Eval(ctx, probeScript, nil, k, seq, q, w).StringSlice()
	try("EVAL", false, err)
	var inside []string
	for i := 0; i+1 < len(refused); i += 2 {
		if denialOf(refused[i+1]) == deniedNothing {
			f.other = append(f.other, refused[i]+" inside a script: "+refused[i+1])
			continue
		}
		if denialOf(refused[i+1]) == deniedKey {
			f.keys = true
			continue
		}
		inside = append(inside, refused[i])
	}
	if len(inside) > 0 {
		f.commands = append(f.commands, strings.Join(inside, ", ")+" inside scripts")
	}
	// With declared keys, as fence sends it; NOSCRIPT: EVAL was refused,
	// so the script is not cached, and EVALSHA itself was allowed.
	err = r.EvalSha(ctx, redis.NewScript(probeScript).Hash(), []string{k, seq}).Err()
	if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		err = nil
	}
	try("EVALSHA", false, err)
	var sub *redis.PubSub
	pub, subName := "PUBLISH", "SUBSCRIBE"
	if rc.cluster {
		pub, subName = "SPUBLISH", "SSUBSCRIBE"
		try(pub, true, r.SPublish(ctx, ch, "fencectl doctor").Err())
		sub = r.SSubscribe(ctx, ch)
	} else {
		try(pub, true, r.Publish(ctx, ch, "fencectl doctor").Err())
		sub = r.Subscribe(ctx, ch)
	}
	sctx, cancel := context.WithTimeout(ctx, d.a.timeout)
	_, err = sub.Receive(sctx)
	cancel()
	_ = sub.Close()
	try(subName, true, err)
	who := "the connected user"
	if user != "" {
		who = fmt.Sprintf("user %q", user)
	}
	if len(f.other) > 0 && len(f.commands) == 0 && !f.keys {
		d.warn("redis.acl", fmt.Sprintf("%s%s: probes failed: %s", nodeLabel(label), who, strings.Join(f.other, "; ")),
			"check the errors above")
		return
	}
	f.readPatterns(ctx, n, user)
	d.aclVerdict(label, who, "tried, since ACL DRYRUN is not allowed to this user; writes inside scripts not tried: --acl-user from an admin address checks them",
		f, user, rc.cluster)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
