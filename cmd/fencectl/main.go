// Command fencectl is the operator CLI of fencelock: it installs the schema,
// inspects and repairs locks and tokens, prunes old keys and runs, and
// checks a deployment (doctor).
//
//	fencectl migrate up|down|status          the fencelock schema in Postgres
//	fencectl locks list [PATTERN]            the locks that are held: holder, token, remaining lease
//	fencectl locks inspect|release NAME...   a lock's holder, token, TTL and counter; forced release
//	fencectl leaders list [PATTERN]          the elections: leader, term, value, lease left, candidates
//	fencectl tokens show|repair [NAME...]    the database's token high-water marks vs Redis
//	fencectl runs list|prune                 resumable runs
//	fencectl keys prune                      applied idempotency keys
//	fencectl doctor                          every check, each with a verdict, its evidence and the fix
//
// Addresses are URLs or host:port, from --redis / --db or $REDIS_URL /
// $DATABASE_URL. Passwords are never printed. Read commands take -o json.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// version is set at build time (-ldflags "-X main.version=v0.1.0"); else
// the build info says it: the module version (go install ...@v0.1.0, or the
// pseudo-version go build stamps from the repository), else the commit it
// was built from, its time and whether the tree was modified.
var version = ""

func versionString() string {
	bi, _ := debug.ReadBuildInfo()
	return describeVersion(version, bi) + " " + runtime.Version()
}

// describeVersion is what --version says, from the build-time version and
// the build info (nil when there is none).
func describeVersion(v string, bi *debug.BuildInfo) string {
	if bi == nil {
		if v == "" {
			return "unknown version (built without module information)"
		}
		return v
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	rev := settings["vcs.revision"]
	if v != "" {
		if len(rev) >= 12 && !strings.Contains(v, rev[:12]) {
			v += " " + rev[:12]
		}
		return v
	}
	if rev == "" {
		return "a development build of " + bi.Main.Path + " (no version or commit recorded: built with go run, go test or -buildvcs=false)"
	}
	v = "commit " + rev[:min(12, len(rev))]
	if t := settings["vcs.time"]; t != "" {
		v += " (" + t + ")"
	}
	if settings["vcs.modified"] == "true" {
		v += " with uncommitted changes"
	}
	return v
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// Exit codes.
const (
	exitOK      = 0
	exitFailed  = 1 // an error, or doctor found a failing check
	exitUsage   = 2
	exitAborted = 3 // the operator answered no
)

// app holds what every command shares: the streams and the global settings.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	redisAddr      string
	sentinelMaster string
	dbAddr         string
	prefix         string
	output         string
	timeout        time.Duration
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	secrets := collectSecrets(args)
	out, errOut := newScrubber(stdout, secrets), newScrubber(stderr, secrets)
	defer out.Flush()
	defer errOut.Flush()

	a := &app{stdin: stdin, stdout: out, stderr: errOut}
	root := a.rootCmd()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(out)
	root.SetErr(errOut)
	cmd, err := root.ExecuteContextC(ctx)
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errFailed):
		return exitFailed
	case errors.Is(err, errAborted):
		fmt.Fprintf(errOut, "fencectl: %v\n", err)
		return exitAborted
	case errors.As(err, &ue):
		fmt.Fprintf(errOut, "fencectl: %s\nRun '%s --help' for usage.\n", oneLine(err), cmd.CommandPath())
		return exitUsage
	default:
		fmt.Fprintf(errOut, "fencectl: %s\n", oneLine(err))
		return exitFailed
	}
}

// oneLine flattens a multi-line error (pgx joins attempts with newlines),
// except the SQL statements of a fix (a line "  <statement>;"), which stay
// one a line so that they paste into psql as printed.
func oneLine(err error) string {
	var text, stmts []string
	for _, line := range strings.Split(err.Error(), "\n") {
		if strings.HasPrefix(line, "  ") && strings.HasSuffix(line, ";") && len(text) > 0 {
			stmts = append(stmts, "  "+strings.TrimSpace(line))
			continue
		}
		text = append(text, line)
	}
	flat := strings.Join(strings.Fields(strings.Join(text, "; ")), " ")
	return strings.Join(append([]string{flat}, stmts...), "\n")
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "fencectl",
		Short: "Operate fencelock: schema, locks, tokens, runs, keys, doctor",
		Long: `fencectl operates fencelock: it installs the schema, inspects and repairs
locks and tokens, prunes old idempotency keys and runs, and checks a
deployment (doctor).

Addresses are URLs or host:port: --redis (or $REDIS_URL) and --db (or
$DATABASE_URL). A Redis Cluster is detected and handled as one (any node
will do); a Sentinel's address leads to the master it monitors. Passwords
are never printed. Read commands print JSON with -o json.`,
		Version:           versionString(),
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("unknown command %q", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
	root.SetVersionTemplate("fencectl {{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{msg: err.Error()} })
	root.PersistentFlags().DurationVar(&a.timeout, "timeout", 10*time.Second, "how long to wait for a server to answer")
	for _, c := range commands {
		root.AddCommand(c(a))
	}
	return root
}

// commands build fencectl's top-level commands (help lists them by name).
// A command group in a file of its own adds its builder with register
// from an init func.
var commands = []func(*app) *cobra.Command{
	(*app).migrateCmd, (*app).locksCmd, (*app).tokensCmd, (*app).runsCmd, (*app).keysCmd, (*app).doctorCmd,
}

// register adds a top-level command (see commands).
func register(c func(*app) *cobra.Command) { commands = append(commands, c) }

// group is a command that only holds subcommands: a missing or unknown
// subcommand is a usage error (cobra would print help and exit 0).
func group(use, short string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{
		Use:   use,
		Short: short,
		RunE: func(cmd *cobra.Command, args []string) error {
			var names []string
			for _, s := range cmd.Commands() {
				if s.IsAvailableCommand() {
					names = append(names, s.Name())
				}
			}
			if len(args) == 0 {
				return usageErrorf("%s needs a subcommand: %s", cmd.Name(), strings.Join(names, ", "))
			}
			return usageErrorf("%s %q: unknown subcommand, want %s", cmd.Name(), args[0], strings.Join(names, ", "))
		},
	}
	c.AddCommand(subs...)
	return c
}

// Flags, added to the commands that use them only (a command's help lists
// exactly what it reads).

func (a *app) redisFlag(c *cobra.Command) {
	c.Flags().StringVar(&a.redisAddr, "redis", "", "Redis address: host:port or redis[s]://[user:password@]host:port[/db] (default $REDIS_URL)")
	c.Flags().StringVar(&a.prefix, "prefix", "fence:", "key prefix the locks were created with (fence.WithPrefix)")
	c.Flags().StringVar(&a.sentinelMaster, "sentinel-master", "", "when --redis is a Sentinel: the master to use (default: the only one it monitors)")
}

func (a *app) dbFlag(c *cobra.Command) {
	c.Flags().StringVar(&a.dbAddr, "db", "", "Postgres address: host:port, postgres://user[:password]@host:port/db or key=value (default $DATABASE_URL)")
}

func (a *app) outputFlag(c *cobra.Command) {
	c.Flags().StringVarP(&a.output, "output", "o", "table", "output format: table or json")
}

// source is an address and where it came from: fixes name the flag or
// the variable that was used, never one that was not.
type source struct {
	addr string // as given
	flag string // --redis or --db
	env  string // the variable it came from; "" when from the flag
}

func (a *app) redisSrc() source {
	if a.redisAddr != "" {
		return source{addr: a.redisAddr, flag: "--redis"}
	}
	return source{addr: os.Getenv("REDIS_URL"), flag: "--redis", env: "REDIS_URL"}
}

func (a *app) dbSrc() source {
	if a.dbAddr != "" {
		return source{addr: a.dbAddr, flag: "--db"}
	}
	return source{addr: os.Getenv("DATABASE_URL"), flag: "--db", env: "DATABASE_URL"}
}

func (a *app) redis() string { return a.redisSrc().addr }

func (a *app) db() string { return a.dbSrc().addr }

// where names what the address came from: the flag, or $VARIABLE.
func (s source) where() string {
	if s.env != "" {
		return "$" + s.env
	}
	return s.flag
}

// tls reports whether the address asks for TLS (rediss://).
func (s source) tls() bool { return strings.HasPrefix(strings.ToLower(s.addr), "rediss://") }

// display is the address with its password masked.
func (s source) display() string { return redactAddr(s.addr) }

// arg is the address as an argument of a command to paste: "$VARIABLE"
// when it came from one, else the address, masked, in single quotes
// (maskNote then says to put the password back).
func (s source) arg() string {
	if s.env != "" {
		return `"$` + s.env + `"`
	}
	return shellQuote(s.display())
}

// maskNote is what a pasted arg() needs when its password was masked.
func (s source) maskNote() string {
	if s.env == "" && s.display() != s.addr {
		return " (with the password in place of " + mask + ")"
	}
	return ""
}

// pgPassword says where the password pgx sends comes from: "address",
// "PGPASSWORD", "passfile", or "" for none.
func (s source) pgPassword() string {
	if hasPassword(s.addr) {
		return "address"
	}
	if os.Getenv("PGPASSWORD") != "" {
		return "PGPASSWORD"
	}
	if cfg, err := parseDBAddr(s.addr); err == nil && cfg.ConnConfig.Password != "" {
		return "passfile"
	}
	return ""
}

// shellQuote makes s one shell word: as it is when it has no character a
// shell would read, else in single quotes.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:/@%+=,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// maskNotes is maskNote for a command that uses several addresses.
func maskNotes(srcs ...source) string {
	for _, s := range srcs {
		if n := s.maskNote(); n != "" {
			return " (with the passwords in place of " + mask + ")"
		}
	}
	return ""
}

// redisArgs are the Redis flags of a command to paste: the address and,
// when not the defaults, the prefix and the Sentinel master.
func (a *app) redisArgs() string {
	s := "--redis " + a.redisSrc().arg()
	if a.prefix != "fence:" {
		s += " --prefix " + shellQuote(a.prefix)
	}
	if a.sentinelMaster != "" {
		s += " --sentinel-master " + shellQuote(a.sentinelMaster)
	}
	return s
}

// checkOutput validates -o before any server is contacted.
func (a *app) checkOutput() error {
	switch a.output {
	case "table", "json", "":
		return nil
	}
	return usageErrorf("-o %q: want table or json", a.output)
}

func (a *app) json() bool { return a.output == "json" }

// names validates lock or resource names given as arguments.
func needNames(what string, args []string) error {
	if len(args) == 0 {
		return usageErrorf("give at least one %s", what)
	}
	for _, n := range args {
		if n == "" {
			return usageErrorf("an empty %s: give non-empty names", what)
		}
	}
	return nil
}
