package fence

import (
	"errors"
	"regexp"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Refused logins and commands. Redis names what it refused (WRONGPASS,
// NOAUTH, NOPERM with the command) but not what to change on the client;
// the calls that meet such a refusal add the fix, naming the user the
// client logs in as (never its password) and the command to grant.

// aclLineURL is where the whole ACL line fence needs is written down.
const aclLineURL = "https://github.com/fencelock/fencelock/blob/main/docs/operations.md#redis"

// aclScriptCommands are the commands fence's scripts run, and the
// scripts' own EVALSHA and EVAL, as the ACL line of docs/operations.md
// gives them; a cluster adds SPUBLISH (and, outside the scripts,
// SSUBSCRIBE and CLUSTER SLOTS).
const aclScriptCommands = "+evalsha +eval +get +exists +set +pexpire +pttl +del +time " +
	"+lindex +lpop +rpush +lrem +hget +hset +hdel +hexists +publish"

// accessError is a refused login or command with its fix. It unwraps to
// the server's error (errors.Is, errors.As, redis.IsAuthError and
// redis.IsPermissionError still see it).
type accessError struct {
	err error
	fix string
}

func (e *accessError) Error() string {
	return strings.TrimSuffix(e.err.Error(), ".") + "; fix: " + e.fix
}

func (e *accessError) Unwrap() error { return e.err }

// withFix returns err with the fix when Redis refused the client's login
// or a command, else err itself.
func (c *Client) withFix(err error) error {
	var ae *accessError
	if err == nil || errors.As(err, &ae) {
		return err
	}
	if fix := c.accessFix(err); fix != "" {
		return &accessError{err: err, fix: fix}
	}
	return err
}

// noPermCommand finds the command a NOPERM reply names: "... no
// permissions to run the 'evalsha' command".
var noPermCommand = regexp.MustCompile(`run the '([^']+)' command`)

// accessFix is the fix for a refusal, "" for any other error.
func (c *Client) accessFix(err error) string {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return ""
	}
	msg := rerr.Error()
	lg := c.login()
	switch {
	case strings.HasPrefix(msg, "WRONGPASS"):
		return lg.wrongPassFix()
	case strings.HasPrefix(msg, "NOAUTH"):
		return lg.noAuthFix()
	case strings.Contains(msg, "without any password configured"):
		return "the server has no password for user \"default\": remove the client's Options.Password " +
			"(or the password in its URL), or set Options.Username to the ACL user it belongs to"
	case strings.HasPrefix(msg, "NOPERM"):
		if m := noPermCommand.FindStringSubmatch(msg); m != nil {
			grant := "+" + strings.ToLower(m[1])
			if grant == "+evalsha" || grant == "+eval" {
				grant = "+evalsha +eval" // EVAL after a script-cache miss, EVALSHA otherwise
			}
			return c.aclFix(lg, grant)
		}
		pattern := "~" // keys; Redis says "channels" for a refused channel
		if strings.Contains(msg, "channel") {
			pattern = "&"
		}
		return c.aclFix(lg, shellQuote(pattern+aclGlobEscape(c.cfg.prefix)+"*"))
	case strings.Contains(msg, "The user executing the script can't"):
		// A command inside a script, which Redis does not name.
		cmds := aclScriptCommands
		if c.cluster {
			cmds += " +spublish"
		}
		keys := aclGlobEscape(c.cfg.prefix) + "*"
		return c.aclFix(lg, shellQuote("~"+keys)+" "+shellQuote("&"+keys)+" "+cmds)
	}
	return ""
}

// aclFix is the ACL SETUSER command that grants what was refused, with
// where to run it and where the whole line is.
func (c *Client) aclFix(lg login, grant string) string {
	user := "<user>"
	if lg.known {
		user = shellQuote(lg.user)
	}
	fix := "as an admin, redis-cli" + hostPortArgs(c.nodeAddr()) + " ACL SETUSER " + user + " " + grant
	if c.cluster {
		fix += " on every node (ACL rules are per node)"
	}
	if !lg.known {
		fix += " (<user> is the client's Redis user: ACL WHOAMI with its credentials names it)"
	}
	return fix + "; the whole line fence needs: " + aclLineURL
}

// login is how the client logs in, as its options say.
type login struct {
	user     string // "default" when the options name no user
	named    bool   // Options.Username was given
	password bool   // Options.Password was given
	known    bool   // false: a credentials provider, or a client fence cannot read
}

func (c *Client) login() login {
	var user, password string
	var provider bool
	switch rdb := c.rdb.(type) {
	case *redis.Client:
		o := rdb.Options()
		user, password = o.Username, o.Password
		provider = o.CredentialsProvider != nil || o.CredentialsProviderContext != nil || o.StreamingCredentialsProvider != nil
	case *redis.ClusterClient:
		o := rdb.Options()
		user, password = o.Username, o.Password
		provider = o.CredentialsProvider != nil || o.CredentialsProviderContext != nil || o.StreamingCredentialsProvider != nil
	default:
		return login{}
	}
	if provider {
		return login{}
	}
	lg := login{user: user, named: user != "", password: password != "", known: true}
	if !lg.named {
		lg.user = "default" // AUTH <password> logs in as the default user
	}
	return lg
}

// wrongPassFix: the server has the user, or not, but not that password.
func (lg login) wrongPassFix() string {
	switch {
	case !lg.known:
		return "check the Redis user and password the client's credentials provider gives"
	case lg.named:
		return "check Redis user " + quote(lg.user) + " and its password: the client's Options.Username and " +
			"Options.Password, or " + lg.user + ":PASSWORD@ in its URL (ACL GETUSER " + shellQuote(lg.user) +
			" on the server shows whether the user exists and is on)"
	}
	return "check the password of user \"default\" (the server's requirepass): the client's Options.Password, " +
		"or :PASSWORD@ in its URL; for an ACL user set Options.Username too (USER:PASSWORD@)"
}

// noAuthFix: the server wants a login the client did not make.
func (lg login) noAuthFix() string {
	switch {
	case !lg.known || lg.password:
		return "check the Redis user and password the client logs in with (Options.Username and Options.Password, " +
			"or USER:PASSWORD@ in its URL)"
	case lg.named:
		return "give Redis user " + quote(lg.user) + " its password: the client's Options.Password, or " +
			lg.user + ":PASSWORD@ in its URL"
	}
	return "the server needs a password: set the client's Options.Password (and Options.Username for an ACL " +
		"user), or :PASSWORD@ (USER:PASSWORD@ for an ACL user) in its URL"
}

func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }
