package pgfence

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// txn is an open, checked transaction: guard.Txn. fn writes through tx;
// the transaction itself is begun and ended only here.
//
// The begin is one round trip (a pipeline): advance, Sync (its own
// implicit transaction commits there, so the token is recorded before fn
// reads anything), then BEGIN and the check (sqlOpen), Sync. The commit is
// one more: the statements queued with pgcore.OnCommit, the claim (sqlLock
// and sqlCheck, or sqlClose), COMMIT, Sync. Why the claim waits for the
// commit: claiming takes the fence lock until the transaction ends; taken
// at BEGIN, a holder
// frozen in the middle of its transaction (SIGSTOP, GC, VM freeze) would
// keep every later holder waiting, which is the failure this library
// exists for. Taken in the round trip that carries COMMIT (and by advance,
// in its own little transaction before BEGIN), the lock lasts only as long
// as those, and the invariant holds all the same: every commit checks its
// token under the fence lock in the committing transaction, so
// committed tokens per resource never decrease in commit order.
type txn struct {
	s  *Store
	tx *fnTx
	// conn is the connection the transaction runs on (pool or conn);
	// nil on the generic path, where inner is the DB's own transaction.
	conn  *pgx.Conn
	inner pgx.Tx
	// closeVals are fencelock.close's parameters; plain: the claim is
	// sqlLock and sqlCheck (no key, no run), else sqlClose.
	closeVals [][]byte
	plain     bool
	// named: close and COMMIT are prepared on conn (see prepare.go).
	named bool
	// ended is set once Commit or Rollback has run.
	ended   bool
	release func()
}

func (t *txn) Tx() pgx.Tx { return t.tx }

// begin opens a checked transaction for c (and a run's step or finish).
func (s *Store) begin(ctx context.Context, c guard.Claim, run pgcore.RunOp) (*txn, error) {
	if err := pgcore.CheckClaim(c); err != nil {
		return nil, err
	}
	if err := s.core.CheckSchema(ctx, "begin"); err != nil {
		return nil, err
	}
	v := s.values(c, run)
	// Once this Store has seen the claim stored it sends no advance at
	// all (see pgcore.Cache); when the token is already stored, advance only
	// reads; when it is stale it fails, and so does open.
	advance := !s.core.Claims.Has(c.Resource, c.Token, c.Holder)
	cache := advance && s.autocommits()
	var (
		t      *txn
		advErr error
		err    error
	)
	switch db := s.db.(type) {
	case *pgxpool.Pool:
		pc, aerr := db.Acquire(ctx)
		if aerr != nil {
			return nil, mapError(s.core.ConnError("begin", aerr))
		}
		t, advErr, err = s.beginOnConn(ctx, pc.Conn(), v, advance, pc.Release)
	case *pgx.Conn:
		t, advErr, err = s.beginOnConn(ctx, db, v, advance, func() {})
	default:
		t, advErr, err = s.beginGeneric(ctx, v, advance)
	}
	if t != nil {
		t.tx.queue.Claim = c
	}
	if cache && advance && advErr == nil && (err == nil || errors.Is(err, guard.ErrAlreadyApplied)) {
		// advance committed: the token is stored.
		s.core.Claims.Add(c.Resource, c.Token, c.Holder)
	}
	return t, err
}

// beginOnConn runs the begin round trip on conn. advErr is advance's own
// error (nil when it ran and committed, or was not sent).
func (s *Store) beginOnConn(ctx context.Context, conn *pgx.Conn, v claimValues, advance bool, release func()) (t *txn, advErr, err error) {
	fail := func(err error) (*txn, error, error) {
		rollbackConn(ctx, conn)
		release()
		return nil, advErr, err
	}
	var (
		res   [][]stmtResult
		named bool
	)
	for attempt := 0; ; attempt++ {
		pc := conn.PgConn()
		cs, err := s.connFor(ctx, pc)
		if err != nil {
			return fail(mapError(err))
		}
		named, err = s.prepareAll(ctx, cs, pc)
		if err != nil {
			return fail(mapError(err))
		}
		var segs [][]stmt
		if advance {
			segs = append(segs, []stmt{s.stAdvance.bind(v.advance, named)})
		}
		open := s.stOpen
		if v.plain {
			open = s.stOpenPlain
		}
		segs = append(segs, []stmt{s.stBegin.bind(nil, named), open.bind(v.open, named)})
		res, _, err = pipeline(ctx, pc, segs...)
		if err != nil {
			// The connection is lost or ctx ended; the server rolls back
			// whatever it had begun (advance may have committed: harmless,
			// it only records the token).
			return fail(mapError(err))
		}
		if named && attempt == 0 && missingStatement(res) {
			// DEALLOCATE ALL or DISCARD ALL since the last transaction:
			// nothing ran (a missing statement fails its segment before
			// anything in it does, and advance is only a claim). Prepare
			// again and start over, once.
			cs.forget()
			rollbackConn(ctx, conn)
			continue
		}
		break
	}
	if advance {
		advErr = res[0][0].err
	}
	b, o := res[len(res)-1][0], res[len(res)-1][1]
	if o.err == nil && !o.skipped && len(o.row) > 1 && string(o.row[1]) == "on" ||
		isReadOnly(advErr) || isReadOnly(o.err) {
		// Read-only: fn must not run. The transaction is rolled back
		// before asking why, to name the setting.
		rollbackConn(ctx, conn)
		return fail(readOnlyError(ctx, conn))
	}
	switch {
	case advErr != nil:
		return fail(mapError(advErr))
	case b.err != nil:
		return fail(mapError(b.err))
	case o.err != nil:
		return fail(mapError(o.err))
	case o.skipped || b.skipped:
		return fail(errUnexpected)
	}
	return &txn{s: s, tx: newFnTx(conn, conn), conn: conn, closeVals: v.close, plain: v.plain, named: named, release: release}, nil, nil
}

// beginGeneric is the begin for a DB other than a pool or a conn: advance,
// BEGIN, open, one statement at a time.
func (s *Store) beginGeneric(ctx context.Context, v claimValues, advance bool) (t *txn, advErr, err error) {
	if advance {
		if _, advErr = s.db.Exec(ctx, sqlAdvance, args(v.advance, advanceOIDs)...); advErr != nil {
			if isReadOnly(advErr) {
				return nil, advErr, readOnlyError(ctx, s.db)
			}
			return nil, advErr, mapError(s.core.ConnError("begin", advErr))
		}
	}
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, nil, mapError(s.core.ConnError("begin", err))
	}
	var row [][]byte
	rows, err := tx.Query(ctx, s.openSQL, args(v.open, openOIDs)...)
	if err == nil {
		if rows.Next() {
			for _, b := range rows.RawValues() {
				row = append(row, append([]byte(nil), b...))
			}
		}
		rows.Close()
		err = rows.Err()
	}
	if err != nil || len(row) > 1 && string(row[1]) == "on" {
		_ = rollbackTx(ctx, tx)
		if err == nil || isReadOnly(err) {
			return nil, nil, readOnlyError(ctx, s.db)
		}
		return nil, nil, mapError(err)
	}
	return &txn{s: s, tx: newFnTx(tx, tx.Conn()), inner: tx, closeVals: v.close, release: func() {}}, nil, nil
}

// newFnTx is fn's tx over q, on conn.
func newFnTx(q querier, conn *pgx.Conn) *fnTx {
	t := &fnTx{stmts: stmts{q: q}, conn: conn}
	t.queue.Encoder = t
	return t
}

// Commit claims the fence and commits, in one round trip on a pool or a
// conn: the statements queued with pgcore.OnCommit, close, then COMMIT. If the claim is refused, Postgres skips the
// COMMIT and the transaction is left aborted; it is rolled back (one more
// round trip, on this failure path only) and the refusal returned, mapped.
// If fn ended the transaction itself, nothing is sent and the error says
// so (guard.ErrTxEnded). If the connection breaks once the commit is sent,
// the outcome is unknown (guard.ErrUnknownOutcome).
func (t *txn) Commit(ctx context.Context) error {
	err := t.commit(ctx)
	if err == nil {
		t.tx.queue.Committed()
	}
	return t.s.core.ExplainPermission(ctx, err)
}

func (t *txn) commit(ctx context.Context) error {
	if t.ended {
		return pgx.ErrTxClosed
	}
	t.ended = true
	t.tx.closed = true
	queued := t.tx.queue.Take()
	defer t.release()
	if err := t.stillOpen(); err != nil {
		t.rollback(ctx)
		return err
	}
	if t.conn == nil {
		return t.commitGeneric(ctx, queued)
	}
	pc := t.conn.PgConn()
	seg := t.queuedStmts(pc, queued)
	nq := len(seg)
	claim := 1
	if t.plain {
		claim = 2
		seg = append(seg, t.s.stLock.bind(t.closeVals[:1], t.named), t.s.stCheck.bind(t.closeVals[:3], t.named))
	} else {
		seg = append(seg, t.s.stClose.bind(t.closeVals, t.named))
	}
	seg = append(seg, t.s.stCommit.bind(nil, t.named))
	res, sent, err := pipeline(ctx, pc, seg)
	if len(res) > 0 {
		notePrepared(pc, seg[:nq], res[0])
	}
	if err == nil {
		if qerr := queuedError(foldPrepared(seg[:nq], res[0][:nq]), queued); qerr != nil {
			rollbackConn(ctx, t.conn)
			return qerr
		}
		res[0] = claimResult(res[0][nq:], claim)
	}
	if err == nil && t.named && missingStatement(res) {
		// fn dropped pgfence's prepared statements (DEALLOCATE ALL): the
		// transaction failed, nothing of it commits.
		if cs, ok := pc.CustomData()[connKey].(*connState); ok {
			cs.forget()
		}
		rollbackConn(ctx, t.conn)
		return fmt.Errorf("pgfence: pgfence's prepared statements were deallocated while fn ran (DEALLOCATE ALL?); the transaction was rolled back, nothing was written: %w", mapError(firstErr(res)))
	}
	if err != nil {
		rollbackConn(ctx, t.conn)
		if len(res) > 0 {
			if qerr := queuedError(foldPrepared(seg[:nq], res[0][:nq]), queued); qerr != nil {
				return qerr
			}
			res[0] = claimResult(res[0][nq:], claim)
		}
		switch {
		case len(res) > 0 && res[0][0].err != nil:
			// The claim was refused before the connection went: COMMIT
			// was skipped, nothing committed.
			return t.closeError(res[0][0].err)
		case !sent:
			return fmt.Errorf("pgfence: commit not sent, nothing was committed: %w", mapError(err))
		}
		return fmt.Errorf("%w: %w", guard.ErrUnknownOutcome, err)
	}
	if cl := res[0][0]; cl.err != nil {
		rollbackConn(ctx, t.conn)
		return t.closeError(cl.err)
	}
	cm := res[0][1]
	if cm.err != nil {
		rollbackConn(ctx, t.conn)
		return mapError(cm.err)
	}
	if cm.tag.String() != "COMMIT" {
		rollbackConn(ctx, t.conn)
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// claimResult folds the results of the n statements of the claim (the
// lock and the check, or close) into one, the first that failed or else
// the last, followed by the rest (COMMIT's).
func claimResult(res []stmtResult, n int) []stmtResult {
	for i := 0; i < n-1; i++ {
		if res[i].err != nil {
			res[n-1] = res[i]
			break
		}
	}
	return res[n-1:]
}

// queuedError is the error of the first queued statement that failed, or
// nil: the transaction is then aborted and nothing of it commits.
func queuedError(res []stmtResult, queued []pgcore.Queued) error {
	for i, r := range res {
		if r.err == nil {
			continue
		}
		err := mapError(r.err)
		if errors.Is(err, guard.ErrStaleToken) {
			// A queued write to a protected table claims the fence (its
			// trigger): the refusal is the transaction's, as close's would be.
			return err
		}
		return fmt.Errorf("pgfence: statement %d of %d queued for the commit failed, nothing was committed: %w", i+1, len(queued), err)
	}
	return nil
}

// firstErr is the first server error among res.
func firstErr(res [][]stmtResult) error {
	for _, seg := range res {
		for _, r := range seg {
			if r.err != nil {
				return r.err
			}
		}
	}
	return nil
}

func (t *txn) commitGeneric(ctx context.Context, queued []pgcore.Queued) error {
	for i, q := range queued {
		if _, err := t.inner.Exec(ctx, q.SQL, append([]any{pgx.QueryExecModeExec}, q.Args...)...); err != nil {
			_ = rollbackTx(ctx, t.inner)
			return fmt.Errorf("pgfence: statement %d of %d queued for the commit failed, nothing was committed: %w", i+1, len(queued), mapError(err))
		}
	}
	if _, err := t.inner.Exec(ctx, sqlClose, args(t.closeVals, closeOIDs)...); err != nil {
		_ = rollbackTx(ctx, t.inner)
		return t.closeError(err)
	}
	err := t.inner.Commit(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return err
	}
	// A failed COMMIT may leave the transaction open (e.g. ctx ended
	// before it was sent); make sure it is gone.
	_ = rollbackTx(ctx, t.inner)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) || pgconn.SafeToRetry(err) {
		return mapError(err)
	}
	return fmt.Errorf("%w: %w", guard.ErrUnknownOutcome, err)
}

// closeError maps the error of fencelock.close: the marker check's
// failure means fn ended pgfence's transaction and began another.
func (t *txn) closeError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "22P02" || pgErr.Code == "42704") {
		return fmt.Errorf("%w: fn ended the transaction and began another one, which was rolled back", guard.ErrTxEnded)
	}
	return mapError(err)
}

// stillOpen checks, before the commit, that the connection is still in
// the transaction pgfence opened: fn may have sent its own COMMIT or
// ROLLBACK (idle), or let a statement fail and returned nil (aborted).
func (t *txn) stillOpen() error {
	conn := t.tx.conn
	if conn == nil {
		return nil
	}
	if conn.IsClosed() {
		return fmt.Errorf("pgfence: the connection closed before the commit was sent (%w): the server rolled the transaction back, unless fn committed it itself", guard.ErrTxEnded)
	}
	switch conn.PgConn().TxStatus() {
	case 'I':
		return fmt.Errorf("%w: the connection was idle after fn; nothing more was sent", guard.ErrTxEnded)
	case 'E':
		return fmt.Errorf("%w: a statement in fn failed and fn returned nil; the transaction was rolled back, nothing was written", pgx.ErrTxCommitRollback)
	}
	return nil
}

// Rollback rolls back. It reports guard.ErrTxEnded when fn had ended the
// transaction itself (the connection was idle).
func (t *txn) Rollback(ctx context.Context) error {
	if t.ended {
		return nil
	}
	t.ended = true
	t.tx.closed = true
	t.tx.queue.Take()
	defer t.release()
	if conn := t.tx.conn; conn != nil && !conn.IsClosed() && conn.PgConn().TxStatus() == 'I' {
		t.rollback(ctx)
		return fmt.Errorf("%w: the connection was idle after fn", guard.ErrTxEnded)
	}
	return t.rollback(ctx)
}

func (t *txn) rollback(ctx context.Context) error {
	if t.conn != nil {
		rollbackConn(ctx, t.conn)
		return nil
	}
	err := rollbackTx(ctx, t.inner)
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil
	}
	return mapError(err)
}

// rollbackConn ends whatever transaction is left open on conn after a
// failed statement, so the connection goes back to the pool idle; if that
// fails, it closes the connection (the pool drops a connection that is
// closed or not idle).
func rollbackConn(ctx context.Context, conn *pgx.Conn) {
	if conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if _, err := conn.Exec(rctx, "ROLLBACK"); err != nil {
		_ = conn.PgConn().Close(rctx)
	}
}

// cleanupTimeout bounds a rollback that runs after the caller's context
// ended.
const cleanupTimeout = 5 * time.Second

func rollbackTx(ctx context.Context, tx pgx.Tx) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return tx.Rollback(rctx)
}

// Queued statements are prepared like pgfence's own on a direct
// connection: parsing and planning a statement each time costs the server
// more than running a small one. A statement is prepared in the commit's
// own round trip, the first time the connection sends it, under a name
// made of its text (fencelock_q_<hash>); a connection keeps at most
// maxQueuedPrepared of them, so that an application that builds its SQL
// with literals does not fill the server's memory: the rest go unnamed.
const maxQueuedPrepared = 32

// queuedStmts are the statements that send queued, each preceded by its
// preparation when it is to be prepared now.
func (t *txn) queuedStmts(pc *pgconn.PgConn, queued []pgcore.Queued) []stmt {
	seg := make([]stmt, 0, 2*len(queued)+3)
	cs, _ := pc.CustomData()[connKey].(*connState)
	prepared := 0
	if cs != nil {
		prepared = cs.queued
	}
	for _, q := range queued {
		st := stmt{sql: q.SQL, vals: q.Encoded.([][]byte)}
		if t.named && cs != nil {
			name := queuedName(q.SQL)
			switch {
			case cs.prepared[name]:
				st.name = name
			case prepared < maxQueuedPrepared && !pending(seg, name):
				seg = append(seg, stmt{sql: q.SQL, name: name, prepare: true})
				st.name = name
				prepared++
			case pending(seg, name):
				st.name = name
			}
		}
		seg = append(seg, st)
	}
	return seg
}

// pending reports whether seg prepares name.
func pending(seg []stmt, name string) bool {
	for _, st := range seg {
		if st.prepare && st.name == name {
			return true
		}
	}
	return false
}

// notePrepared records on the connection the statements of seg that the
// server prepared (a preparation outlives the transaction, committed or
// not).
func notePrepared(pc *pgconn.PgConn, seg []stmt, res []stmtResult) {
	cs, _ := pc.CustomData()[connKey].(*connState)
	if cs == nil {
		return
	}
	for i, st := range seg {
		if st.prepare && i < len(res) && res[i].err == nil && !res[i].skipped {
			cs.prepared[st.name] = true
			cs.queued++
		}
	}
}

// foldPrepared turns the results of seg, queued statements and their
// preparations, into one result per queued statement: a preparation's
// error is its statement's.
func foldPrepared(seg []stmt, res []stmtResult) []stmtResult {
	out := make([]stmtResult, 0, len(res))
	var perr error
	for i, st := range seg {
		if st.prepare {
			if res[i].err != nil && perr == nil {
				perr = res[i].err
			}
			continue
		}
		r := res[i]
		if perr != nil && r.err == nil {
			r.err = perr
		}
		perr = nil
		out = append(out, r)
	}
	return out
}

// queuedName is the name a queued statement is prepared under.
func queuedName(sql string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(sql))
	return "fencelock_q_" + strconv.FormatUint(h.Sum64(), 36)
}
