package fence_test

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

const (
	serverPassword = "s3rver-pw"
	appPassword    = "app-s3cret"
	wrongPassword  = "not-the-pw"
	docsLink       = "https://github.com/fencelock/fencelock/blob/main/docs/operations.md#redis"
)

// Every refused login or command from TryAcquire, Acquire and Do names
// the server's refusal once and ends with the fix: for WRONGPASS and
// NOAUTH the user the client logs in as and where its password goes
// (never a password), for NOPERM the ACL SETUSER addition and where the
// whole ACL line is. The error still matches the server's (errors.As a
// redis.Error, redis.IsAuthError, redis.IsPermissionError). The servers
// are real: a requirepass, ACL users without a password given, with a
// wrong one, without EVALSHA, without EVAL, outside their key pattern,
// and without a command fence's scripts run.
func TestAcquireNamesAccessFix(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 30*time.Second)
	admin := r.Client()
	acl := func(user string, rules ...string) {
		args := []any{"ACL", "SETUSER", user, "on", ">" + appPassword, "&*"}
		for _, rule := range rules {
			args = append(args, rule)
		}
		require.NoError(t, admin.Do(ctx, args...).Err())
	}
	acl("app", "~*", "+@all")
	acl("noevalsha", "~*", "+@all", "-evalsha")
	acl("noeval", "~*", "+@all", "-eval")
	acl("otherkeys", "~other:*", "+@all")
	acl("noset", "~*", "+@all", "-set")
	cli := "as an admin, redis-cli" + hostPort(r.Addr) + " ACL SETUSER "
	aclTail := "; the whole line fence needs: " + docsLink

	type tc struct {
		name string
		opts redis.Options
		url  string // instead of opts
		// reply is the server's refusal as the error gives it, fix what
		// follows "; fix: ".
		reply, fix string
		auth       bool // a login refused (else a command)
		flush      bool // empty the script cache first (EVAL is then sent)
	}
	cases := []tc{
		{name: "wrong password of an ACL user", opts: redis.Options{Username: "app", Password: wrongPassword},
			reply: "WRONGPASS invalid username-password pair or user is disabled", auth: true,
			fix: `check Redis user "app" and its password: the client's Options.Username and Options.Password, ` +
				`or app:PASSWORD@ in its URL (ACL GETUSER app on the server shows whether the user exists and is on)`},
		{name: "wrong password in the URL", url: "redis://app:" + wrongPassword + "@" + r.Addr,
			reply: "WRONGPASS invalid username-password pair or user is disabled", auth: true,
			fix: `check Redis user "app" and its password: the client's Options.Username and Options.Password, ` +
				`or app:PASSWORD@ in its URL (ACL GETUSER app on the server shows whether the user exists and is on)`},
		{name: "an ACL user without its password", opts: redis.Options{Username: "app"},
			reply: "NOAUTH Authentication required", auth: true,
			fix: `give Redis user "app" its password: the client's Options.Password, or app:PASSWORD@ in its URL`},
		{name: "no EVALSHA", opts: redis.Options{Username: "noevalsha", Password: appPassword},
			reply: "NOPERM this user has no permissions to run the 'evalsha' command",
			fix:   cli + "noevalsha +evalsha +eval" + aclTail},
		{name: "no EVAL after a script-cache miss", opts: redis.Options{Username: "noeval", Password: appPassword}, flush: true,
			reply: "NOPERM this user has no permissions to run the 'eval' command",
			fix:   cli + "noeval +evalsha +eval" + aclTail},
		{name: "keys outside the user's pattern", opts: redis.Options{Username: "otherkeys", Password: appPassword},
			reply: "NOPERM this user has no permissions to access one of the keys used as arguments",
			fix:   cli + "otherkeys '~" + r.Prefix + "fence:*'" + aclTail},
		{name: "a command inside the script", opts: redis.Options{Username: "noset", Password: appPassword},
			reply: "ERR The user executing the script can't run this command or subcommand script: ",
			fix: cli + "noset '~" + r.Prefix + "fence:*' '&" + r.Prefix + "fence:*' +evalsha +eval +get +exists +set +pexpire +pttl +del +time " +
				"+lindex +lpop +rpush +lrem +hget +hset +hdel +hexists +publish" + aclTail},
	}
	// The default user with a password (requirepass) last: the admin
	// client logs in as it.
	require.NoError(t, admin.ConfigSet(ctx, "requirepass", serverPassword).Err())
	require.NoError(t, admin.Do(ctx, "AUTH", serverPassword).Err())
	cases = append(cases,
		tc{name: "requirepass, no password given", opts: redis.Options{},
			reply: "NOAUTH Authentication required", auth: true,
			fix: "the server needs a password: set the client's Options.Password (and Options.Username for an ACL user), " +
				"or :PASSWORD@ (USER:PASSWORD@ for an ACL user) in its URL"},
		tc{name: "requirepass, wrong password", opts: redis.Options{Password: wrongPassword},
			reply: "WRONGPASS invalid username-password pair or user is disabled", auth: true,
			fix: `check the password of user "default" (the server's requirepass): the client's Options.Password, ` +
				"or :PASSWORD@ in its URL; for an ACL user set Options.Username too (USER:PASSWORD@)"})

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := c.opts
			if c.url != "" {
				u, err := redis.ParseURL(c.url)
				require.NoError(t, err)
				o = *u
			}
			o.Addr, o.MaxRetries = r.Addr, -1
			rdb := redis.NewClient(&o)
			t.Cleanup(func() { _ = rdb.Close() })
			f := newClient(t, r, rdb)
			calls := map[string]func() error{
				"TryAcquire": func() error { _, err := f.TryAcquire(ctx, "job"); return err },
				"Acquire":    func() error { _, err := f.Acquire(ctx, "job"); return err },
				"Do": func() error {
					return f.Do(ctx, "job", func(context.Context, *fence.Lock) error { return nil })
				},
			}
			for call, run := range calls {
				if c.flush {
					require.NoError(t, admin.ScriptFlush(ctx).Err())
				}
				err := run()
				require.Error(t, err, call)
				msg := err.Error()
				t.Logf("%s: %s", call, msg)
				assert.True(t, strings.HasPrefix(msg, `fence: acquire "job": `+c.reply), "%s: %s", call, msg)
				assert.True(t, strings.HasSuffix(msg, "; fix: "+c.fix), "%s: ends with the fix %q", call, c.fix)
				assert.Equal(t, 1, strings.Count(msg, "; fix: "), call)
				assert.NotContains(t, msg, "\n", call)
				for _, pw := range []string{serverPassword, appPassword, wrongPassword} {
					assert.NotContains(t, msg, pw, "%s: no password in the message", call)
				}
				var rerr redis.Error
				assert.True(t, errors.As(err, &rerr), "%s: errors.As a redis.Error", call)
				if c.auth {
					assert.True(t, redis.IsAuthError(err), "%s: redis.IsAuthError", call)
				} else if !strings.HasPrefix(c.reply, "ERR") {
					assert.True(t, redis.IsPermissionError(err), "%s: redis.IsPermissionError", call)
				}
				assert.False(t, errors.Is(err, fence.ErrNotAcquired), "%s: a refusal is not contention", call)
			}
		})
	}
}

// The link in a NOPERM fix leads to the ACL line, and the commands the
// fix for a refusal inside a script grants are all on that line.
func TestAccessFixLinkHoldsTheACLLine(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	doc := string(b)
	anchor := docsLink[strings.Index(docsLink, "#")+1:]
	i := strings.Index(doc, "\n## Redis\n")
	require.GreaterOrEqual(t, i, 0, "docs/operations.md has no '## Redis' heading (the anchor #%s)", anchor)
	section := doc[i+1:]
	if j := strings.Index(section[3:], "\n## "); j >= 0 {
		section = section[:j+3]
	}
	m := regexp.MustCompile("`ACL SETUSER app on >… ([^`]+)`").FindStringSubmatch(section)
	require.NotNil(t, m, "no `ACL SETUSER app on >… …` line under ## Redis")
	line := strings.Fields(m[1])
	for _, cmd := range strings.Fields("+evalsha +eval +get +exists +set +pexpire +pttl +del +time +lindex +lpop +rpush +lrem +hget +hset +hdel +hexists +publish") {
		assert.Contains(t, line, cmd, "the fix grants %s; the docs' line must have it", cmd)
	}
}
