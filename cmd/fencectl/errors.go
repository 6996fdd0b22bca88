package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/fencelock/fencelock/fence"
)

// usageError is a mistake in the command line: exit 2 and a pointer to help.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, a ...any) error {
	return &usageError{msg: fmt.Sprintf(format, a...)}
}

// errFailed is returned by doctor after printing a failing check: the output
// already says everything, so run prints nothing more.
var errFailed = errors.New("failed")

// errAborted is returned when the operator declines a confirmation.
var errAborted = errors.New("aborted: nothing was changed")

// failKind is the one cause a server failure is reported as.
type failKind int

const (
	kindOther       failKind = iota
	kindNetwork              // no connection: refused, unknown host, reset
	kindTimeout              // no answer within --timeout
	kindCredentials          // the server refused the user or password
	kindPermission           // the user may not run a command or touch a key
	kindReadOnly             // a replica or standby
	kindNoDatabase           // Postgres: the database in the address does not exist
	kindCertificate          // TLS: the server's certificate is not trusted here
)

// serverError is a server that could not be reached or that refused what
// fencectl asked, with the one cause and the fix. Error is one line:
// the cause, then "; fix: " and the fix; doctor prints the two apart.
type serverError struct {
	server  string // "Redis", "Redis Cluster", "Postgres", ...
	src     source // the address and where it came from
	user    string // the user fencectl logged in as
	kind    failKind
	timeout time.Duration
	// cmd is the command a NOPERM names ("scan", "cluster|slots"); for a
	// refused key or channel, keys is "~" or "&" and prefix the key prefix.
	// inScript: refused inside a script, where Redis names no command.
	cmd, keys, prefix string
	inScript          bool
	// fix, when set, is the whole fix (a Postgres refusal: the GRANT
	// depends on what fencectl was doing, see dbConn.grantFix).
	fix string
	err error
}

func (e *serverError) Error() string {
	if fix := e.Fix(); fix != "" {
		return e.Cause() + "; fix: " + fix
	}
	return e.Cause()
}

func (e *serverError) Unwrap() error { return e.err }

// reply is the error's own text, trimmed of a trailing period (Redis ends
// some replies with one) so that it reads inside a sentence, and of the
// advice HELLO's NOAUTH gives to client authors.
func (e *serverError) reply() string {
	s, _, _ := strings.Cut(oneLine(e.err), ", otherwise the HELLO AUTH")
	return strings.TrimSuffix(s, ".")
}

// Cause says what went wrong, naming the server by its (masked) address.
func (e *serverError) Cause() string {
	at := e.server + " at " + e.src.display()
	switch e.kind {
	case kindNetwork:
		if e.closedAtOnce() {
			return at + " closed the connection at once: " + e.reply()
		}
		return at + " is not reachable: " + e.reply()
	case kindTimeout:
		return fmt.Sprintf("%s did not answer within %v (--timeout)", at, e.timeout)
	case kindCredentials:
		return fmt.Sprintf("%s refused the login of user %q: %s", at, e.user, e.reply())
	case kindPermission:
		return fmt.Sprintf("%s refused user %q: %s", at, e.user, e.reply())
	case kindReadOnly:
		return at + " is read-only: " + e.reply()
	case kindNoDatabase:
		return at + ": " + e.reply()
	case kindCertificate:
		return at + " sent a certificate this host does not trust: " + e.reply()
	}
	return at + ": " + e.reply()
}

// Fix says what to do, naming the flag or the variable the address came
// from.
func (e *serverError) Fix() string {
	if e.fix != "" {
		return e.fix
	}
	where := e.src.where()
	switch e.kind {
	case kindNetwork:
		if e.closedAtOnce() {
			return fmt.Sprintf("if the server requires TLS, use rediss:// in the address (%s); else its log says why it closed the connection", where)
		}
		return fmt.Sprintf("check the address (%s), that %s runs there, and that this host may reach it", where, e.daemon())
	case kindTimeout:
		fix := fmt.Sprintf("check that %s at that address runs and is not stopped or overloaded, and that this host may reach it; or raise --timeout", e.daemon())
		if e.server != "Postgres" && e.src.tls() {
			// A server without TLS waits for the end of a command line
			// that the TLS handshake never sends.
			fix = fmt.Sprintf("if the server does not speak TLS, use redis:// instead of rediss:// in the address (%s); else %s", where, fix)
		}
		return fix
	case kindCertificate:
		return "give this host the CA that signed the server's certificate (SSL_CERT_FILE=ca.pem fencectl …, or the system's trust store), or check that the address names the host the certificate is for"
	case kindCredentials:
		return e.credentialsFix()
	case kindPermission:
		return e.permissionFix()
	case kindReadOnly:
		if e.server == "Postgres" {
			return fmt.Sprintf("point %s at the primary", where)
		}
		return fmt.Sprintf("point %s at the master", where)
	case kindNoDatabase:
		return fmt.Sprintf("check the database name in the address (%s)", where)
	}
	return ""
}

// closedAtOnce reports a Redis that closed a plain connection without an
// answer, as a server that requires TLS does.
func (e *serverError) closedAtOnce() bool {
	return e.kind == kindNetwork && e.server != "Postgres" && !e.src.tls() && errors.Is(e.err, io.EOF)
}

func (e *serverError) daemon() string {
	if e.server == "Postgres" {
		return "Postgres"
	}
	return "redis-server"
}

func (e *serverError) credentialsFix() string {
	where := e.src.where()
	msg := e.err.Error()
	if e.server == "Postgres" {
		var pgErr *pgconn.PgError
		if errors.As(e.err, &pgErr) && pgErr.Code == "28000" {
			if strings.Contains(pgErr.Message, "pg_hba.conf") {
				return "allow this host, user and database in the server's pg_hba.conf (the message names them), then SELECT pg_reload_conf()"
			}
			return fmt.Sprintf("check the user in the address (%s)", where)
		}
		switch e.src.pgPassword() {
		case "address":
			return fmt.Sprintf("check user %q and its password in the address (%s)", e.user, where)
		case "PGPASSWORD":
			return fmt.Sprintf("check $PGPASSWORD (the address (%s) has no password, so it was used)", where)
		case "passfile":
			return fmt.Sprintf("check the password file (~/.pgpass or $PGPASSFILE), or put the password in the address (%s)", where)
		}
		return fmt.Sprintf("the address (%s) has no password: add user %q's, postgres://%s:PASSWORD@host:port/db", where, e.user, e.user)
	}
	switch {
	case strings.Contains(msg, "NOAUTH"):
		return fmt.Sprintf("the server needs a password: add it to the address (%s), redis://:PASSWORD@host:port, or redis://USER:PASSWORD@host:port for an ACL user", where)
	case strings.Contains(msg, "without any password configured"):
		return fmt.Sprintf("the server has no password: remove it from the address (%s), or name the ACL user it belongs to (redis://USER:PASSWORD@host:port)", where)
	}
	if e.user == "default" || e.user == "" {
		// No user named: AUTH <password> logs in as the default user,
		// whose password is the server's requirepass.
		return fmt.Sprintf("check the password in the address (%s): without a user it is the server's requirepass (CONFIG GET requirepass as an admin, or redis.conf); for an ACL user, redis://USER:PASSWORD@host:port", where)
	}
	return fmt.Sprintf("check user %q and its password in the address (%s); on the server, ACL GETUSER %s shows whether the user exists and is on", e.user, where, e.user)
}

func (e *serverError) permissionFix() string {
	if e.server == "Postgres" {
		return "run fencectl as the fencelock schema's owner"
	}
	switch {
	case e.keys != "":
		// The reply names no key or channel: say which ones fencectl used.
		what := "keys"
		if e.keys == "&" {
			what = "channels"
		}
		return fmt.Sprintf("%s: fence's %s are %s* (%s)%s", aclPatternFix(e.user, e.prefix, e.keys == "~", e.keys == "&"),
			what, e.prefix, prefixSource(e.prefix), otherPrefix(e.prefix))
	case e.inScript:
		return aclFix(e.user, e.prefix, strings.Contains(e.server, "Cluster")) +
			": a command inside fence's script was refused, and Redis does not say which; doctor --acl-user " + e.user + " from an admin's address names it"
	case e.cmd != "":
		return fmt.Sprintf("ACL SETUSER %s +%s (on every node)", e.user, e.cmd)
	}
	return fmt.Sprintf("ACL GETUSER %s on the server shows what the user may run", e.user)
}

// aclPatternFix is the ACL SETUSER addition that lets user reach fence's
// keys, its channels, or both, under prefix.
func aclPatternFix(user, prefix string, keys, channels bool) string {
	var pats []string
	if keys {
		pats = append(pats, "~"+prefix+"*")
	}
	if channels {
		pats = append(pats, "&"+prefix+"*")
	}
	return fmt.Sprintf("ACL SETUSER %s %s (on every node)", user, strings.Join(pats, " "))
}

// otherPrefix is the other fix for keys or channels outside the user's
// patterns under the default prefix: the application's locks may use
// another one (fence.WithPrefix), which fencectl was not told.
func otherPrefix(prefix string) string {
	if prefix != fence.DefaultPrefix {
		return ""
	}
	return "; or, if the application's locks use another prefix (fence.WithPrefix), give it with --prefix"
}

// prefixSource says where the prefix fencectl used came from.
func prefixSource(prefix string) string {
	if prefix == fence.DefaultPrefix {
		return "the default prefix"
	}
	return "--prefix"
}

func pgIdent(s string) string {
	if regexp.MustCompile(`^[a-z_][a-z0-9_]*$`).MatchString(s) {
		return s
	}
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// noPermCommand finds the command a NOPERM reply (or ACL DRYRUN) names:
// "... to run the 'cluster|slots' command".
var noPermCommand = regexp.MustCompile(`run the '([^']+)' command`)

// aclDenial is what a Redis ACL refusal is about.
type aclDenial int

const (
	deniedNothing aclDenial = iota // not an ACL refusal
	deniedCommand                  // a command or subcommand the user may not run
	deniedKey                      // a key outside the user's key patterns
	deniedChannel                  // a channel outside its channel patterns
	deniedOther                    // an ACL refusal of a form not known here
)

// denialOf reads a refusal in each form Redis words it: a NOPERM error
// ("no permissions to run the 'get' command", "... to access one of the
// keys used as arguments", "... one of the channels ..."), an ACL DRYRUN
// reply ("... to access the 'k' key", "... the 'c' channel"), or a call
// refused inside a script ("The user executing the script can't run this
// command or subcommand", "... access at least one of the keys ...",
// "... publish to the channel ...").
func denialOf(msg string) aclDenial {
	const inScript = "The user executing the script can't"
	if strings.Contains(msg, inScript) {
		// Its tail names the script and line, not the refusal.
		if i := strings.Index(msg, " script: "); i > strings.Index(msg, inScript) {
			msg = msg[:i]
		}
	} else if !strings.Contains(msg, "NOPERM") && !strings.Contains(msg, "no permissions to") {
		return deniedNothing
	}
	msg = strings.TrimSuffix(strings.TrimSpace(msg), ".")
	switch {
	case noPermCommand.MatchString(msg), strings.Contains(msg, "run this command or subcommand"):
		return deniedCommand
	case strings.HasSuffix(msg, "' channel"), strings.Contains(msg, "one of the channels"), strings.Contains(msg, "to the channel"):
		return deniedChannel
	case strings.HasSuffix(msg, "' key"), strings.Contains(msg, "one of the keys"):
		return deniedKey
	}
	return deniedOther
}

// redisFailure classifies err, an error of a call to Redis; nil when it is
// not one of the causes fencectl explains (a script error, a bad reply).
func redisFailure(server string, src source, user, prefix string, timeout time.Duration, err error) *serverError {
	e := &serverError{server: server, src: src, user: user, prefix: prefix, timeout: timeout, err: err}
	msg := err.Error()
	denial := denialOf(msg)
	switch {
	case isTimeout(err):
		e.kind = kindTimeout
	case denial != deniedNothing:
		e.kind = kindPermission
		e.inScript = strings.Contains(msg, "The user executing the script can't")
		switch denial {
		case deniedCommand:
			if m := noPermCommand.FindStringSubmatch(msg); m != nil {
				e.cmd = strings.ToLower(m[1])
			}
		case deniedKey:
			e.keys = "~"
		case deniedChannel:
			e.keys = "&"
		}
	case strings.Contains(msg, "WRONGPASS"), strings.Contains(msg, "NOAUTH"),
		strings.Contains(msg, "invalid password"), strings.Contains(msg, "without any password configured"):
		e.kind = kindCredentials
	case strings.Contains(msg, "READONLY"):
		e.kind = kindReadOnly
	case isCertificate(err):
		e.kind = kindCertificate
	case isNetwork(err):
		e.kind, e.err = kindNetwork, netCause(err)
	default:
		return nil
	}
	return e
}

// pgFailure classifies err, an error of a connection to or a statement on
// Postgres; nil when it is none of the causes fencectl explains.
func pgFailure(src source, user string, timeout time.Duration, err error) *serverError {
	e := &serverError{server: "Postgres", src: src, user: user, timeout: timeout, err: err}
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr):
		// The server's own words, without pgx's "failed to connect to
		// `user=… database=…`: host (ip): server error:" in front: the
		// cause names the address already.
		e.err = pgErr
		switch {
		case pgErr.Code == "28P01" || pgErr.Code == "28000":
			e.kind = kindCredentials
		case pgErr.Code == "3D000":
			e.kind = kindNoDatabase
		case pgErr.Code == "25006":
			e.kind = kindReadOnly
		default:
			return nil
		}
	case isTimeout(err):
		e.kind = kindTimeout
	case isNetwork(err):
		e.kind, e.err = kindNetwork, netCause(err)
	default:
		return nil
	}
	return e
}

// isCertificate reports whether err is a TLS handshake that failed on the
// server's certificate (unknown authority, wrong host, expired).
func isCertificate(err error) bool {
	var cv *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var he x509.HostnameError
	var ci x509.CertificateInvalidError
	return errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &he) || errors.As(err, &ci)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// netCause is the network error inside err (pgx wraps it in one line per
// attempt, naming the same refusal twice): that error alone, once.
func netCause(err error) error {
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return dns
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return op
	}
	return err
}

func isNetwork(err error) bool {
	var op *net.OpError
	var dns *net.DNSError
	return errors.As(err, &op) || errors.As(err, &dns) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed) ||
		strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "EOF")
}

// schemaMissingError says how to install the schema in the database that
// was used. It matches errSchemaMissing.
type schemaMissingError struct {
	src    source
	dbname string
}

var errSchemaMissing = errors.New("the fencelock schema is not installed")

func (e *schemaMissingError) Error() string {
	return fmt.Sprintf("%s in database %q at %s; fix: %s", errSchemaMissing, e.dbname, e.src.display(), e.Fix())
}

// Fix is the command that installs it, on the same address. (The goose
// CLI needs the migrations directory, which only a checkout has: the
// command docs/operations.md shows finds it in the module cache.)
func (e *schemaMissingError) Fix() string {
	return fmt.Sprintf("fencectl migrate up --db %s%s", e.src.arg(), e.src.maskNote())
}

func (e *schemaMissingError) Unwrap() error { return errSchemaMissing }

// usageArgs makes cobra's argument-count errors usage errors (exit 2 and
// a pointer to help), like every other command-line mistake.
func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return &usageError{msg: err.Error()}
		}
		return nil
	}
}
