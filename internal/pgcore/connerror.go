package pgcore

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/fencelock/fencelock/internal/oneline"
	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATEs of a server that refuses a connection.
const (
	InvalidPassword    = "28P01" // invalid_password
	InvalidAuth        = "28000" // invalid_authorization_specification (pg_hba.conf, no such role, no LOGIN)
	UndefinedDatabase  = "3D000" // invalid_catalog_name
	TooManyConnections = "53300" // too_many_connections
	CannotConnectNow   = "57P03" // cannot_connect_now (starting up, shutting down, recovering)
)

// Addr is t's host:port, or the path of its Unix socket.
func (t Target) Addr() string {
	port := strconv.Itoa(int(t.Port))
	if strings.HasPrefix(t.Host, "/") {
		return filepath.Join(t.Host, ".s.PGSQL."+port)
	}
	return net.JoinHostPort(t.Host, port)
}

// Where is t as a message names the server a connection was for. An
// empty Database is the user's, as Postgres takes it.
func (t Target) Where() string {
	db := t.Database
	if db == "" {
		db = t.User
	}
	return fmt.Sprintf("Postgres at %s as user %q, database %q", t.Addr(), t.User, db)
}

// connectError is a failed connection to Postgres, in one line: the
// server's answer (or the network's) first and once, then where it came
// from, then the fix. pgx's own message holds a line per attempt
// (sslmode=prefer tries TLS first, and a server without TLS refuses it),
// which names the refused TLS before the real cause. errors.As and
// errors.Is still find the driver's errors (*pgconn.ConnectError, the
// server's *pgconn.PgError or lib/pq's *pq.Error, the dial's *net.OpError
// and its errno).
type connectError struct {
	msg string
	err error
}

func (e *connectError) Error() string { return e.msg }
func (e *connectError) Unwrap() error { return e.err }

// ConnError rewrites err in one line when a connection to Postgres failed
// under it: a *pgconn.ConnectError in its chain (pgx, pgxpool, pgx's
// database/sql driver), which says where the connection was for; or, from
// a driver with errors of its own (lib/pq), the server's refusal (by its
// SQLSTATE) or the dial's *net.OpError, which do not say it (the message
// then names no server: the dial error has the address, the server's
// answer the user or database it refused). Any other error, and nil, is
// returned as it is.
// The message starts with prefix and op ("pgfence: begin: "), then the
// cause: the server's answer with its SQLSTATE and the server, user and
// database it came from; or "cannot reach" the server, user and database,
// and the network's error. It ends with a fix for a password refused or a
// missing user (28P01, 28000), a missing database (3D000), too many
// connections (53300), a server not accepting connections (57P03) and an
// unreachable server.
func ConnError(prefix, op string, err error) error {
	var done *connectError
	if err == nil || errors.As(err, &done) {
		return err
	}
	var (
		srv   Target
		known bool
		ce    *pgconn.ConnectError
	)
	switch {
	case errors.As(err, &ce):
		if c := ce.Config; c != nil {
			srv, known = Target{Host: c.Host, Port: c.Port, User: c.User, Database: c.Database}, true
		}
	case !refusal(err):
		return err
	}
	where := "Postgres"
	if known {
		where = srv.Where()
	}
	var (
		opErr *net.OpError
		msg   string
	)
	if e, ok := From(err); ok {
		msg = fmt.Sprintf("%s: %s: %s (SQLSTATE %s)", prefix, op, e.Message, e.Code)
		if known {
			msg += ", from " + where
		}
		if fix := refusalFix(e, srv, known); fix != "" {
			msg += ": " + fix
		}
	} else if errors.As(err, &opErr) {
		msg = fmt.Sprintf("%s: %s: cannot reach %s: %s: %s", prefix, op, where, opErr.Error(), unreachableFix(opErr))
	} else {
		cause := err
		if ce != nil {
			cause = ce.Unwrap()
		}
		msg = fmt.Sprintf("%s: %s: cannot connect to %s: %s", prefix, op, where, oneline.Fold(cause.Error()))
	}
	return &connectError{msg: msg, err: err}
}

// unreachableFix is what to check when the dial opErr failed: the
// socket's directory and port, and a server on this host, for a Unix
// socket; the host and port, and a server accepting TCP from this host,
// otherwise.
func unreachableFix(opErr *net.OpError) string {
	if opErr.Net == "unix" {
		return "check the socket directory and port in the connection URL (host=, port=, or PGHOST, PGPORT), and that Postgres runs on this host with its socket in that directory (unix_socket_directories)"
	}
	return "check the host and port in the connection URL (or PGHOST, PGPORT), and that Postgres runs there and accepts TCP connections from this host"
}

// refusal reports whether err, which is not a *pgconn.ConnectError, is a
// failed connection all the same: the server refusing it, or its dial.
func refusal(err error) bool {
	switch Code(err) {
	case InvalidPassword, InvalidAuth, UndefinedDatabase, TooManyConnections, CannotConnectNow:
		return true
	}
	var opErr *net.OpError
	return errors.As(err, &opErr) && opErr.Op == "dial"
}

// refusalFix is what to do about the server's answer e to a connection
// for srv (known: srv is set), or "" when there is nothing to say. The
// role or database a statement of the fix names is the one the server's
// answer names, else the connection's.
func refusalFix(e Error, srv Target, known bool) string {
	user, db := "<user>", "<database>"
	if known {
		user, db = ident(srv.User), ident(srv.Database)
		if srv.Database == "" {
			db = user
		}
	}
	if q, ok := quoted(e.Message); ok {
		user, db = ident(q), ident(q)
	}
	switch e.Code {
	case InvalidPassword:
		return "check the user and password in the connection URL (or PGUSER, PGPASSWORD)"
	case InvalidAuth:
		switch {
		case strings.Contains(e.Message, "pg_hba.conf"):
			return "add a line for this host, user and database to the server's pg_hba.conf and reload it, or connect as a user it admits"
		case strings.Contains(e.Message, "not permitted to log in"):
			return "let the role log in (ALTER ROLE " + user + " LOGIN), or connect as another user"
		case strings.Contains(e.Message, "does not exist"):
			return "check the user in the connection URL (or PGUSER), or create the role (CREATE ROLE " + user + " LOGIN)"
		}
		return "check the user and password in the connection URL (or PGUSER, PGPASSWORD)"
	case UndefinedDatabase:
		return "create the database (CREATE DATABASE " + db + "), or name one that exists in the connection URL"
	case TooManyConnections:
		switch {
		case strings.Contains(e.Message, "for role"):
			return "use fewer connections as this role (a smaller pool), or lift its limit: ALTER ROLE " + user + " CONNECTION LIMIT -1"
		case strings.Contains(e.Message, "for database"):
			return "use fewer connections to this database (a smaller pool), or lift its limit: ALTER DATABASE " + db + " CONNECTION LIMIT -1"
		}
		return "use fewer connections (a smaller pool, or a pooler such as PgBouncer in front), or raise max_connections on the server (it takes a restart)"
	case CannotConnectNow:
		return "retry once the server accepts connections again, or connect to one that does"
	}
	return ""
}

// ident quotes s as an SQL identifier.
func ident(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// quoted is the name between the first and the last double quote of the
// server's message (`role "app" does not exist`).
func quoted(msg string) (string, bool) {
	i, j := strings.IndexByte(msg, '"'), strings.LastIndexByte(msg, '"')
	if i < 0 || j <= i {
		return "", false
	}
	return msg[i+1 : j], true
}
