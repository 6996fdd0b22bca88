// Command suite runs the repository's checks and tests the way make test
// and make flakes do: every module's go vet and tests under the race
// detector, staticcheck and the fencectl install check, side by side so
// that the machine's cores stay busy while tests wait on their servers.
// It prints each package's time against its budget in docs/testing.md and
// each failure with its test's name and output.
//
//	go run ./cmd/suite -root ..                      # make test
//	go run ./cmd/suite -root .. -runs 5              # make flakes: the whole suite 5 times
//	go run ./cmd/suite -root .. -runs 20 -pkg ./outbox -run TestRelayPostgresRestart
//
// With -pkg, the chosen package runs -runs times while the rest of the
// suite runs again and again beside it, servers starting and stopping as
// they do in make test: the load under which a test that passes alone
// fails. Run from the tools module (cd tools), whose go.mod pins
// staticcheck.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.root, "root", "..", "the repository's root")
	flag.IntVar(&cfg.runs, "runs", 1, "how many times to run the tests")
	flag.StringVar(&cfg.pkg, "pkg", "", "run only this package (a directory of the repository, e.g. ./outbox) -runs times, with the rest of the suite as load")
	flag.StringVar(&cfg.run, "run", "", "with -pkg: go test's -run for it")
	flag.BoolVar(&cfg.checks, "checks", true, "run go vet, staticcheck and the install check (with -runs 1 and no -pkg)")
	flag.Parse()
	root, err := filepath.Abs(cfg.root)
	if err != nil {
		fail(err)
	}
	cfg.root = root
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	ok, err := run(ctx, cfg)
	if err != nil {
		fail(err)
	}
	fmt.Printf("suite: %s in %s\n", map[bool]string{true: "passed", false: "FAILED"}[ok], time.Since(start).Round(time.Second))
	if !ok {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "suite:", err)
	os.Exit(2)
}

type config struct {
	root   string
	runs   int
	pkg    string
	run    string
	checks bool
}

func run(ctx context.Context, cfg config) (bool, error) {
	mods, err := modules(cfg.root)
	if err != nil {
		return false, err
	}
	budgets, err := readBudgets(filepath.Join(cfg.root, "docs", "testing.md"))
	if err != nil {
		return false, err
	}
	s := &suite{cfg: cfg, mods: mods, budgets: budgets, out: newPrinter(os.Stdout)}
	if cfg.pkg != "" {
		return s.flakesOf(ctx)
	}
	if cfg.runs > 1 {
		return s.flakes(ctx)
	}
	return s.once(ctx)
}
