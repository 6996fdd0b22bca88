package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// verdict of one doctor check.
type verdict string

const (
	verdictOK   verdict = "ok"
	verdictWarn verdict = "warn"
	verdictFail verdict = "fail"
	// verdictSkip: an operator's check that the connected role may not
	// run (it has an application's grants): not a fault of the setup.
	verdictSkip verdict = "skip"
)

// finding is one line of doctor's report: a verdict, what was seen, and
// (unless ok) what to do about it.
type finding struct {
	Check    string  `json:"check"`
	Verdict  verdict `json:"verdict"`
	Evidence string  `json:"evidence"`
	Fix      string  `json:"fix,omitempty"`
}

type doctor struct {
	a           *app
	aclUser     string
	outboxStuck time.Duration
	findings    []finding
}

func (d *doctor) ok(check, evidence string) {
	d.findings = append(d.findings, finding{Check: check, Verdict: verdictOK, Evidence: evidence})
}

func (d *doctor) warn(check, evidence, fix string) {
	d.findings = append(d.findings, finding{Check: check, Verdict: verdictWarn, Evidence: evidence, Fix: fix})
}

func (d *doctor) fail(check, evidence, fix string) {
	d.findings = append(d.findings, finding{Check: check, Verdict: verdictFail, Evidence: evidence, Fix: fix})
}

// skip is an operator's check the role may not run; how says what an
// operator runs it with.
func (d *doctor) skip(check, evidence, how string) {
	d.findings = append(d.findings, finding{Check: check, Verdict: verdictSkip, Evidence: evidence, Fix: how})
}

// failErr is a failing check for err, a server that could not be used:
// its cause as the evidence and its fix apart.
func (d *doctor) failErr(check string, err error) {
	var se *serverError
	if errors.As(err, &se) {
		d.fail(check, se.Cause(), se.Fix())
		return
	}
	d.fail(check, oneLine(err), "")
}

func (a *app) doctorCmd() *cobra.Command {
	d := &doctor{a: a}
	c := &cobra.Command{
		Use:   "doctor",
		Short: "Check Redis, Postgres, the schema and the tokens; each check a verdict, its evidence and the fix",
		Long: `Check a fencelock deployment. Each check prints a verdict (ok, warn, FAIL),
what it saw, and for warn and FAIL the fix. Exit status 1 when any check
fails, 0 otherwise.

Redis (every master of a cluster): reachable and its version; the cluster
state; maxmemory-policy (an evicting policy can drop locks and counters);
persistence; replicas and WAIT (WithReplicaSync); the server clock; the ACL
permissions fence needs (scripts, publish, subscribe on the prefix's keys
and channels), with ACL DRYRUN where the user may run it, else by trying
harmless commands.

Postgres: reachable; the fencelock migrations and their version table; a
transaction pooler in between (as far as detectable) and whether the
address's pgx exec mode survives it.

Outbox (when the database has one): effects due for longer than
--outbox-stuck (no relay claims them), dead rows (fencectl outbox list
--dead, requeue), claims past their visibility timeout (a relay stopped
mid-send). Each reads a bounded number of rows through an index, and says
so when it stopped at its limit.

Tokens: for every fenced resource, the database's high-water mark against
the Redis counter and clock: a mark ahead of both means every new holder
is rejected ('fencectl tokens repair').`,
		Example: "  fencectl doctor --redis 127.0.0.1:6379 --db postgres://app@db:5432/app\n  fencectl doctor -o json",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.checkOutput(); err != nil {
				return err
			}
			if a.redis() == "" && a.db() == "" {
				return usageErrorf("doctor needs --redis and --db (or $REDIS_URL and $DATABASE_URL)")
			}
			if d.outboxStuck <= 0 {
				return usageErrorf("--outbox-stuck %v: want a positive duration, such as 1m", d.outboxStuck)
			}
			if err := d.run(cmd.Context()); err != nil {
				return err
			}
			return d.print()
		},
	}
	a.redisFlag(c)
	a.dbFlag(c)
	a.outputFlag(c)
	c.Flags().StringVar(&d.aclUser, "acl-user", "", "check this Redis user's permissions with ACL DRYRUN (needs an admin connection); default: the connected user")
	c.Flags().DurationVar(&d.outboxStuck, "outbox-stuck", time.Minute, "report outbox effects due for longer than this (a running relay claims due effects within its poll interval)")
	return c
}

func (d *doctor) run(ctx context.Context) error {
	var rc *redisConn
	if d.a.redis() == "" {
		d.warn("redis", "not checked: no --redis and no $REDIS_URL", "give --redis host:port or a redis:// URL")
	} else {
		var err error
		if rc, err = d.checkRedis(ctx); err != nil {
			return err
		}
		if rc != nil {
			defer rc.Close()
		}
	}
	var db *dbConn
	if d.a.db() == "" {
		d.warn("postgres", "not checked: no --db and no $DATABASE_URL", "give --db host:port or a postgres:// URL")
	} else {
		var err error
		if db, err = d.checkPostgres(ctx); err != nil {
			return err
		}
		if db != nil {
			defer db.Close()
		}
	}
	switch {
	case rc != nil && db != nil:
		d.checkTokens(ctx, rc, db)
	case d.a.redis() != "" && d.a.db() != "":
		// One of them is unreachable: that is its failing check already.
	default:
		d.warn("tokens", "not checked: comparing the database's tokens with Redis needs both --redis and --db",
			"give both addresses")
	}
	return nil
}

// print writes the report; a failing check makes run exit 1.
func (d *doctor) print() error {
	failed, warned, skipped := 0, 0, 0
	for _, f := range d.findings {
		switch f.Verdict {
		case verdictFail:
			failed++
		case verdictWarn:
			warned++
		case verdictSkip:
			skipped++
		}
	}
	if d.a.json() {
		if err := d.a.printJSON(struct {
			Checks   []finding `json:"checks"`
			Failed   int       `json:"failed"`
			Warnings int       `json:"warnings"`
		}{d.findings, failed, warned}); err != nil {
			return err
		}
	} else {
		width := 0
		for _, f := range d.findings {
			width = max(width, len(f.Check))
		}
		for _, f := range d.findings {
			mark := map[verdict]string{verdictOK: "ok  ", verdictWarn: "warn", verdictFail: "FAIL", verdictSkip: "skip"}[f.Verdict]
			fmt.Fprintf(d.a.stdout, "%s  %-*s  %s\n", mark, width, f.Check, f.Evidence)
			label := "fix"
			if f.Verdict == verdictSkip {
				label = "an operator"
			}
			if f.Fix != "" {
				fmt.Fprintf(d.a.stdout, "      %-*s  %s: %s\n", width, "", label, f.Fix)
			}
		}
		summary := fmt.Sprintf("%s: %d failed, %s", plural(len(d.findings), "check", "checks"), failed, plural(warned, "warning", "warnings"))
		if skipped > 0 {
			summary += fmt.Sprintf(", %d left to an operator", skipped)
		}
		fmt.Fprintln(d.a.stdout, summary)
	}
	if failed > 0 {
		return errFailed
	}
	return nil
}

// isUsage reports whether err is a command-line mistake (exit 2) rather
// than a finding.
func isUsage(err error) bool {
	var ue *usageError
	return errors.As(err, &ue)
}

// nodeLabel prefixes evidence with the node on a cluster.
func nodeLabel(addr string) string {
	if addr == "" {
		return ""
	}
	return "node " + addr + ": "
}

// redisVersion parses "7.0.15" into 7, 0.
func redisVersion(v string) (major, minor int, ok bool) {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	if _, err := fmt.Sscanf(parts[0]+" "+parts[1], "%d %d", &major, &minor); err != nil {
		return 0, 0, false
	}
	return major, minor, true
}
