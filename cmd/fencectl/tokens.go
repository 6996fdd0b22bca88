package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencelock/fencelock/fence"
)

func (a *app) tokensCmd() *cobra.Command {
	show := &cobra.Command{
		Use:   "show [RESOURCE...]",
		Short: "The newest token Postgres has seen per resource, and (with --redis) whether Redis is ahead of it",
		Long: `Show the newest token the database has seen per resource (its high-water
mark). With --redis (or $REDIS_URL) also the lock's token counter and the
Redis server clock: the next token is at least max(counter + 1, clock in µs),
and must be above the mark to be accepted. STATUS "behind" means every new
holder is rejected until 'fencectl tokens repair' raises the counter.`,
		Example: "  fencectl tokens show --db \"$DATABASE_URL\"\n  fencectl tokens show stock-sync:eu --redis 127.0.0.1:6379 -o json",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.checkOutput(); err != nil {
				return err
			}
			ctx := cmd.Context()
			db, err := openDB(ctx, a.dbSrc(), a.timeout)
			if err != nil {
				return err
			}
			defer db.Close()
			states, err := readFences(ctx, db, args)
			if err != nil {
				return err
			}
			withRedis := a.redis() != ""
			if withRedis {
				rc, locks, err := a.openLocks(ctx)
				if err != nil {
					return err
				}
				defer closeLocks(rc, locks)
				compareTokens(ctx, rc, locks, a.prefix, states)
			}
			return a.printTokens(states, withRedis)
		},
	}
	a.dbFlag(show)
	a.redisFlag(show)
	show.Flags().Lookup("redis").Usage += "; optional: adds the counter, the clock and the status"
	a.outputFlag(show)

	var all bool
	repair := &cobra.Command{
		Use:   "repair [RESOURCE...|--all]",
		Short: "Raise lock counters to the database's high-water mark, so new holders are accepted again",
		Long: `Raise each lock's token counter in Redis to the newest token the database
has seen for it (never lowers it), so that the next token is above it and
new holders are accepted again. Needed only when Redis lost the counter and
its clock is behind the database's mark (a restore, a failover to a replica
whose clock was behind). --all repairs every resource that is behind.`,
		Example: "  fencectl tokens repair stock-sync:eu --redis 127.0.0.1:6379 --db \"$DATABASE_URL\"\n  fencectl tokens repair --all",
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return usageErrorf("give the RESOURCE names to repair, or --all (every resource that is behind), not both")
			}
			ctx := cmd.Context()
			db, err := openDB(ctx, a.dbSrc(), a.timeout)
			if err != nil {
				return err
			}
			defer db.Close()
			rc, locks, err := a.openLocks(ctx)
			if err != nil {
				return err
			}
			defer closeLocks(rc, locks)
			return a.repair(ctx, db, rc, locks, args)
		},
	}
	a.dbFlag(repair)
	a.redisFlag(repair)
	repair.Flags().BoolVar(&all, "all", false, "repair every resource whose next token would be rejected")
	return group("tokens", "Compare and repair fencing tokens (Postgres high-water marks vs Redis counters)", show, repair)
}

// tokenState is one resource: the database's mark and, when Redis was
// asked, what the next token would be.
type tokenState struct {
	Resource string    `json:"resource"`
	Mark     int64     `json:"db_token"`
	Holder   string    `json:"db_holder"`
	Updated  time.Time `json:"db_updated_at"`

	Counter *int64 `json:"redis_counter,omitempty"`
	Clock   int64  `json:"redis_clock_us,omitempty"`
	Node    string `json:"redis_node,omitempty"`
	Next    int64  `json:"next_token_at_least,omitempty"`
	// Status is ok (the next token is above the mark), behind (it is not:
	// every new holder is rejected), skipped (not a fence lock name) or
	// error (Redis did not answer; see Detail).
	Status string `json:"status,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Fix is what to do about an error whose cause fencectl can tell
	// (a key outside the user's ACL patterns, a missing command).
	Fix string `json:"fix,omitempty"`
}

func readFences(ctx context.Context, db *dbConn, names []string) ([]*tokenState, error) {
	q := `SELECT resource, token, holder, updated_at FROM fencelock.fence`
	var args []any
	if len(names) > 0 {
		q += ` WHERE resource = ANY($1)`
		args = append(args, names)
	}
	rows, err := db.pool.Query(ctx, q+` ORDER BY resource`, args...)
	if err != nil {
		return nil, db.explain(err)
	}
	defer rows.Close()
	var out []*tokenState
	for rows.Next() {
		s := &tokenState{}
		if err := rows.Scan(&s.Resource, &s.Mark, &s.Holder, &s.Updated); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, db.explain(rows.Err())
}

// compareTokens fills in each resource's Redis side: its counter, the clock
// of the node that owns it, and the status.
func compareTokens(ctx context.Context, rc *redisConn, locks *fence.Client, prefix string, states []*tokenState) {
	clocks := map[string]int64{}
	failed := func(s *tokenState, what string, err error) {
		s.Status, s.Detail = "error", what+oneLine(err)
		var se *serverError
		if errors.As(rc.explain(err), &se) {
			s.Fix = se.Fix()
		}
	}
	for _, s := range states {
		info, err := locks.Inspect(ctx, s.Resource)
		if errors.Is(err, fence.ErrInvalidName) {
			s.Status, s.Detail = "skipped", "not a fence lock name (guarded with another lease), nothing to compare"
			continue
		}
		if err != nil {
			failed(s, "", err)
			continue
		}
		clock, node, err := rc.nodeClock(ctx, lockKey(prefix, s.Resource), clocks)
		if err != nil {
			failed(s, "TIME: ", err)
			continue
		}
		c := info.Counter
		s.Counter, s.Clock, s.Node = &c, clock, node
		s.Next = max(c+1, clock)
		if s.Next > s.Mark {
			s.Status = "ok"
		} else {
			s.Status = "behind"
		}
	}
}

func (a *app) printTokens(states []*tokenState, withRedis bool) error {
	if a.json() {
		if states == nil {
			states = []*tokenState{}
		}
		return a.printJSON(states)
	}
	header := []string{"RESOURCE", "TOKEN", "HOLDER", "UPDATED"}
	if withRedis {
		header = append(header, "COUNTER", "CLOCK(µs)", "STATUS")
	}
	var rows [][]string
	for _, s := range states {
		r := []string{s.Resource, fmt.Sprint(s.Mark), s.Holder, timeOrDash(s.Updated)}
		if withRedis {
			counter, clock := "-", "-"
			if s.Counter != nil {
				counter, clock = fmt.Sprint(*s.Counter), fmt.Sprint(s.Clock)
			}
			st := s.Status
			if s.Detail != "" {
				st += ": " + s.Detail
			}
			if s.Fix != "" {
				st += "; fix: " + s.Fix
			}
			r = append(r, counter, clock, st)
		}
		rows = append(rows, r)
	}
	return a.table(header, rows)
}

func (a *app) repair(ctx context.Context, db *dbConn, rc *redisConn, locks *fence.Client, names []string) error {
	states, err := readFences(ctx, db, names)
	if err != nil {
		return err
	}
	seen := map[string]*tokenState{}
	for _, s := range states {
		seen[s.Resource] = s
	}
	if len(names) == 0 { // --all: the ones that are behind
		compareTokens(ctx, rc, locks, a.prefix, states)
		for _, s := range states {
			switch s.Status {
			case "behind":
				names = append(names, s.Resource)
			case "error":
				if s.Fix != "" {
					return fmt.Errorf("%s: %s; fix: %s", s.Resource, s.Detail, s.Fix)
				}
				return fmt.Errorf("%s: %s", s.Resource, s.Detail)
			}
		}
		if len(names) == 0 {
			fmt.Fprintf(a.stdout, "%d resources checked: every next token is above the database's mark; nothing to repair\n", len(states))
			return nil
		}
	}
	for _, n := range names {
		s, ok := seen[n]
		if !ok {
			fmt.Fprintf(a.stdout, "%s: the database has no token for it; nothing to repair\n", n)
			continue
		}
		got, err := locks.RaiseCounter(ctx, n, s.Mark)
		if err != nil {
			return rc.explain(err)
		}
		fmt.Fprintf(a.stdout, "%s: counter is %d (database high-water mark %d); the next token will be higher\n", n, got, s.Mark)
	}
	return nil
}
