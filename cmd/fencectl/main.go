// Command fencectl is the operator CLI of fencelock.
//
//	fencectl migrate up|down|status -db URL
//	fencectl inspect -redis URL NAME...        the lock, its holder, token, TTL and counter
//	fencectl tokens  -db URL                    the newest token Postgres has seen per resource
//	fencectl repair  -redis URL -db URL NAME... raise each lock's counter to the database's high-water mark
//	fencectl doctor  -redis URL -db URL         check servers, schema, and counters against the database
//
// URLs default to $REDIS_URL and $DATABASE_URL.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/migrations"
)

const usage = `usage:
  fencectl migrate up|down|status [-db URL]
  fencectl inspect [-redis URL] [-prefix P] NAME...
  fencectl tokens  [-db URL]
  fencectl repair  [-redis URL] [-db URL] [-prefix P] NAME...
  fencectl doctor  [-redis URL] [-db URL] [-prefix P]
URLs default to $REDIS_URL and $DATABASE_URL.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

type flags struct {
	redisURL, dbURL, prefix string
}

func parse(name string, args []string, stderr io.Writer) (*flags, []string, error) {
	fs := flag.NewFlagSet("fencectl "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &flags{}
	fs.StringVar(&f.redisURL, "redis", os.Getenv("REDIS_URL"), "Redis URL")
	fs.StringVar(&f.dbURL, "db", os.Getenv("DATABASE_URL"), "Postgres URL")
	fs.StringVar(&f.prefix, "prefix", "fence:", "key prefix the locks were created with (fence.WithPrefix)")
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	return f, fs.Args(), nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	var err error
	switch cmd {
	case "migrate":
		err = migrate(ctx, rest, stdout, stderr)
	case "inspect":
		err = inspect(ctx, rest, stdout, stderr)
	case "tokens":
		err = tokens(ctx, rest, stdout, stderr)
	case "repair":
		err = repair(ctx, rest, stdout, stderr)
	case "doctor":
		err = doctor(ctx, rest, stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "fencectl: unknown command %q\n%s", cmd, usage)
		return 2
	}
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue), errors.Is(err, flag.ErrHelp):
		if ue != "" {
			fmt.Fprintf(stderr, "fencectl %s: %s\n%s", cmd, string(ue), usage)
		}
		return 2
	default:
		fmt.Fprintf(stderr, "fencectl %s: %v\n", cmd, err)
		return 1
	}
}

type usageError string

func (e usageError) Error() string { return string(e) }

func needDB(f *flags) error {
	if f.dbURL == "" {
		return usageError("no database: give -db URL or set DATABASE_URL")
	}
	return nil
}

func needRedis(f *flags) error {
	if f.redisURL == "" {
		return usageError("no Redis: give -redis URL or set REDIS_URL")
	}
	return nil
}

func openPool(ctx context.Context, f *flags) (*pgxpool.Pool, error) {
	if err := needDB(f); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, f.dbURL)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to Postgres: %w", err)
	}
	return pool, nil
}

func openLocks(ctx context.Context, f *flags) (*redis.Client, *fence.Client, error) {
	if err := needRedis(f); err != nil {
		return nil, nil, err
	}
	opts, err := redis.ParseURL(f.redisURL)
	if err != nil {
		return nil, nil, fmt.Errorf("Redis URL: %w", err)
	}
	rdb := redis.NewClient(opts)
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, nil, fmt.Errorf("connect to Redis: %w", err)
	}
	locks, err := fence.New(rdb, fence.WithPrefix(f.prefix))
	if err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	return rdb, locks, nil
}

func closeLocks(rdb *redis.Client, locks *fence.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = locks.Close(ctx)
	_ = rdb.Close()
}

func migrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError("migrate needs up, down or status")
	}
	action := args[0]
	switch action {
	case "up", "down", "status":
	default:
		return usageError(fmt.Sprintf("migrate %q: want up, down or status", action))
	}
	f, _, err := parse("migrate", args[1:], stderr)
	if err != nil {
		return err
	}
	pool, err := openPool(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	switch action {
	case "up":
		if err := migrations.Up(ctx, db); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "fencelock schema is up to date")
	case "down":
		if err := migrations.Down(ctx, db); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "fencelock schema removed")
	case "status":
		st, err := migrations.Status(ctx, db)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "VERSION\tSTATE\tAPPLIED AT\tFILE")
		for _, s := range st {
			at := "-"
			if !s.AppliedAt.IsZero() {
				at = s.AppliedAt.Format(time.RFC3339)
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\n", s.Source.Version, s.State, at, s.Source.Path)
		}
		return w.Flush()
	default:
		return usageError(fmt.Sprintf("migrate %q: want up, down or status", action))
	}
	return nil
}

func inspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, names, err := parse("inspect", args, stderr)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return usageError("inspect needs at least one lock NAME")
	}
	rdb, locks, err := openLocks(ctx, f)
	if err != nil {
		return err
	}
	defer closeLocks(rdb, locks)
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tHELD\tHOLDER\tTOKEN\tTTL\tCOUNTER")
	for _, n := range names {
		info, err := locks.Inspect(ctx, n)
		if err != nil {
			return err
		}
		holder, token, ttl := "-", "-", "-"
		if info.Held {
			holder, token, ttl = info.Holder, fmt.Sprint(info.Token), info.TTL.String()
		}
		fmt.Fprintf(w, "%s\t%v\t%s\t%s\t%s\t%d\n", n, info.Held, holder, token, ttl, info.Counter)
	}
	return w.Flush()
}

// fenceRow is one row of fencelock.fence.
type fenceRow struct {
	Resource string
	Token    int64
	Holder   string
	Updated  time.Time
}

func readFences(ctx context.Context, pool *pgxpool.Pool, names []string) ([]fenceRow, error) {
	q := `SELECT resource, token, holder, updated_at FROM fencelock.fence`
	var args []any
	if len(names) > 0 {
		q += ` WHERE resource = ANY($1)`
		args = append(args, names)
	}
	rows, err := pool.Query(ctx, q+` ORDER BY resource`, args...)
	if err != nil {
		if strings.Contains(err.Error(), "does not exist") {
			return nil, fmt.Errorf("the fencelock schema is not installed: run 'fencectl migrate up' (or goose -dir migrations postgres \"$DATABASE_URL\" up): %w", err)
		}
		return nil, err
	}
	defer rows.Close()
	var out []fenceRow
	for rows.Next() {
		var r fenceRow
		if err := rows.Scan(&r.Resource, &r.Token, &r.Holder, &r.Updated); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func tokens(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, names, err := parse("tokens", args, stderr)
	if err != nil {
		return err
	}
	pool, err := openPool(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := readFences(ctx, pool, names)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "RESOURCE\tTOKEN\tHOLDER\tUPDATED")
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", r.Resource, r.Token, r.Holder, r.Updated.Format(time.RFC3339))
	}
	return w.Flush()
}

// repair raises each lock's counter to the newest token the database has
// seen, so that the next acquisition gets a token the database accepts.
// It is needed only after Redis lost the counter and its clock ran
// backwards (see the README's guarantees).
func repair(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, names, err := parse("repair", args, stderr)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return usageError("repair needs at least one lock NAME (the resource name used with guard)")
	}
	pool, err := openPool(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	rdb, locks, err := openLocks(ctx, f)
	if err != nil {
		return err
	}
	defer closeLocks(rdb, locks)
	rows, err := readFences(ctx, pool, names)
	if err != nil {
		return err
	}
	seen := map[string]int64{}
	for _, r := range rows {
		seen[r.Resource] = r.Token
	}
	for _, n := range names {
		hw, ok := seen[n]
		if !ok {
			fmt.Fprintf(stdout, "%s: the database has no token for it; nothing to repair\n", n)
			continue
		}
		got, err := locks.RaiseCounter(ctx, n, hw)
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		fmt.Fprintf(stdout, "%s: counter is %d (database high-water mark %d); the next token will be higher\n", n, got, hw)
	}
	return nil
}

func doctor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, _, err := parse("doctor", args, stderr)
	if err != nil {
		return err
	}
	problems := 0
	report := func(ok bool, format string, a ...any) {
		mark := "ok  "
		if !ok {
			mark = "FAIL"
			problems++
		}
		fmt.Fprintf(stdout, "%s %s\n", mark, fmt.Sprintf(format, a...))
	}
	var locks *fence.Client
	if f.redisURL != "" {
		rdb, l, err := openLocks(ctx, f)
		report(err == nil, "Redis reachable at %s %v", f.redisURL, errText(err))
		if err == nil {
			defer closeLocks(rdb, l)
			locks = l
			if t, err := rdb.Time(ctx).Result(); err == nil {
				skew := time.Since(t)
				report(skew.Abs() < time.Second, "Redis server clock within 1s of this machine's (differs by %v)", skew.Round(time.Millisecond))
			}
		}
	} else {
		report(false, "no Redis given (-redis or REDIS_URL)")
	}
	if f.dbURL == "" {
		report(false, "no database given (-db or DATABASE_URL)")
		return doctorResult(problems)
	}
	pool, err := openPool(ctx, f)
	report(err == nil, "Postgres reachable %v", errText(err))
	if err != nil {
		return doctorResult(problems)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	st, err := migrations.Status(ctx, db)
	pending := 0
	for _, s := range st {
		if s.State != "applied" {
			pending++
		}
	}
	report(err == nil && pending == 0, "fencelock migrations applied (%d pending) %v; fix: fencectl migrate up", pending, errText(err))
	if err != nil || pending > 0 || locks == nil {
		return doctorResult(problems)
	}
	rows, err := readFences(ctx, pool, nil)
	if err != nil {
		report(false, "read fencelock.fence: %v", err)
		return doctorResult(problems)
	}
	behind := 0
	for _, r := range rows {
		info, err := locks.Inspect(ctx, r.Resource)
		if err != nil {
			continue // not a fence lock name (e.g. braces): nothing to compare
		}
		if info.Counter < r.Token && !info.Held {
			behind++
			fmt.Fprintf(stdout, "     %s: counter %d is below the database's token %d; fine while the Redis clock is ahead (tokens are floored by it), else run: fencectl repair %s\n",
				r.Resource, info.Counter, r.Token, r.Resource)
		}
	}
	report(true, "%d fenced resources checked, %d with a counter below the database's token", len(rows), behind)
	return doctorResult(problems)
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return "(" + err.Error() + ")"
}

func doctorResult(problems int) error {
	if problems > 0 {
		return fmt.Errorf("%d problem(s) found", problems)
	}
	return nil
}
