package pgfence

import (
	"context"
	"strconv"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The statements of a guarded transaction. Every value travels as a bound
// parameter (text format, typed by OID), never as a literal in the SQL.
//
// On a connection straight to Postgres they are prepared once per
// connection and bound by name (see prepare.go). Otherwise they go out as
// unnamed statements of the extended protocol (Parse, Bind, Describe,
// Execute), what pgx calls QueryExecModeExec, whatever the pool's
// default_query_exec_mode: an unnamed statement lives only until the next
// Parse on the same connection, inside one round trip, so it works
// through PgBouncer's transaction pooling, which hands each transaction
// any server connection (a named, cached prepared statement may not exist
// there, or exist already: 26000, 42P05).
const (
	sqlAdvance = "SELECT fencelock.advance($1, $2, $3)"
	sqlBegin   = "BEGIN ISOLATION LEVEL READ COMMITTED"
	// sqlOpen checks the claim without locks (pgcore.OpenCheck: a plain
	// statement, fencelock.open only when something is to refuse) and
	// reports whether the transaction is read-only (the database's or
	// role's default, a hot standby: fn must not run). Store.openSQL
	// appends the options' settings; sqlOpenPlain is the same for a write
	// without a key or a run.
	sqlOpen      = "SELECT " + pgcore.OpenCheck + ", pg_catalog.current_setting('transaction_read_only')"
	sqlOpenPlain = "SELECT " + pgcore.OpenCheckPlain + ", pg_catalog.current_setting('transaction_read_only')"
	// sqlMarked is the condition the commit's statements carry: the
	// claim open set is still there. If fn ended pgfence's transaction
	// and began another one (a raw "COMMIT; BEGIN"), the setting reads ''
	// (or was never set on the connection): the cast fails (22P02, or
	// 42704) and the new transaction is rolled back.
	sqlMarked = " WHERE pg_catalog.split_part(pg_catalog.current_setting('fencelock.claim'), ':', 1)::pg_catalog.int8 OPERATOR(pg_catalog.=) $2"
	// sqlLock and sqlCheck are the claim of a plain write (no key, no
	// run): the resource's shared fence lock (see the migrations: every
	// new token is stored under its exclusive lock), then, in a statement
	// of its own so that its snapshot is taken once the lock is held, the
	// stored token read again; anything but this one goes to
	// fencelock.close, which claims or refuses.
	sqlLock  = "SELECT pg_catalog.pg_advisory_xact_lock_shared(pg_catalog.hashtextextended($1, 1380730187))"
	sqlCheck = "SELECT CASE WHEN (SELECT f.token OPERATOR(pg_catalog.=) $2 AND f.holder OPERATOR(pg_catalog.=) $3" +
		" FROM fencelock.fence f WHERE f.resource OPERATOR(pg_catalog.=) $1) THEN $2" +
		" ELSE fencelock.close($1, $2, $3, NULL, NULL, NULL, false) END" + sqlMarked
	// sqlClose claims the fence, records the key and moves the run (under
	// the same shared lock), for a write with a key or a run.
	sqlClose  = "SELECT fencelock.close($1, $2, $3, $4, $5, $6, $7)" + sqlMarked
	sqlCommit = "COMMIT"
)

// Parameter type OIDs (pg_type).
const (
	oidBool = 16
	oidInt8 = 20
	oidText = 25
)

var (
	advanceOIDs = []uint32{oidText, oidInt8, oidText}
	openOIDs    = []uint32{oidText, oidInt8, oidText, oidText, oidText, oidText, oidText, oidText}
	lockOIDs    = []uint32{oidText}
	checkOIDs   = []uint32{oidText, oidInt8, oidText}
	closeOIDs   = []uint32{oidText, oidInt8, oidText, oidText, oidText, oidText, oidBool}
)

// openSQL is sqlOpen with the Store's transaction settings, as the
// parameters after the six of open ($7, and $8 when both are set).
func openSQL(base string, lockTimeout, idleTimeout bool) (q string, params int) {
	q, params = base, 6
	if lockTimeout {
		params++
		q += ", pg_catalog.set_config('lock_timeout', $" + strconv.Itoa(params) + ", true)"
	}
	if idleTimeout {
		params++
		q += ", pg_catalog.set_config('idle_in_transaction_session_timeout', $" + strconv.Itoa(params) + ", true)"
	}
	return q, params
}

// claimValues are a claim's and a run's parameters for advance (the first
// three), open and close, in text format; nil is NULL. plain is set for a
// write without a key or a run: its commit is sqlLock and sqlCheck.
type claimValues struct {
	advance [][]byte
	open    [][]byte
	close   [][]byte
	plain   bool
}

// orEmpty is v, or the empty string for NULL.
func orEmpty(v []byte) []byte {
	if v == nil {
		return []byte{}
	}
	return v
}

func textOrNull(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}

// values builds the parameters once per transaction. open checks the run
// only for a step: finishing a finished run is a no-op, not an error.
func (s *Store) values(c guard.Claim, run pgcore.RunOp) claimValues {
	resource, token, holder := []byte(c.Resource), strconv.AppendInt(nil, c.Token, 10), []byte(c.Holder)
	key := textOrNull(c.Key)
	var openRun, runKey, cursor, finish []byte
	switch {
	case run.Finish:
		runKey, finish = []byte(run.Key), []byte("t")
	case run.Key != "":
		openRun, runKey, cursor, finish = []byte(run.Key), []byte(run.Key), []byte(run.Cursor), []byte("f")
	default:
		finish = []byte("f")
	}
	return claimValues{
		advance: [][]byte{resource, token, holder},
		open:    s.openValues(resource, token, holder, orEmpty(key), orEmpty(openRun), pgcore.ClaimText(nil, resource, token, holder)),
		close:   [][]byte{resource, token, holder, key, runKey, cursor, finish},
		plain:   key == nil && runKey == nil,
	}
}

func (s *Store) openValues(vals ...[]byte) [][]byte {
	if s.lockTimeoutText != nil {
		vals = append(vals, s.lockTimeoutText)
	}
	if s.idleTimeoutText != nil {
		vals = append(vals, s.idleTimeoutText)
	}
	return vals
}

// args turns text parameters into arguments for pgx's Exec/Query with
// QueryExecModeExec (the generic DB path).
func args(vals [][]byte, oids []uint32) []any {
	out := make([]any, 0, len(vals)+1)
	out = append(out, pgx.QueryExecModeExec)
	for i, v := range vals {
		switch {
		case v == nil:
			out = append(out, nil)
		case oids[i] == oidInt8:
			n, _ := strconv.ParseInt(string(v), 10, 64)
			out = append(out, n)
		case oids[i] == oidBool:
			out = append(out, string(v) == "t")
		default:
			out = append(out, string(v))
		}
	}
	return out
}

// stmt is one statement of a pipeline: sent by name when name is set (it
// is prepared on the connection), else unnamed; with prepare, it is not
// run but prepared under name (Parse and Describe: its result is the
// description, or the server's error).
type stmt struct {
	sql     string
	vals    [][]byte
	oids    []uint32
	name    string
	prepare bool
}

// bind is st with its values, by name when named.
func (st sqlStmt) bind(vals [][]byte, named bool) stmt {
	out := stmt{sql: st.sql, vals: vals, oids: st.oids}
	if named {
		out.name = st.name
	}
	return out
}

// stmtResult is what a pipelined statement returned: its first row (copied),
// its command tag, or the server's error. skipped means Postgres did not
// run it because an earlier statement of its segment failed.
type stmtResult struct {
	row     [][]byte
	tag     pgconn.CommandTag
	err     error
	skipped bool
}

// pipeline sends segments of statements in one round trip, each segment
// ended by a Sync (which commits an implicit transaction and is where
// Postgres resumes after an error), and reads every result. A non-nil
// error is not the server's answer to a statement (that is in the
// results) but a lost connection or an ended ctx; sent says whether any
// byte may have reached the server.
func pipeline(ctx context.Context, conn *pgconn.PgConn, segments ...[]stmt) (res [][]stmtResult, sent bool, err error) {
	p := conn.StartPipeline(ctx)
	for _, seg := range segments {
		for _, st := range seg {
			switch {
			case st.prepare:
				p.SendPrepare(st.name, st.sql, st.oids)
			case st.name != "":
				p.SendQueryPrepared(st.name, st.vals, nil, nil)
			default:
				p.SendQueryParams(st.sql, st.vals, st.oids, nil, nil)
			}
		}
		p.SendPipelineSync()
	}
	if err := p.Flush(); err != nil {
		_ = p.Close()
		return nil, !pgconn.SafeToRetry(err), err
	}
	res = make([][]stmtResult, len(segments))
	for i, seg := range segments {
		res[i] = make([]stmtResult, len(seg))
		synced := false
		for j := range seg {
			r, err := p.GetResults()
			if err != nil {
				if _, ok := err.(*pgconn.PgError); ok {
					res[i][j].err = err
					continue
				}
				_ = p.Close()
				return res, true, err
			}
			switch r := r.(type) {
			case *pgconn.PipelineSync:
				// An earlier statement failed: Postgres skipped the rest.
				for k := j; k < len(seg); k++ {
					res[i][k].skipped = true
				}
				synced = true
			case *pgconn.StatementDescription:
				// A statement prepared: nothing to read.
			case *pgconn.ResultReader:
				if r.NextRow() {
					for _, v := range r.Values() {
						res[i][j].row = append(res[i][j].row, append([]byte(nil), v...))
					}
				}
				tag, err := r.Close()
				if err != nil {
					if _, ok := err.(*pgconn.PgError); !ok {
						_ = p.Close()
						return res, true, err
					}
				}
				res[i][j].tag, res[i][j].err = tag, err
			}
			if synced {
				break
			}
		}
		if !synced {
			r, err := p.GetResults()
			if err != nil {
				_ = p.Close()
				return res, true, err
			}
			if _, ok := r.(*pgconn.PipelineSync); !ok {
				_ = p.Close()
				return res, true, errUnexpected
			}
		}
	}
	return res, true, p.Close()
}
