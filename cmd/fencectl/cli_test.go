package main

import (
	"encoding/json"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/testenv"
)

func TestUsageErrors(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("REDIS_URL", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"nope"}, `unknown command "nope"`},
		{[]string{"migrate"}, "migrate needs a subcommand: down, status, up"},
		{[]string{"migrate", "sideways"}, `migrate "sideways": unknown subcommand`},
		{[]string{"migrate", "status"}, "no Postgres: give --db"},
		{[]string{"tokens", "show"}, "no Postgres: give --db"},
		{[]string{"tokens", "repair", "--db", "127.0.0.1:1"}, "give the RESOURCE names to repair, or --all"},
		{[]string{"locks", "inspect"}, "give at least one lock NAME"},
		{[]string{"locks", "inspect", "x"}, "no Redis: give --redis"},
		{[]string{"locks", "inspect", "x", "--db", "y"}, "unknown flag: --db"},
		{[]string{"locks", "inspect", "x", "-o", "yaml", "--redis", "127.0.0.1:1"}, `-o "yaml": want table or json`},
		{[]string{"locks", "release", "x", "--redis", "127.0.0.1:1"}, "add --force"},
		{[]string{"migrate", "down", "--db", "127.0.0.1:1"}, "add --force"},
		{[]string{"locks", "list", "a", "b"}, "accepts at most 1 arg"},
		{[]string{"locks", "release", "a", "b", "--force"}, "accepts 1 arg"},
		{[]string{"migrate", "up", "now"}, `unknown command "now"`},
		{[]string{"locks", "inspect", "x", "--redis", "redis://127.0.0.1:notaport"}, "Redis address redis://127.0.0.1:notaport"},
		{[]string{"runs", "prune"}, "give --older-than AGE"},
		{[]string{"keys", "prune", "--older-than", "soon"}, `--older-than "soon": want a duration`},
		{[]string{"runs", "list", "--state", "sleeping"}, `--state "sleeping"`},
		{[]string{"doctor"}, "doctor needs --redis and --db"},
		{[]string{"doctor", "--timeout", "forever"}, `invalid argument "forever" for "--timeout"`},
	} {
		code, out, errOut := fencectl(t, tc.args...)
		assert.Equal(t, exitUsage, code, "args %q: %s%s", tc.args, out, errOut)
		assert.Contains(t, errOut, tc.want, "args %q", tc.args)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		assert.Len(t, lines, 2, "args %q: one line saying what is wrong, one pointing at --help: %q", tc.args, errOut)
		assert.Contains(t, errOut, "--help' for usage", "args %q", tc.args)
	}
}

func TestHelpPerCommand(t *testing.T) {
	for _, tc := range []struct {
		args          []string
		want, notWant []string
	}{
		{[]string{"--help"}, []string{"migrate", "locks", "tokens", "runs", "keys", "doctor", "--version"}, nil},
		{[]string{"migrate", "-h"}, []string{"up", "down", "status"}, []string{"--redis"}},
		{[]string{"migrate", "status", "--help"}, []string{"--db", "--output"}, []string{"--redis"}},
		{[]string{"locks", "inspect", "-h"}, []string{"--redis", "--prefix", "--output"}, []string{"--db"}},
		{[]string{"locks", "list", "-h"}, []string{"--redis", "--prefix", "--output", "PATTERN", "SCAN"}, []string{"--db"}},
		{[]string{"migrate", "down", "-h"}, []string{"--force", "--yes", "--unprotect", "--db"}, []string{"--redis", "--output"}},
		{[]string{"locks", "release", "-h"}, []string{"--force", "--yes", "--redis"}, []string{"--db", "--output"}},
		// The address forms in help are shown whole, not mistaken for a URL
		// with a password and masked.
		{[]string{"tokens", "show", "-h"}, []string{"--db", "--redis", "--output", "postgres://user[:password]@host"}, []string{"xxxxx"}},
		{[]string{"tokens", "repair", "-h"}, []string{"--db", "--redis", "--all"}, []string{"--output"}},
		{[]string{"runs", "list", "-h"}, []string{"--db", "--state", "--output"}, []string{"--redis"}},
		{[]string{"runs", "prune", "-h"}, []string{"--older-than", "--dry-run"}, []string{"--redis"}},
		{[]string{"keys", "prune", "-h"}, []string{"--older-than", "--dry-run"}, []string{"--redis"}},
		{[]string{"doctor", "-h"}, []string{"--redis", "--db", "--output", "--acl-user", "maxmemory-policy"}, nil},
		{[]string{"help", "doctor"}, []string{"--acl-user"}, nil},
	} {
		code, out, errOut := fencectl(t, tc.args...)
		assert.Equal(t, exitOK, code, "args %q: %s", tc.args, errOut)
		for _, w := range tc.want {
			assert.Contains(t, out, w, "args %q", tc.args)
		}
		for _, w := range tc.notWant {
			assert.NotContains(t, out, w, "args %q lists a flag the command does not use", tc.args)
		}
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := fencectl(t, "--version")
	require.Equal(t, exitOK, code)
	assert.Regexp(t, `^fencectl .+ go1\.\d+`, out)
	assert.NotContains(t, out, "(devel)")

	// What the build info gives, never "(devel)".
	vcs := func(kv ...string) *debug.BuildInfo {
		bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/fencelock/fencelock", Version: "(devel)"}}
		for i := 0; i < len(kv); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return bi
	}
	rev := "1021518abcdef0123456789"
	for _, tc := range []struct {
		v    string
		bi   *debug.BuildInfo
		want string
	}{
		{"v0.2.0", vcs("vcs.revision", rev), "v0.2.0 1021518abcde"},
		{"", &debug.BuildInfo{Main: debug.Module{Version: "v0.2.0"}}, "v0.2.0"},
		{"", &debug.BuildInfo{Main: debug.Module{Version: "v0.1.1-0.20261206010812-1021518abcde+dirty"}, Settings: vcs("vcs.revision", rev).Settings}, "v0.1.1-0.20261206010812-1021518abcde+dirty"},
		{"", vcs("vcs.revision", rev, "vcs.time", "2026-12-06T01:08:12Z", "vcs.modified", "true"), "commit 1021518abcde (2026-12-06T01:08:12Z) with uncommitted changes"},
		{"", vcs(), "a development build of github.com/fencelock/fencelock (no version or commit recorded: built with go run, go test or -buildvcs=false)"},
	} {
		assert.Equal(t, tc.want, describeVersion(tc.v, tc.bi))
	}
}

// Flags may come before or after the arguments, as --flag value or --flag=value.
func TestFlagsBeforeOrAfterArgs(t *testing.T) {
	r := testenv.NewRedis(t)
	for _, args := range [][]string{
		{"locks", "inspect", "job", "--redis", r.Addr, "--prefix", r.Prefix, "-o", "json"},
		{"locks", "inspect", "--redis", r.Addr, "-o", "json", "--prefix=" + r.Prefix, "job"},
		{"locks", "--redis=" + r.URL, "inspect", "job", "--prefix", r.Prefix, "--output=json"},
	} {
		code, out, errOut := fencectl(t, args...)
		require.Equal(t, exitOK, code, "args %q: %s", args, errOut)
		var got []lockJSON
		require.NoError(t, json.Unmarshal([]byte(out), &got), out)
		require.Len(t, got, 1)
		assert.Equal(t, "job", got[0].Name)
	}
}

// host:port and URLs are both accepted, for Redis and Postgres, and from the
// environment.
func TestAddressForms(t *testing.T) {
	r := testenv.NewRedis(t)
	db := migratedDB(t)
	for _, addr := range []string{r.Addr, r.URL} {
		code, _, errOut := fencectl(t, "locks", "inspect", "x", "--redis", addr)
		assert.Equal(t, exitOK, code, "%s: %s", addr, errOut)
	}
	t.Setenv("REDIS_URL", r.Addr)
	code, _, errOut := fencectl(t, "locks", "inspect", "x")
	assert.Equal(t, exitOK, code, errOut)

	// host:port for Postgres takes user and database from libpq's variables.
	host := db.Server.Addr
	t.Setenv("PGUSER", "postgres")
	t.Setenv("PGDATABASE", db.Name)
	t.Setenv("PGSSLMODE", "disable")
	for _, addr := range []string{db.URL, host, "host=" + strings.Split(host, ":")[0] + " port=" + strings.Split(host, ":")[1] + " dbname=" + db.Name} {
		code, out, errOut := fencectl(t, "migrate", "status", "--db", addr)
		assert.Equal(t, exitOK, code, "%s: %s", addr, errOut)
		assert.Contains(t, out, "applied", addr)
	}
}

// A dead server is one line on stderr, naming it (password redacted), with
// nothing from the client libraries.
func TestDeadServerIsOneLine(t *testing.T) {
	const secret = "dead-Pa55word"
	for _, args := range [][]string{
		{"locks", "inspect", "x", "--redis", "redis://ops:" + secret + "@127.0.0.1:1"},
		{"tokens", "show", "--db", "postgres://postgres:" + secret + "@127.0.0.1:1/x?sslmode=disable"},
		{"migrate", "up", "--db", "127.0.0.1:1"},
		{"locks", "inspect", "x", "--redis", "127.0.0.1:1"},
	} {
		code, out, errOut := fencectlProc(t, nil, args...)
		assert.Equal(t, exitFailed, code, "args %q", args)
		assert.Empty(t, out)
		assert.Equal(t, 1, strings.Count(errOut, "\n"), "args %q: one line: %q", args, errOut)
		assert.Contains(t, errOut, "is not reachable")
		assert.Contains(t, errOut, "127.0.0.1:1")
		assert.NotContains(t, errOut, "pool.go")
		requireNoSecret(t, secret, out, errOut)
	}
}

// Passwords never appear, in any output or error of any command, whether
// they come from a flag, --flag=value or the environment.
func TestPasswordNeverPrinted(t *testing.T) {
	ctx := ctxT(t)
	const secret = "s3cret-Pa55word"
	r := testenv.NewRedisServer(t)
	require.NoError(t, r.Client().Do(ctx, "ACL", "SETUSER", "ops", "on", ">"+secret, "~*", "&*", "+@all").Err())
	redisURL := withPassword(t, r.URL, "ops", secret)
	db := migratedDB(t)
	dbURL := withPassword(t, db.URL, "postgres", secret) // trust auth: the password is carried, not checked

	for _, tc := range []struct {
		env  []string
		args []string
	}{
		{nil, []string{"doctor", "--redis", redisURL, "--db", dbURL}},
		{nil, []string{"doctor", "--redis=" + redisURL, "--db=" + dbURL, "-o", "json"}},
		{[]string{"REDIS_URL=" + redisURL, "DATABASE_URL=" + dbURL}, []string{"doctor"}},
		{[]string{"REDIS_URL=" + redisURL, "DATABASE_URL=" + dbURL}, []string{"tokens", "show"}},
		{nil, []string{"locks", "inspect", "x", "--redis", redisURL}},
		{nil, []string{"migrate", "status", "--db", dbURL}},
		{nil, []string{"locks", "inspect", "x", "--redis", strings.Replace(redisURL, r.Addr, "127.0.0.1:notaport", 1)}},
		{nil, []string{"locks", "inspect", "x", "--redis", strings.Replace(redisURL, secret, secret+"-wrong", 1)}},
		{nil, []string{"migrate", "status", "--db", strings.Replace(dbURL, "sslmode=disable", "sslmode=bogus", 1)}},
		{nil, []string{"locks", "inspect", "--bogus-flag", redisURL}},
		{nil, []string{"migrate", "status", "--db", "host=127.0.0.1 port=1 password=" + secret}},
	} {
		_, out, errOut := fencectlProc(t, tc.env, tc.args...)
		requireNoSecret(t, secret, out, errOut)
		assert.NotEmpty(t, out+errOut, "args %q", tc.args)
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"redis://ops:pw@h:1/0":               "redis://ops:xxxxx@h:1/0",
		"redis://:pw@h:1":                    "redis://:xxxxx@h:1",
		"h:6379":                             "h:6379",
		"postgres://u:p%40ss@h/db?sslmode=x": "postgres://u:xxxxx@h/db?sslmode=x",
		"postgres://u@h/db?password=p":       "postgres://u@h/db?password=xxxxx",
		"host=h password='a b' dbname=x":     "host=h password=xxxxx dbname=x",
		"host=h password=secret user=u":      "host=h password=xxxxx user=u",
		"not a url redis://a:b@c and more":   "not a url redis://a:xxxxx@c and more",
	} {
		assert.Equal(t, want, redactAddr(in), in)
	}
	var h strings.Builder
	hs := newScrubber(&h, nil)
	_, _ = hs.Write([]byte("postgres://user[:password]@host:port/db or redis://[user:password@]host:port\n"))
	assert.Equal(t, "postgres://user[:password]@host:port/db or redis://[user:password@]host:port\n", h.String(), "usage text is not a URL with a password")
	secrets := collectSecrets([]string{"--db=postgres://u:p%40ss@h/db", "redis://:pw2@h"})
	assert.Contains(t, secrets, "p@ss")
	assert.Contains(t, secrets, "p%40ss")
	assert.Contains(t, secrets, "pw2")
	var b strings.Builder
	s := newScrubber(&b, secrets)
	_, _ = s.Write([]byte("error: postgres://u:p"))
	_, _ = s.Write([]byte("@ss@h/db and redis://:pw2@h\nlast postgres://u:p%40ss@h/db"))
	s.Flush()
	assert.Equal(t, "error: postgres://u:xxxxx@h/db and redis://:xxxxx@h\nlast postgres://u:xxxxx@h/db", b.String(),
		"a password split across writes is still caught, an unescaped @ in it too")

	// Only inside addresses: the server's words stay as they are.
	b.Reset()
	s = newScrubber(&b, collectSecrets([]string{"redis://app:WRONG@h:1", "host=h password=pw2"}))
	_, _ = s.Write([]byte("Redis at redis://app:WRONG@h:1 refused: WRONGPASS invalid username-password pair; pw2 at host=h password=pw2 user=u\n"))
	assert.Equal(t, "Redis at redis://app:xxxxx@h:1 refused: WRONGPASS invalid username-password pair; pw2 at host=h password=xxxxx user=u\n", b.String())
}

// A server that accepts connections but never answers (SIGSTOPped) is one
// line too, after --timeout.
func TestStalledServerIsOneLine(t *testing.T) {
	r := testenv.NewRedisServer(t)
	require.NoError(t, r.Pause())
	t.Cleanup(func() { _ = r.Resume() })
	code, out, errOut := fencectlProc(t, nil, "locks", "inspect", "x", "--redis", r.Addr, "--timeout", "1s")
	assert.Equal(t, exitFailed, code)
	assert.Empty(t, out)
	assert.Equal(t, "fencectl: Redis at "+r.Addr+" did not answer within 1s (--timeout); fix: check that redis-server at that address runs and is not stopped or overloaded, and that this host may reach it; or raise --timeout\n", errOut)
}
