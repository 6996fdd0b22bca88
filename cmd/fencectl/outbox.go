package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/outbox"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"
)

func init() { register((*app).outboxCmd) }

func (a *app) outboxCmd() *cobra.Command {
	return group("outbox", "List the effects waiting for delivery, requeue dead ones (fencelock.outbox)", a.outboxListCmd(), a.outboxRequeueCmd())
}

func (a *app) outboxListCmd() *cobra.Command {
	var dead bool
	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List the effects waiting in fencelock.outbox (or the dead ones), with counts by state",
		Long: `List the rows of fencelock.outbox, oldest first: the effects that fenced
transactions recorded and no relay has delivered yet, or with --dead the
ones that failed for good (out of attempts, or refused by the receiver),
with the reason. The first line counts rows by state: due (a relay may
claim them now), waiting (backing off after a failure), claimed (a relay
holds them) and dead, each up to 10000 ("at least" when there may be
more), reading a bounded number of rows however large the outbox is.`,
		Example: "  fencectl outbox list\n  fencectl outbox list --dead -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.checkOutput(); err != nil {
				return err
			}
			if limit <= 0 {
				return usageErrorf("--limit %d: want a positive number", limit)
			}
			return a.outboxList(cmd.Context(), dead, limit)
		},
	}
	a.dbFlag(list)
	a.outputFlag(list)
	list.Flags().BoolVar(&dead, "dead", false, "list the dead rows instead of the live ones")
	list.Flags().IntVar(&limit, "limit", 100, "at most this many rows, oldest first")
	return list
}

// outboxList prints the outbox's counts by state and up to limit rows,
// the dead ones with dead.
func (a *app) outboxList(ctx context.Context, dead bool, limit int) error {
	db, err := openDB(ctx, a.dbSrc(), a.timeout)
	if err != nil {
		return err
	}
	defer db.Close()
	counts, err := outbox.Backlog(ctx, db.pool, outbox.DefaultBacklogLimit)
	if err != nil {
		return a.outboxError(db, err)
	}
	rows, err := outbox.List(ctx, db.pool, dead, limit)
	if err != nil {
		return a.outboxError(db, err)
	}
	if a.json() {
		if rows == nil {
			rows = []outbox.Row{}
		}
		return a.printJSON(struct {
			Counts outbox.CappedCounts `json:"counts"`
			Rows   []outbox.Row        `json:"rows"`
		}{counts, rows})
	}
	fmt.Fprintln(a.stdout, countsLine(counts))
	if len(rows) == 0 {
		return nil
	}
	var tr [][]string
	for _, r := range rows {
		when := timeOrDash(r.Due)
		if r.Dead != nil {
			when = timeOrDash(*r.Dead)
		}
		last := oneLine(errors.New(r.LastError)) // whole: the cause is at its end
		if last == "" {
			last = "-"
		}
		tr = append(tr, []string{strconv.FormatInt(r.ID, 10), r.Resource, strconv.FormatInt(r.Token, 10), r.Key,
			r.Destination, strconv.Itoa(r.Attempts), when, last})
	}
	whenCol := "DUE"
	if dead {
		whenCol = "DEAD SINCE"
	}
	return a.table([]string{"ID", "RESOURCE", "TOKEN", "KEY", "DESTINATION", "ATTEMPTS", whenCol, "LAST ERROR"}, tr)
}

func (a *app) outboxRequeueCmd() *cobra.Command {
	var all bool
	requeue := &cobra.Command{
		Use:   "requeue (--all | ID...)",
		Short: "Make dead outbox rows due again, their attempts reset",
		Long: `Make dead rows of fencelock.outbox due again, with their attempts reset:
the rows whose IDs are given (fencectl outbox list --dead shows them), or
every dead row with --all. A running relay delivers them at its next poll.
Fix what made them fail first (the LAST ERROR column): a row that fails
again goes dead again after its attempts.`,
		Example: "  fencectl outbox requeue 17 18\n  fencectl outbox requeue --all",
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := requeueIDs(all, args)
			if err != nil {
				return err
			}
			return a.outboxRequeue(cmd.Context(), all, ids)
		},
	}
	a.dbFlag(requeue)
	requeue.Flags().BoolVar(&all, "all", false, "requeue every dead row")
	return requeue
}

// requeueIDs are the row IDs of outbox requeue's arguments: --all or
// IDs, not both, not neither.
func requeueIDs(all bool, args []string) ([]int64, error) {
	switch {
	case all && len(args) > 0:
		return nil, usageErrorf("give --all or IDs, not both")
	case !all && len(args) == 0:
		return nil, usageErrorf("give the IDs of dead rows (fencectl outbox list --dead), or --all")
	}
	var ids []int64
	for _, s := range args {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil || id <= 0 {
			return nil, usageErrorf("%q is not a row ID (a positive number, from fencectl outbox list --dead)", s)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// outboxRequeue makes the dead rows ids (all with all) due again, and
// fails when some of ids were no dead row.
func (a *app) outboxRequeue(ctx context.Context, all bool, ids []int64) error {
	db, err := openDB(ctx, a.dbSrc(), a.timeout)
	if err != nil {
		return err
	}
	defer db.Close()
	n, err := outbox.Requeue(ctx, db.pool, ids)
	if err != nil {
		return a.outboxError(db, err)
	}
	fmt.Fprintf(a.stdout, "requeued %s\n", plural(n, "dead row", "dead rows"))
	if !all && n < len(ids) {
		return fmt.Errorf("%s of the %d given %s no dead row (no such row, delivered since, or never dead): left alone; fix: fencectl outbox list --dead lists the dead rows' IDs",
			plural(len(ids)-n, "ID", "IDs"), len(ids), map[bool]string{true: "is", false: "are"}[len(ids)-n == 1])
	}
	return nil
}

// countsLine is the summary of outbox list: each count, "at least" where
// the counting stopped at its limit.
func countsLine(c outbox.CappedCounts) string {
	var parts []string
	for _, s := range []struct {
		n      int64
		capped bool
		state  string
	}{{c.Due, c.Capped.Due, "due"}, {c.Waiting, c.Capped.Waiting, "waiting"}, {c.Claimed, c.Capped.Claimed, "claimed"}, {c.Dead, c.Capped.Dead, "dead"}} {
		p := fmt.Sprintf("%d %s", s.n, s.state)
		if s.capped {
			p = "at least " + p
		}
		parts = append(parts, p)
	}
	line := strings.Join(parts, ", ")
	if c.Capped != (outbox.Capped{}) {
		line += fmt.Sprintf(" (each state counted up to %d rows)", c.Limit)
	}
	return line
}

// outboxError names a schema without the outbox's functions (migration 3,
// and 5 for the counts) as missing or out of date: fencectl migrate up
// installs them.
func (a *app) outboxError(db *dbConn, err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, guard.ErrSchemaOutdated):
		return &schemaOutdatedError{src: db.src, dbname: db.cfg.ConnConfig.Database}
	case errors.As(err, &pgErr) && pgErr.Code == "42883" && strings.Contains(pgErr.Message, "outbox_"):
		return &schemaMissingError{src: db.src, dbname: db.cfg.ConnConfig.Database}
	}
	return db.explain(err)
}

// schemaOutdatedError: the schema predates a function fencectl calls; the
// fix migrates the database that was given.
type schemaOutdatedError schemaMissingError

func (e *schemaOutdatedError) Error() string {
	return fmt.Sprintf("the fencelock schema in database %q at %s is older than this fencectl needs; fix: %s",
		e.dbname, e.src.display(), (*schemaMissingError)(e).Fix())
}

func (e *schemaOutdatedError) Unwrap() error { return guard.ErrSchemaOutdated }
