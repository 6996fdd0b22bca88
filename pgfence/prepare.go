package pgfence

import (
	"context"
	"errors"
	"hash/fnv"
	"strconv"

	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/jackc/pgx/v5/pgconn"
)

// Prepared statements. A statement sent unnamed is parsed and planned in
// every transaction that sends it, so on a connection that goes straight
// to Postgres pgfence's statements are prepared once, under names of
// their own, and every transaction only binds them.
//
// Through a transaction pooler (PgBouncer in transaction mode and the
// like) a prepared statement lives on whichever server connection it was
// prepared on, not on the client's: a later transaction may not find it
// (26000) or find it already there (42P05). There the statements go out
// unnamed, parsed in the round trip that runs them, as pgx's
// QueryExecModeExec does. Which one a connection is, is asked once per
// connection: Postgres's pg_backend_pid() is the process at the end of
// the connection's BackendKeyData when nothing sits in between; a pooler
// hands the client a cancel key of its own, so the two differ.
//
// A statement can still vanish from a direct connection: DEALLOCATE ALL
// sent by fn, DISCARD ALL between transactions. A begin that finds one
// gone forgets what it knew of the connection and starts over; a commit
// cannot (the transaction is aborted by then) and returns an error that
// says nothing was written.

// connKey is where pgfence keeps, in a connection's CustomData, what it
// knows of that connection (a *connState).
const connKey = "github.com/fencelock/fencelock/pgfence.conn"

// connState is what pgfence knows of one connection. A connection is used
// by one goroutine at a time, so it needs no lock.
type connState struct {
	// checked: direct was asked (by a Store that prepares).
	checked bool
	// direct: nothing sits between the client and the backend, so named
	// statements stay where they were prepared.
	direct bool
	// prepared holds the names of the statements prepared on it.
	prepared map[string]bool
	// queued counts the names in prepared that are statements queued
	// with pgcore.OnCommit (see queuedStmts).
	queued int
}

// sqlStmt is one of pgfence's statements: its text, its parameter types
// and the name it is prepared under on a direct connection.
type sqlStmt struct {
	name string
	sql  string
	oids []uint32
}

// newSQLStmt names sql "fencelock_<what>_<hash of sql and oids>".
func newSQLStmt(what, sql string, oids []uint32) sqlStmt {
	h := fnv.New64a()
	_, _ = h.Write([]byte(sql))
	for _, o := range oids {
		_, _ = h.Write(strconv.AppendUint(nil, uint64(o), 10))
	}
	return sqlStmt{name: "fencelock_" + what + "_" + strconv.FormatUint(h.Sum64(), 36), sql: sql, oids: oids}
}

// connFor returns what pgfence knows of conn, asking the server whether
// it is direct the first time a Store that prepares sees conn.
func (s *Store) connFor(ctx context.Context, conn *pgconn.PgConn) (*connState, error) {
	cs, ok := conn.CustomData()[connKey].(*connState)
	if !ok {
		cs = &connState{prepared: map[string]bool{}}
		conn.CustomData()[connKey] = cs
	}
	if cs.checked || !s.prepare {
		return cs, nil
	}
	res, err := conn.Exec(ctx, "SELECT pg_catalog.pg_backend_pid()").ReadAll()
	if err != nil {
		return nil, err
	}
	if len(res) == 1 && len(res[0].Rows) == 1 && len(res[0].Rows[0]) == 1 {
		pid, err := strconv.ParseUint(string(res[0].Rows[0][0]), 10, 32)
		cs.direct = err == nil && uint32(pid) == conn.PID()
	}
	cs.checked = true
	return cs, nil
}

// prepareAll reports whether s's statements go out by name on conn: when
// s prepares and conn is direct. The first time, it prepares them, all in
// one round trip (a Sync after each, so that one already there, 42P05,
// fails alone). They are prepared together, so open's name, which is
// s's own (its SQL carries s's options), stands for the set: a
// transaction costs one map lookup.
func (s *Store) prepareAll(ctx context.Context, cs *connState, conn *pgconn.PgConn) (named bool, err error) {
	if !s.prepare || !cs.direct {
		return false, nil
	}
	if cs.prepared[s.stOpen.name] {
		return true, nil
	}
	var todo []sqlStmt
	for _, st := range []sqlStmt{s.stAdvance, s.stBegin, s.stOpen, s.stOpenPlain, s.stLock, s.stCheck, s.stClose, s.stCommit} {
		if !cs.prepared[st.name] {
			todo = append(todo, st)
		}
	}
	p := conn.StartPipeline(ctx)
	for _, st := range todo {
		p.SendPrepare(st.name, st.sql, st.oids)
		p.SendPipelineSync()
	}
	if err := p.Flush(); err != nil {
		_ = p.Close()
		return false, err
	}
	var failed error
	for _, st := range todo {
		_, err := p.GetResults()
		var pgErr *pgconn.PgError
		switch {
		case err == nil || pgcore.Code(err) == "42P05":
			cs.prepared[st.name] = true
		case errors.As(err, &pgErr):
			if failed == nil {
				failed = err // e.g. the schema is not installed (42883)
			}
		default:
			_ = p.Close()
			return false, err
		}
		if r, err := p.GetResults(); err != nil {
			_ = p.Close()
			return false, err
		} else if _, ok := r.(*pgconn.PipelineSync); !ok {
			_ = p.Close()
			return false, errUnexpected
		}
	}
	if err := p.Close(); err != nil {
		return false, err
	}
	return failed == nil, failed
}

// forget drops what cs knew of the connection's prepared statements, after
// one was found missing.
func (cs *connState) forget() { cs.prepared, cs.queued = map[string]bool{}, 0 }

// missingStatement reports whether any result failed because a prepared
// statement was gone (26000).
func missingStatement(res [][]stmtResult) bool {
	for _, seg := range res {
		for _, r := range seg {
			if pgcore.Code(r.err) == "26000" {
				return true
			}
		}
	}
	return false
}
