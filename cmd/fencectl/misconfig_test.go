package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// Misconfigured servers, each a real redis-server or Postgres set up wrong:
// fencectl names the one cause (network, credentials, permission) and a
// fix for that cause, naming the flag or variable the address came from.

// docsACLLine is the Redis ACL line the README (or docs/) gives for an
// application's user, as ACL SETUSER arguments with password, and the
// commands it adds on a cluster.
func docsACLLine(t *testing.T, password string) (args []any, clusterExtra []any) {
	t.Helper()
	var texts []string
	for _, root := range []string{"../../README.md", "../../docs"} {
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
				b, rerr := os.ReadFile(p)
				require.NoError(t, rerr)
				texts = append(texts, string(b))
			}
			return nil
		})
	}
	all := strings.Join(texts, "\n")
	m := regexp.MustCompile("`(ACL SETUSER app on >… [^`]+)`").FindStringSubmatch(all)
	require.NotNil(t, m, "no `ACL SETUSER app on >… …` line in README.md or docs/: this test runs fencectl as the user it describes")
	for _, f := range strings.Fields(m[1])[2:] {
		if f == ">…" {
			f = ">" + password
		}
		args = append(args, f)
	}
	c := regexp.MustCompile("plus\\s+`([^`]+)`\\s+on\\s+a\\s+cluster").FindStringSubmatch(all)
	require.NotNil(t, c, "no 'plus `…` on a cluster' after the ACL line in README.md or docs/")
	for _, f := range strings.Fields(c[1]) {
		clusterExtra = append(clusterExtra, f)
	}
	return args, clusterExtra
}

// aclUser creates an ACL user on r with the given ACL SETUSER arguments
// (after the user name) and returns the URL to log in as it.
func aclUser(t *testing.T, r *testenv.Redis, rules ...any) string {
	t.Helper()
	require.NoError(t, r.Client().Do(ctxT(t), append([]any{"ACL", "SETUSER"}, rules...)...).Err())
	return withPassword(t, r.URL, rules[0].(string), redisSecret)
}

// The README's ACL line is enough for every fencectl command but locks
// list (SCAN, an operator's command), which says what to add.
func TestREADMEACLUser(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := testenv.NewRedisServer(t)
	line, _ := docsACLLine(t, redisSecret)
	u := aclUser(t, r, line...)
	locks := newLocksPrefix(t, r, "fence:")
	l, err := locks.Acquire(ctx, "job")
	require.NoError(t, err)
	defer l.Release(ctx)

	code, out, errOut := fencectlProc(t, nil, "locks", "inspect", "job", "--redis", u)
	require.Equal(t, exitOK, code, out+errOut)
	assert.Contains(t, out, l.Holder())

	code, out, errOut = fencectlProc(t, nil, "doctor", "--redis", u)
	assert.Equal(t, exitOK, code, out+errOut)
	assert.Empty(t, verdicts(out)["FAIL"], out)
	assert.Equal(t, []string{"redis.persistence", "postgres", "tokens"}, verdicts(out)["warn"],
		"the documented line passes doctor (the warnings are the test server's persistence and the missing --db): %s", out)
	assert.Regexp(t, `ok\s+redis\.acl\s+user "app" may run every command fence uses`, out)
	assert.Regexp(t, `ok\s+redis\.replicas\s+.*WAIT is refused .*, which only fence.WithReplicaSync needs: with it, ACL SETUSER app \+wait`, out,
		"WithReplicaSync needs WAIT, which the line leaves out: said, not warned, naming the user")

	code, out, errOut = fencectlProc(t, nil, "locks", "list", "--redis", u)
	assert.Equal(t, exitFailed, code, out+errOut)
	assert.Equal(t, "fencectl: Redis at "+redactAddr(u)+` refused user "app": NOPERM this user has no permissions to run the 'scan' command; fix: ACL SETUSER app +scan (on every node)`+"\n", errOut)
	requireNoSecret(t, redisSecret, out, errOut)

	// With the fix applied, list works as that user.
	require.NoError(t, r.Client().Do(ctx, "ACL", "SETUSER", "app", "+scan").Err())
	code, out, errOut = fencectlProc(t, nil, "locks", "list", "--redis", u)
	require.Equal(t, exitOK, code, out+errOut)
	assert.Contains(t, out, l.Holder())
}

// Network, credentials and permissions are three causes with three fixes.
func TestRedisFailuresToldApart(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := testenv.NewRedisServer(t)
	line, _ := docsACLLine(t, redisSecret)
	var noGet []any
	for _, a := range line {
		if a != "+get" {
			noGet = append(noGet, a)
		}
	}
	noGet[0] = "noget"
	noGetURL := aclUser(t, r, noGet...)
	var noDel []any
	for _, a := range line {
		if a != "+del" {
			noDel = append(noDel, a)
		}
	}
	noDel[0] = "nodel"
	noDelURL := aclUser(t, r, noDel...)
	appURL := aclUser(t, r, line...)
	dead := "redis://app:" + redisSecret + "@" + testenv.RefusedAddr(t)
	wrong := strings.Replace(appURL, redisSecret, "not-"+redisSecret, 1)

	for _, tc := range []struct {
		name      string
		env, args []string
		want      string
	}{
		{"dead address", nil, []string{"--redis", dead},
			`is not reachable: dial tcp ` + regexp.QuoteMeta(strings.TrimPrefix(dead, "redis://app:"+redisSecret+"@")) + `: connect: connection refused; fix: check the address \(--redis\), that redis-server runs there, and that this host may reach it\n$`},
		{"dead address from the environment", []string{"REDIS_URL=" + dead}, nil,
			`is not reachable: dial tcp .*; fix: check the address \(\$REDIS_URL\), that redis-server runs there`},
		{"wrong password", nil, []string{"--redis", wrong},
			`refused the login of user "app": WRONGPASS invalid username-password pair or user is disabled; fix: check user "app" and its password in the address \(--redis\)`},
		{"a command missing", nil, []string{"--redis", noGetURL},
			`refused user "noget": .*NOPERM this user has no permissions to run the 'get' command; fix: ACL SETUSER noget \+get \(on every node\)`},
		{"keys outside the user's pattern", nil, []string{"--redis", appURL, "--prefix", "other:"},
			`refused user "app": .*NOPERM this user has no permissions to access one of the keys used as arguments; fix: ACL SETUSER app ~other:\* \(on every node\)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := fencectlProc(t, tc.env, append([]string{"locks", "inspect", "job"}, tc.args...)...)
			assert.Equal(t, exitFailed, code, out+errOut)
			assert.Empty(t, out)
			assert.Regexp(t, `^fencectl: Redis at redis://\w+:xxxxx@[\d.:]+ `+tc.want, errOut)
			assert.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
			requireNoSecret(t, redisSecret, out, errOut)
			if tc.env == nil {
				assert.NotContains(t, errOut, "REDIS_URL", "the address came from --redis")
			}
		})
	}

	// A command refused inside fence's release script: Redis names none,
	// so the fix is the whole line.
	l, err := newLocksPrefix(t, r, "fence:").Acquire(ctx, "held")
	require.NoError(t, err)
	code, out, errOut := fencectlProc(t, nil, "locks", "release", "held", "--force", "--yes", "--redis", noDelURL)
	assert.Equal(t, exitFailed, code, out+errOut)
	assert.Regexp(t, `^fencectl: Redis at redis://nodel:xxxxx@[\d.:]+ refused user "nodel": fence: force release "held": ERR The user executing the script can't run this command or subcommand script: \w+, on @user_script:\d+; `+
		`fix: ACL SETUSER nodel ~fence:\* &fence:\* \+evalsha .* \(on every node\): a command inside fence's script was refused, and Redis does not say which; doctor --acl-user nodel from an admin's address names it\n$`, errOut)
	require.NoError(t, l.Err(), "nothing was released")

	// A server with a password for its default user, and an address without
	// one.
	require.NoError(t, r.Client().Do(ctx, "CONFIG", "SET", "requirepass", redisSecret).Err())
	code, _, errOut = fencectlProc(t, nil, "locks", "inspect", "job", "--redis", r.Addr)
	assert.Equal(t, exitFailed, code)
	assert.Equal(t, "fencectl: Redis at "+r.Addr+` refused the login of user "default": NOAUTH HELLO must be called with the client already authenticated; fix: the server needs a password: add it to the address (--redis), redis://:PASSWORD@host:port, or redis://USER:PASSWORD@host:port for an ACL user`+"\n", errOut)
	// A wrong password for the default user: the server's requirepass,
	// not an ACL user to look up.
	code, _, errOut = fencectlProc(t, nil, "locks", "inspect", "job", "--redis", "redis://:wrong@"+r.Addr)
	assert.Equal(t, exitFailed, code)
	assert.Contains(t, errOut, "fix: check the password in the address (--redis): without a user it is the server's requirepass (CONFIG GET requirepass as an admin, or redis.conf)")
	assert.NotContains(t, errOut, "ACL GETUSER")
}

// aclFinding runs doctor with args and returns its redis.acl finding.
func aclFinding(t *testing.T, args ...string) finding {
	t.Helper()
	_, out, errOut := fencectlProc(t, nil, append([]string{"doctor", "-o", "json"}, args...)...)
	requireNoSecret(t, redisSecret, out, errOut)
	var report struct{ Checks []finding }
	require.NoError(t, json.Unmarshal([]byte(out), &report), out+errOut)
	for _, f := range report.Checks {
		if f.Check == "redis.acl" {
			return f
		}
	}
	t.Fatalf("no redis.acl check in %s", out)
	return finding{}
}

// The README's command list, as doctor's fix gives it.
const aclLineCommands = "+evalsha +eval +get +exists +set +pexpire +pttl +del +time +lindex +lpop +rpush +lrem +hget +hset +hdel +hexists +publish +subscribe +info +pubsub|numsub"

// A command the user may not run, fence's keys outside its key patterns and
// fence's channels outside its channel patterns are three causes: doctor
// names each as what it is, both when it may dry-run the user's commands
// (--acl-user from an admin address) and when it can only try them as the
// user. A key or channel refused names the prefix fence uses and, where ACL
// GETUSER is allowed, the user's own patterns; its fix is the patterns only,
// unless a command is missing too. Each fix, applied, makes the check pass.
func TestDoctorACLRefusalsToldApart(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	const (
		tried    = "tried, since ACL DRYRUN is not allowed to this user; writes inside scripts not tried: --acl-user from an admin address checks them"
		hidden   = "(not readable here: ACL GETUSER is refused)"
		other    = "; or, if the application's locks use another prefix (fence.WithPrefix), give it with --prefix"
		slowWake = "releases still hand the lock over, but a waiter learns of it at its next heartbeat instead of at once"
	)
	// Each user may run every command but ACL DRYRUN and GETUSER (@admin),
	// unless its rules say otherwise.
	all := []any{"+@all", "-@admin"}
	for _, tc := range []struct {
		user    string
		rules   []any
		verdict verdict
		// the evidence after `user "<user>" may ` with the check's way
		// (ACL DRYRUN or tried) as %[1]s and its patterns (or hidden) as
		// %[2]s, for the probe and for the dry run; the fix.
		probe, dryRun []string // evidence, patterns
		fix           string
	}{
		{"keys", append([]any{"~fencelock:*", "&fence:*"}, all...), verdictFail,
			[]string{`not use fence's keys (%[1]s): the keys fence:* (the default prefix), outside its key patterns %[2]s`, hidden},
			[]string{`not use fence's keys (%[1]s): the keys fence:* (the default prefix), outside its key patterns %[2]s`, "~fencelock:*"},
			"ACL SETUSER keys ~fence:* (on every node)" + other},
		{"chans", append([]any{"~fence:*", "&fencelock:*"}, all...), verdictWarn,
			[]string{`run the scripts, but not publish or subscribe on the channels fence:* (the default prefix), outside its channel patterns %[2]s (%[1]s): ` + slowWake, hidden},
			[]string{`run the scripts, but not publish or subscribe on the channels fence:* (the default prefix), outside its channel patterns %[2]s (%[1]s): ` + slowWake, "&fencelock:*"},
			"ACL SETUSER chans &fence:* (on every node)" + other},
		{"both", append([]any{"~fencelock:*", "&fencelock:*"}, all...), verdictFail,
			[]string{`not use fence's keys (%[1]s): the keys fence:* (the default prefix), outside its key patterns %[2]s; nor publish or subscribe on the channels fence:*, outside its channel patterns (` + slowWake + `)`, hidden},
			[]string{`not use fence's keys (%[1]s): the keys fence:* (the default prefix), outside its key patterns %[2]s; nor publish or subscribe on the channels fence:*, outside its channel patterns &fencelock:* (` + slowWake + `)`, "~fencelock:*"},
			"ACL SETUSER both ~fence:* &fence:* (on every node)" + other},
		{"cmd", append([]any{"~fence:*", "&fence:*"}, append(all, "-pttl")...), verdictFail,
			[]string{`not run what fence needs (%[1]s): PTTL inside scripts`, ""},
			[]string{`not run what fence needs (%[1]s): PTTL (This user has no permissions to run the 'pttl' command)`, ""},
			"ACL SETUSER cmd ~fence:* &fence:* " + aclLineCommands + " (on every node)"},
		// A user set up for the prefix fencelock: with a short command
		// list: the keys and channels refused, and commands inside
		// fence's scripts (EXISTS, PTTL, SET, ...) missing too.
		{"lib", []any{"~fencelock:*", "&fencelock:*", "+evalsha", "+eval", "+get", "+info", "+pubsub|numsub", "+publish", "+subscribe", "+spublish", "+ssubscribe", "+time", "+script|load"}, verdictFail,
			[]string{`not run what fence needs (%[1]s): EXISTS, PTTL, LINDEX, HGET, HEXISTS inside scripts; the keys fence:* (the default prefix), outside its key patterns %[2]s; nor publish or subscribe on the channels fence:*, outside its channel patterns (` + slowWake + `)`, hidden},
			nil,
			"ACL SETUSER lib ~fence:* &fence:* " + aclLineCommands + " (on every node)"},
	} {
		t.Run(tc.user, func(t *testing.T) {
			u := aclUser(t, r, append([]any{tc.user, "on", ">" + redisSecret}, tc.rules...)...)
			who := fmt.Sprintf("user %q may ", tc.user)

			f := aclFinding(t, "--redis", u)
			assert.Equal(t, tc.verdict, f.Verdict)
			assert.Equal(t, who+fmt.Sprintf(tc.probe[0], tried, tc.probe[1]), f.Evidence)
			assert.Equal(t, tc.fix, f.Fix)

			if tc.dryRun == nil {
				// The dry run names every command of the line but three: shown apart.
				f = aclFinding(t, "--redis", r.Addr, "--acl-user", tc.user)
				assert.Equal(t, verdictFail, f.Verdict)
				assert.Contains(t, f.Evidence, who+"not run what fence needs (ACL DRYRUN): EXISTS (This user has no permissions to run the 'exists' command); SET (")
				assert.Contains(t, f.Evidence, "; the keys fence:* (the default prefix), outside its key patterns ~fencelock:*; nor publish or subscribe on the channels fence:*, outside its channel patterns &fencelock:* (")
				assert.NotContains(t, f.Evidence, "EVALSHA (", "EVALSHA is allowed; its key is what is refused")
				assert.Equal(t, tc.fix, f.Fix)
			} else {
				f = aclFinding(t, "--redis", r.Addr, "--acl-user", tc.user)
				assert.Equal(t, tc.verdict, f.Verdict)
				assert.Equal(t, who+fmt.Sprintf(tc.dryRun[0], "ACL DRYRUN", tc.dryRun[1]), f.Evidence)
				assert.Equal(t, tc.fix, f.Fix)
			}

			// The fix as printed, up to its parenthesis, run on the server.
			paste, _, ok := strings.Cut(tc.fix, " (on every node)")
			require.True(t, ok, tc.fix)
			var args []any
			for _, a := range strings.Fields(paste) {
				args = append(args, a)
			}
			require.NoError(t, r.Client().Do(ctxT(t), args...).Err(), paste)
			for _, args := range [][]string{{"--redis", u}, {"--redis", r.Addr, "--acl-user", tc.user}} {
				f = aclFinding(t, args...)
				assert.Equal(t, verdictOK, f.Verdict, "after the fix (%v): %s", args, f.Evidence)
			}
		})
	}

	// The other fix: doctor told the application's prefix.
	aclUser(t, r, "app", "on", ">"+redisSecret, "~fencelock:*", "&fencelock:*", "+@all", "-@admin")
	f := aclFinding(t, "--redis", r.Addr, "--acl-user", "app")
	assert.Equal(t, verdictFail, f.Verdict)
	f = aclFinding(t, "--redis", r.Addr, "--acl-user", "app", "--prefix", "fencelock:")
	assert.Equal(t, verdictOK, f.Verdict, f.Evidence)
	assert.Contains(t, f.Evidence, "keys and channels fencelock:*")
	// Another prefix given: the fix names it, and no other.
	f = aclFinding(t, "--redis", r.Addr, "--acl-user", "app", "--prefix", "jobs:")
	assert.Equal(t, `user "app" may not use fence's keys (ACL DRYRUN): the keys jobs:* (--prefix), outside its key patterns ~fencelock:*; nor publish or subscribe on the channels jobs:*, outside its channel patterns &fencelock:* (`+slowWake+`)`, f.Evidence)
	assert.Equal(t, "ACL SETUSER app ~jobs:* &jobs:* (on every node)", f.Fix)
}

// fencectl's other commands name a key refused as a key, with the pattern
// that fixes it, not as a command or "see the redis checks": locks inspect
// fails with it, tokens show and doctor's tokens check carry it per
// resource.
func TestACLKeyRefusalFixes(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := testenv.NewRedisServer(t)
	db := migratedDB(t)
	_, err := db.Pool.Exec(ctx, `INSERT INTO fencelock.fence (resource, token, holder) VALUES ('job', 1, 'old')`)
	require.NoError(t, err)
	u := aclUser(t, r, "lib", "on", ">"+redisSecret, "~fencelock:*", "&fencelock:*", "+evalsha", "+eval", "+get", "+info", "+time")
	const fix = "ACL SETUSER lib ~fence:* (on every node): fence's keys are fence:* (the default prefix); or, if the application's locks use another prefix (fence.WithPrefix), give it with --prefix"

	code, out, errOut := fencectlProc(t, nil, "locks", "inspect", "job", "--redis", u)
	assert.Equal(t, exitFailed, code, out+errOut)
	assert.Equal(t, "fencectl: Redis at "+redactAddr(u)+` refused user "lib": fence: inspect "job": NOPERM this user has no permissions to access one of the keys used as arguments; fix: `+fix+"\n", errOut)

	code, out, errOut = fencectlProc(t, nil, "locks", "inspect", "job", "--redis", u, "--prefix", "jobs:")
	assert.Equal(t, exitFailed, code, out+errOut)
	assert.True(t, strings.HasSuffix(errOut, "; fix: ACL SETUSER lib ~jobs:* (on every node): fence's keys are jobs:* (--prefix)\n"), errOut)

	code, out, errOut = fencectlProc(t, nil, "tokens", "show", "--redis", u, "--db", db.URL, "-o", "json")
	require.Equal(t, exitOK, code, out+errOut)
	var states []tokenState
	require.NoError(t, json.Unmarshal([]byte(out), &states), out)
	require.Len(t, states, 1)
	assert.Equal(t, "error", states[0].Status)
	assert.Equal(t, `fence: inspect "job": NOPERM this user has no permissions to access one of the keys used as arguments`, states[0].Detail)
	assert.Equal(t, fix, states[0].Fix)

	code, out, errOut = fencectlProc(t, nil, "doctor", "--redis", u, "--db", db.URL)
	assert.Equal(t, exitFailed, code, out+errOut)
	assert.Contains(t, out, "FAIL  tokens             job: cannot read its counter or clock: fence: inspect \"job\": NOPERM")
	assert.Contains(t, out, "fix: "+fix+"\n")
	assert.NotContains(t, out, "see the redis checks")
	requireNoSecret(t, redisSecret, out, errOut)
}

// Doctor tells the causes apart too, as its redis check's evidence and fix.
func TestDoctorRedisWrongPassword(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	line, _ := docsACLLine(t, redisSecret)
	u := aclUser(t, r, line...)
	code, out, errOut := fencectlProc(t, []string{"REDIS_URL=" + strings.Replace(u, redisSecret, "wrong-"+redisSecret, 1)}, "doctor")
	assert.Equal(t, exitFailed, code, errOut)
	assert.Equal(t, []string{"redis"}, verdicts(out)["FAIL"], out)
	assert.Contains(t, out, `refused the login of user "app": WRONGPASS`)
	assert.Contains(t, out, `fix: check user "app" and its password in the address ($REDIS_URL)`)
	assert.NotContains(t, out, "not reachable")
	assert.NotContains(t, out, "--redis)")
	requireNoSecret(t, redisSecret, out, errOut)
}

// A password that is also the start of a word in the server's reply
// (WRONG, WRONGPASS) is masked in the address only.
func TestMaskOnlyTheAddress(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	line, _ := docsACLLine(t, redisSecret)
	u := aclUser(t, r, line...)
	wrong := strings.Replace(u, redisSecret, "WRONG", 1)
	for _, env := range [][]string{nil, {"REDIS_URL=" + wrong}} {
		args := []string{"locks", "inspect", "job"}
		if env == nil {
			args = append(args, "--redis", wrong)
		}
		code, out, errOut := fencectlProc(t, env, args...)
		assert.Equal(t, exitFailed, code, out+errOut)
		assert.Contains(t, errOut, "Redis at "+strings.Replace(wrong, "WRONG", "xxxxx", 1)+" refused")
		assert.Contains(t, errOut, "WRONGPASS invalid username-password pair", "the server's words are not masked")
		assert.NotContains(t, errOut, "app:WRONG@")
		assert.NotContains(t, errOut, "xxxxxPASS")
	}
}

func TestPostgresFailuresToldApart(t *testing.T) {
	t.Parallel()
	db := migratedDB(t)
	user, u := db.NewPasswordUser(t, pgSecret)
	wrong := strings.Replace(u, pgSecret, "not-"+pgSecret, 1)
	noPassword := strings.Replace(u, ":"+pgSecret+"@", "@", 1)
	dead := "postgres://" + user + ":" + pgSecret + "@" + testenv.RefusedAddr(t) + "/x?sslmode=disable"
	missing := strings.Replace(db.URL, "/"+db.Name+"?", "/nodb_"+db.Name+"?", 1)

	for _, tc := range []struct {
		name      string
		env, args []string
		want      string
	}{
		{"dead address", nil, []string{"--db", dead},
			` is not reachable: dial tcp [\d.:]+: connect: connection refused; fix: check the address \(--db\), that Postgres runs there, and that this host may reach it`},
		{"wrong password", nil, []string{"--db", wrong},
			` refused the login of user "` + user + `": FATAL: password authentication failed for user "` + user + `" \(SQLSTATE 28P01\); fix: check user "` + user + `" and its password in the address \(--db\)`},
		{"wrong password from the environment", []string{"DATABASE_URL=" + wrong}, nil,
			` refused the login .*28P01\); fix: check user "` + user + `" and its password in the address \(\$DATABASE_URL\)`},
		{"wrong PGPASSWORD", []string{"PGPASSWORD=not-" + pgSecret}, []string{"--db", noPassword},
			` refused the login .*28P01\); fix: check \$PGPASSWORD \(the address \(--db\) has no password, so it was used\)`},
		{"no password", []string{"PGPASSFILE=/nonexistent"}, []string{"--db", noPassword},
			` refused the login .*; fix: the address \(--db\) has no password: add user "` + user + `"'s`},
		{"no such database", nil, []string{"--db", missing},
			`: FATAL: database "nodb_` + db.Name + `" does not exist \(SQLSTATE 3D000\); fix: check the database name in the address \(--db\)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := fencectlProc(t, tc.env, append([]string{"tokens", "show"}, tc.args...)...)
			assert.Equal(t, exitFailed, code, out+errOut)
			assert.Regexp(t, `^fencectl: Postgres at \S+?`+tc.want, errOut)
			assert.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
			requireNoSecret(t, pgSecret, out, errOut)
			if tc.env == nil {
				assert.NotContains(t, errOut, "DATABASE_URL", "the address came from --db")
			}
		})
	}
}

// The schema's fix names the database it was given, not $DATABASE_URL
// (which points elsewhere), and pasted as printed it installs the schema
// there.
func TestSchemaFixNamesTheAddressGiven(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	other := migratedDB(t)
	bare := testenv.NewDB(t)
	_, u := bare.NewPasswordUser(t, pgSecret)
	env := []string{"DATABASE_URL=" + other.URL}

	code, out, errOut := fencectlProc(t, env, "tokens", "show", "--db", u)
	assert.Equal(t, exitFailed, code)
	assert.NotContains(t, out+errOut, "DATABASE_URL")
	assert.Contains(t, errOut, `the fencelock schema is not installed in database "`+bare.Name+`" at `+redactAddr(u))
	assert.Regexp(t, `; fix: fencectl migrate up --db '[^']+' \(with the password in place of xxxxx\)\n$`, errOut,
		"one fix, that works outside a checkout (the goose CLI's -dir migrations does not)")

	code, out, errOut = fencectlProc(t, env, "doctor", "--db", u)
	assert.Equal(t, exitFailed, code, errOut)
	assert.NotContains(t, out, "DATABASE_URL")
	m := regexp.MustCompile(`(?m)^\s+fix: (fencectl migrate up --db '([^']+)') \(with the password in place of xxxxx\)$`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	assert.Equal(t, redactAddr(u), m[2])
	requireNoSecret(t, pgSecret, out, errOut)

	// Pasted, with the password put back.
	args := strings.Fields(strings.ReplaceAll(strings.Replace(m[1], "xxxxx", pgSecret, 1), "'", ""))[1:]
	code, out, errOut = fencectlProc(t, env, args...)
	require.Equal(t, exitOK, code, out+errOut)
	var installed bool
	require.NoError(t, bare.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'fencelock')`).Scan(&installed))
	assert.True(t, installed, "the fix installed the schema in the database doctor checked")
}

// newLocksPrefix is a fence client on r with the given key prefix (the
// README's ACL line covers fence:*, not the test's own prefix).
func newLocksPrefix(t *testing.T, r *testenv.Redis, prefix string) *fence.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	locks, err := fence.New(rdb, fence.WithPrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = locks.Close(context.Background()) })
	return locks
}

// On a cluster, the README's line plus its cluster additions, set on every
// node, is enough for fencectl too: inspect follows the slot map (CLUSTER
// SLOTS) and doctor finds nothing missing on any master.
func TestREADMEACLUserCluster(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	c := testenv.NewRedisCluster(t, testenv.WithMasters(2), testenv.WithReplicas(0))
	line, extra := docsACLLine(t, redisSecret)
	for _, n := range c.Nodes {
		require.NoError(t, n.Client().Do(ctx, append(append([]any{"ACL", "SETUSER"}, line...), extra...)...).Err())
	}
	u := "redis://app:" + redisSecret + "@" + c.Nodes[0].Addr
	far := nameOn(t, c, c.Nodes[1], "fence:")

	code, out, errOut := fencectlProc(t, nil, "locks", "inspect", far, "--redis", u, "-o", "json")
	require.Equal(t, exitOK, code, out+errOut)
	assert.Contains(t, out, `"name": "`+far+`"`)

	code, out, errOut = fencectlProc(t, nil, "doctor", "--redis", u)
	assert.Equal(t, exitOK, code, out+errOut)
	assert.Empty(t, verdicts(out)["FAIL"], out)
	assert.Equal(t, 2, strings.Count(out, `user "app" may run every command fence uses`), out)
	requireNoSecret(t, redisSecret, out, errOut)

	// Keys outside the user's patterns, tried on the cluster (sharded
	// pub/sub needs no key, and its channels are still covered).
	for _, n := range c.Nodes {
		require.NoError(t, n.Client().Do(ctx, "ACL", "SETUSER", "app", "resetkeys", "~fencelock:*").Err())
	}
	code, out, errOut = fencectlProc(t, nil, "doctor", "--redis", u)
	assert.Equal(t, exitFailed, code, out+errOut)
	assert.Equal(t, 2, strings.Count(out, `user "app" may not use fence's keys (tried, since ACL DRYRUN is not allowed to this user; writes inside scripts not tried: --acl-user from an admin address checks them): the keys fence:* (the default prefix), outside its key patterns (not readable here: ACL GETUSER is refused)`+"\n"), out)
	assert.Equal(t, 2, strings.Count(out, "fix: ACL SETUSER app ~fence:* (on every node); or, if the application's locks use another prefix (fence.WithPrefix), give it with --prefix\n"), out)
	for _, n := range c.Nodes {
		require.NoError(t, n.Client().Do(ctx, "ACL", "SETUSER", "app", "~fence:*").Err())
	}

	// A node without the user: doctor says it refuses the login, not that
	// it is down.
	require.NoError(t, c.Nodes[1].Client().Do(ctx, "ACL", "DELUSER", "app").Err())
	code, out, errOut = fencectlProc(t, nil, "doctor", "--redis", u)
	assert.Equal(t, exitFailed, code, out+errOut)
	assert.Equal(t, []string{"redis.cluster"}, verdicts(out)["FAIL"], out)
	assert.Contains(t, out, "node "+c.Nodes[1].Addr+": a master that refuses the login: WRONGPASS")
	assert.Contains(t, out, `fix: check user "app" and its password in the address (--redis)`)
	assert.NotContains(t, out, "does not answer")
}

// plainRole creates a login role with no privilege on db's database and
// returns its name and db's URL as that role; the role and what it owns or
// was granted go at the end of the test.
func plainRole(t *testing.T, db *testenv.DB, suffix string) (role, dbURL string) {
	t.Helper()
	ctx := ctxT(t)
	role = "fc_" + suffix + "_" + db.Name
	_, err := db.Pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN PASSWORD '`+pgSecret+`'`)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = db.Pool.Exec(ctx, `DROP OWNED BY `+role)
		_, _ = db.Pool.Exec(ctx, `DROP ROLE `+role)
	})
	return role, withPassword(t, db.URL, role, pgSecret)
}

// sqlFix is a fix's SQL as printed: who runs it (psql's -U, "" for an
// admin), in which database (-d), one statement a line.
type sqlFix struct {
	role, db string
	stmts    []string
}

var fixHead = regexp.MustCompile(`connected to database "[^"]*" \(psql(?: -U (\S+))? -d (\S+)\), run:\n((?:  [^\n]*;\n?)+)`)

// fixIn reads the SQL fix in out: each statement on a line of its own,
// ending with ';', after the line that says whom to run them as and the
// database to connect to.
func fixIn(t *testing.T, out string) sqlFix {
	t.Helper()
	m := fixHead.FindStringSubmatch(out)
	require.NotNil(t, m, "the fix names no SQL to paste, a statement a line: %q", out)
	f := sqlFix{role: m[1], db: m[2]}
	for _, line := range strings.Split(strings.TrimRight(m[3], "\n"), "\n") {
		f.stmts = append(f.stmts, strings.TrimSuffix(strings.TrimPrefix(line, "  "), ";"))
	}
	return f
}

// paste runs f as printed: as its role (an admin when it names none) in
// its database, each statement as psql would, with the password of that
// role in passwords (the admin's is in db.URL).
func paste(t *testing.T, db *testenv.DB, f sqlFix, passwords map[string]string) {
	t.Helper()
	ctx := ctxT(t)
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	u.Path = "/" + f.db
	if f.role != "" && f.role != u.User.Username() {
		u.User = url.UserPassword(f.role, passwords[f.role])
	}
	conn, err := pgx.Connect(ctx, u.String())
	require.NoError(t, err, "connect as %q to database %q", f.role, f.db)
	defer conn.Close(context.Background())
	for _, stmt := range f.stmts {
		_, err := conn.Exec(ctx, stmt)
		require.NoError(t, err, "as %q in %q: %s", f.role, f.db, stmt)
	}
}

// A refusal by Postgres names the GRANT that allows what the command
// needed (reading, pruning, creating the schema), and pasted as printed it
// does: the command then succeeds as the same role.
func TestPostgresPermissionFixesWork(t *testing.T) {
	t.Parallel()
	db := migratedDB(t)
	const app = "GRANT USAGE ON SCHEMA fencelock TO %[1]s; GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO %[1]s"
	const reads = app + "; GRANT SELECT ON ALL TABLES IN SCHEMA fencelock TO %[1]s; GRANT SELECT ON fencelock_db_version TO %[1]s"
	for _, tc := range []struct {
		name  string
		setup []string // granted first, as the schema's owner
		args  []string
		want  string // the grants the fix prints, %[1]s for the role
	}{
		{"no usage on the schema", nil, []string{"tokens", "show"}, reads},
		{"the application's grants only", []string{
			"REVOKE SELECT ON ALL TABLES IN SCHEMA fencelock FROM PUBLIC", // the migrations' grant: a schema may run without it
			"GRANT USAGE ON SCHEMA fencelock TO %[1]s", "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO %[1]s"},
			[]string{"runs", "list"}, reads},
		{"prune with read grants", []string{"GRANT USAGE ON SCHEMA fencelock TO %[1]s", "GRANT SELECT ON ALL TABLES IN SCHEMA fencelock TO %[1]s"},
			[]string{"keys", "prune", "--older-than", "30d"}, app + "; GRANT SELECT, DELETE ON fencelock.applied, fencelock.runs TO %[1]s"},
		{"the version table", nil, []string{"migrate", "status"}, reads},
		{"doctor", nil, []string{"doctor"}, reads},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			role, u := plainRole(t, db, fmt.Sprintf("r%d", len(tc.name)))
			for _, g := range tc.setup {
				if strings.Contains(g, "%[1]s") {
					g = fmt.Sprintf(g, role)
				}
				_, err := db.Pool.Exec(ctx, g)
				require.NoError(t, err)
			}
			args := append(append([]string{}, tc.args...), "--db", u)
			code, out, errOut := fencectlProc(t, nil, args...)
			require.Equal(t, exitFailed, code, out+errOut)
			msg := errOut
			if tc.args[0] == "doctor" {
				msg = out // each check's evidence, then its fix
				assert.Regexp(t, `(?m)^FAIL\s+migrations\s+cannot read the version table fencelock_db_version: Postgres at \S+ refused user "`+role+`": ERROR: permission denied[^;]*\(SQLSTATE 42501\)\n\s+fix: run fencectl as`, out)
			} else {
				assert.Regexp(t, `^fencectl: Postgres at \S+ refused user "`+role+`": ERROR: permission denied[^;]*\(SQLSTATE 42501\); fix: run fencectl as the fencelock schema's owner \(role \w+\), or grant`, errOut)
			}
			fix := fixIn(t, msg)
			assert.Equal(t, fmt.Sprintf(tc.want, role), strings.Join(fix.stmts, "; "))
			assert.Equal(t, db.Name, fix.db, "the database to connect to")
			requireNoSecret(t, pgSecret, out, errOut)
			paste(t, db, fix, nil) // the owner: the admin here
			code, out, errOut = fencectlProc(t, nil, args...)
			assert.Equal(t, exitOK, code, "after the fix: "+out+errOut)
		})
	}
}

// migrate up as a role that may not create the schema, on a database
// never migrated, names the grants an admin runs connected to that
// database, which pasted there make migrate up work. After that owner's
// migrate down, migrate up as another role is told that only the owner of
// the version table it left can mend it (not a grant that changes
// nothing); the owner's statement pasted, and the grants for the new role,
// migrate up works. migrate down as a role that is not the schema's owner
// names the owner to run it as, and no grant.
func TestMigratePermissionFixesWork(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	role, u := plainRole(t, db, "mig")
	pw := map[string]string{role: pgSecret}
	code, out, errOut := fencectlProc(t, nil, "migrate", "up", "--db", u)
	require.Equal(t, exitFailed, code, out+errOut)
	assert.Contains(t, errOut, "fix: run migrate as the role that is to own the fencelock schema, or let this one create it: as an admin (a superuser, or the database's owner), connected to database ")
	fix := fixIn(t, errOut)
	assert.Equal(t, db.Name, fix.db)
	assert.Empty(t, fix.role, "an admin")
	paste(t, db, fix, pw)
	code, out, errOut = fencectlProc(t, nil, "migrate", "up", "--db", u)
	require.Equal(t, exitOK, code, "after the fix: "+out+errOut)
	assert.Contains(t, out, "applied 00001_tables.sql")

	other, otherURL := plainRole(t, db, "oth")
	pw[other] = pgSecret
	code, out, errOut = fencectlProc(t, nil, "migrate", "down", "--force", "--yes", "--db", otherURL)
	require.Equal(t, exitFailed, code, out+errOut)
	assert.Regexp(t, `refused user "`+other+`": .*; fix: only the owner of schema fencelock, role `+role+`, may change it: run migrate as that role \(its user and password in the address \(--db\)\)\n$`, errOut)
	assert.NotContains(t, errOut, "GRANT", "no grant mends what only the owner may do")

	code, out, errOut = fencectlProc(t, nil, "migrate", "down", "--force", "--yes", "--db", u)
	require.Equal(t, exitOK, code, out+errOut)
	code, out, errOut = fencectlProc(t, nil, "migrate", "up", "--db", otherURL)
	require.Equal(t, exitFailed, code, out+errOut)
	assert.Contains(t, errOut, "fix: only role "+role+", which owns the version table fencelock_db_version (left by its migrate down), can mend this: ")
	fix = fixIn(t, errOut)
	assert.Equal(t, sqlFix{role: role, db: db.Name, stmts: []string{"DROP TABLE fencelock_db_version"}}, fix)
	paste(t, db, fix, pw)
	code, out, errOut = fencectlProc(t, nil, "migrate", "up", "--db", otherURL)
	require.Equal(t, exitFailed, code, out+errOut)
	paste(t, db, fixIn(t, errOut), pw) // the admin's grants for this role
	code, out, errOut = fencectlProc(t, nil, "migrate", "up", "--db", otherURL)
	require.Equal(t, exitOK, code, "after the fixes: "+out+errOut)
}

// selfSignedCert writes a self-signed certificate for 127.0.0.1 and its key
// into dir and returns their paths.
func selfSignedCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "fencectl test"},
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	return certFile, keyFile
}

// TLS on one side only is named as such, not as a dead or slow server: a
// TLS port closes a plain connection at once, a plain port never answers a
// TLS handshake, and a certificate this host does not trust is a
// certificate problem. Each fix, applied, makes the command work.
func TestRedisTLSMismatch(t *testing.T) {
	t.Parallel()
	cert, key := selfSignedCert(t, t.TempDir())
	port, err := testenv.ReservePort()
	require.NoError(t, err)
	tlsPort := strconv.Itoa(port)
	tlsAddr := "127.0.0.1:" + tlsPort
	r := testenv.NewRedisServer(t, testenv.WithRedisArgs("--tls-port", tlsPort, "--tls-cert-file", cert,
		"--tls-key-file", key, "--tls-ca-cert-file", cert, "--tls-auth-clients", "no"))
	trusted := []string{"SSL_CERT_FILE=" + cert}

	code, out, errOut := fencectlProc(t, nil, "locks", "inspect", "job", "--redis", "redis://"+tlsAddr)
	assert.Equal(t, exitFailed, code, out+errOut)
	assert.Equal(t, "fencectl: Redis at redis://"+tlsAddr+" closed the connection at once: EOF; fix: if the server requires TLS, use rediss:// in the address (--redis); else its log says why it closed the connection\n", errOut)

	code, out, errOut = fencectlProc(t, nil, "locks", "inspect", "job", "--redis", "rediss://"+tlsAddr)
	assert.Equal(t, exitFailed, code, out+errOut)
	assert.Regexp(t, `^fencectl: Redis at rediss://`+regexp.QuoteMeta(tlsAddr)+` sent a certificate this host does not trust: tls: failed to verify certificate: x509: .*; fix: give this host the CA that signed the server's certificate \(SSL_CERT_FILE=ca.pem fencectl …, or the system's trust store\)`, errOut)
	code, out, errOut = fencectlProc(t, trusted, "locks", "inspect", "job", "--redis", "rediss://"+tlsAddr)
	assert.Equal(t, exitOK, code, "with the CA given: "+out+errOut)

	code, out, errOut = fencectlProc(t, trusted, "locks", "inspect", "job", "--timeout", "2s", "--redis", "rediss://"+r.Addr)
	assert.Equal(t, exitFailed, code, out+errOut)
	assert.Equal(t, "fencectl: Redis at rediss://"+r.Addr+" did not answer within 2s (--timeout); fix: if the server does not speak TLS, use redis:// instead of rediss:// in the address (--redis); else check that redis-server at that address runs and is not stopped or overloaded, and that this host may reach it; or raise --timeout\n", errOut)
	code, out, errOut = fencectlProc(t, nil, "locks", "inspect", "job", "--redis", "redis://"+r.Addr)
	assert.Equal(t, exitOK, code, out+errOut)
}
