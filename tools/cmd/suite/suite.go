package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

type suite struct {
	cfg     config
	mods    []string // module directories relative to the root, "." first
	budgets budgets
	out     *printer
}

// modules lists the directories of the repository that hold a go.mod.
func modules(root string) ([]string, error) {
	var mods []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return fs.SkipDir
		}
		if d.Name() == "go.mod" {
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			mods = append(mods, filepath.ToSlash(rel))
		}
		return nil
	})
	sort.Slice(mods, func(i, j int) bool { return mods[i] == "." || (mods[j] != "." && mods[i] < mods[j]) })
	if len(mods) == 0 || mods[0] != "." {
		return nil, fmt.Errorf("no go.mod at %s: give -root the repository's root", root)
	}
	return mods, err
}

// once is make test: the root module's vet first (it compiles what every
// module shares, with -race, once), then its tests beside everything
// else: the other modules' vet and tests in two chains, staticcheck and
// the install check.
func (s *suite) once(ctx context.Context) (bool, error) {
	res := newResults()
	if s.cfg.checks {
		if !s.step(ctx, ".", "go vet -race", goCmd("vet", "-race", "./...")) {
			return false, nil
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := true
	fail := func() { mu.Lock(); ok = false; mu.Unlock() }
	spawn := func(f func() bool) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !f() {
				fail()
			}
		}()
	}
	spawn(func() bool { return s.test(ctx, ".", res, "", "") })
	rest := s.mods[1:]
	for _, chain := range [][]string{evens(rest), odds(rest)} {
		spawn(func() bool {
			good := true
			for _, m := range chain {
				if s.cfg.checks && !s.step(ctx, m, "go vet -race", goCmd("vet", "-race", "./...")) {
					good = false
					continue
				}
				good = s.test(ctx, m, res, "", "") && good
			}
			return good
		})
	}
	if s.cfg.checks {
		spawn(func() bool { return s.staticcheck(ctx) })
		spawn(func() bool {
			return s.step(ctx, ".", "go vet .ci/installcheck.go", goCmd("vet", ".ci/installcheck.go")) &&
				s.step(ctx, ".", "install check", goCmd("run", ".ci/installcheck.go"))
		})
	}
	wg.Wait()
	s.out.summary(res, s.budgets)
	return ok && res.failed() == 0, ctx.Err()
}

// staticcheck builds staticcheck from the tools module and runs it on
// every module, with -race so that it reads the packages the tests
// compiled.
func (s *suite) staticcheck(ctx context.Context) bool {
	bin := filepath.Join(os.TempDir(), fmt.Sprintf("fencelock-staticcheck-%d", os.Getpid()))
	defer os.Remove(bin)
	if !s.step(ctx, "tools", "build staticcheck", goCmd("build", "-o", bin, "honnef.co/go/tools/cmd/staticcheck")) {
		return false
	}
	good := true
	for _, m := range s.mods {
		cmd := []string{bin, "./..."}
		good = s.step(ctx, m, "staticcheck", cmd, "GOFLAGS=-race") && good
	}
	return good
}

// step runs one command in module m and prints its outcome: its output
// only when it fails.
func (s *suite) step(ctx context.Context, m, what string, argv []string, env ...string) bool {
	start := time.Now()
	out, err := command(ctx, filepath.Join(s.cfg.root, m), argv, env).CombinedOutput()
	d := time.Since(start)
	if err != nil {
		s.out.failedStep(m, what, d, string(out), err)
		return false
	}
	s.out.step(m, what, d)
	return true
}

// test runs module m's tests once (all its packages, or pkg with run)
// and records each package's outcome in res.
func (s *suite) test(ctx context.Context, m string, res *results, pkg, runRE string) bool {
	// -timeout 15m catches a hung test binary (a package of the suite
	// takes minutes at most; 9m was met by a loaded machine compiling the
	// docs' blocks cold). -parallel 4: the tests that call t.Parallel mostly wait on their
	// servers, so four at a time keep 2 cores busy where two did not.
	args := []string{"test", "-race", "-count=1", "-json", "-timeout", "15m", "-parallel", "4"}
	if runRE != "" {
		args = append(args, "-run", runRE)
	}
	if pkg == "" {
		pkg = "./..."
	}
	args = append(args, pkg)
	cmd := command(ctx, filepath.Join(s.cfg.root, m), goCmd(args...), nil)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		s.out.failedStep(m, "go test", 0, "", err)
		return false
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		if ctx.Err() == nil { // a stopped load starts nothing: not a failure
			s.out.failedStep(m, "go test", 0, "", err)
		}
		return false
	}
	p := newParser(m, func(r pkgResult) {
		if res.add(r) {
			s.out.pkg(r, s.budgets)
		}
	})
	p.read(stdout)
	err = cmd.Wait()
	if err != nil && !p.sawFailure() && ctx.Err() == nil {
		// go test failed with no package failure in its JSON: a build or
		// setup error, told on stderr.
		s.out.failedStep(m, "go test", 0, stderr.String(), err)
		return false
	}
	return err == nil
}

func goCmd(args ...string) []string { return append([]string{"go"}, args...) }

// command is argv in dir, in a process group of its own that a
// cancelled ctx kills whole (the test binaries' servers end with them:
// testenv starts them with a parent-death signal).
func command(ctx context.Context, dir string, argv []string, env []string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

func evens(xs []string) (out []string) {
	for i := 0; i < len(xs); i += 2 {
		out = append(out, xs[i])
	}
	return out
}

func odds(xs []string) (out []string) {
	for i := 1; i < len(xs); i += 2 {
		out = append(out, xs[i])
	}
	return out
}

// flakes is make flakes without a package: the whole suite, tests only,
// runs times in a row; each run is the load of the others' packages.
func (s *suite) flakes(ctx context.Context) (bool, error) {
	res := newResults()
	for i := 1; i <= s.cfg.runs && ctx.Err() == nil; i++ {
		s.out.printf("suite: run %d of %d\n", i, s.cfg.runs)
		s.allTests(ctx, res)
	}
	s.out.flakeTable(res)
	return res.failed() == 0, ctx.Err()
}

// allTests runs every module's tests once, as once does without checks.
func (s *suite) allTests(ctx context.Context, res *results) {
	var wg sync.WaitGroup
	for _, chain := range [][]string{{"."}, evens(s.mods[1:]), odds(s.mods[1:])} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, m := range chain {
				s.test(ctx, m, res, "", "")
			}
		}()
	}
	wg.Wait()
}

// flakesOf runs the package -pkg names -runs times, one run after
// another, while the whole suite runs again and again beside it.
func (s *suite) flakesOf(ctx context.Context) (bool, error) {
	m, pkg, err := s.locate(s.cfg.pkg)
	if err != nil {
		return false, err
	}
	loadCtx, stopLoad := context.WithCancel(ctx)
	load := newResults()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// The load's runs count too: their failures are printed (with
		// "load" for a prefix) and tabled at the end.
		loadOut := &printer{w: s.out.w, failuresOnly: true, prefix: "load: "}
		beside := &suite{cfg: s.cfg, mods: s.mods, budgets: s.budgets, out: loadOut}
		for loadCtx.Err() == nil {
			beside.allTests(loadCtx, load)
		}
	}()
	res := newResults()
	for i := 1; i <= s.cfg.runs && ctx.Err() == nil; i++ {
		s.out.printf("suite: %s run %d of %d (load: the whole suite, %d packages done)\n", s.cfg.pkg, i, s.cfg.runs, load.count())
		s.test(ctx, m, res, pkg, s.cfg.run)
	}
	// The runs of the load still going are killed: not flakes.
	load.freeze()
	stopLoad()
	wg.Wait()
	s.out.flakeTable(res)
	s.out.printf("\nThe load, the whole suite beside it (runs that ended before %s's last):\n", s.cfg.pkg)
	s.out.flakeTable(load)
	return res.failed() == 0 && load.failed() == 0, ctx.Err()
}

// locate splits a directory of the repository into its module and the
// package pattern within it.
func (s *suite) locate(dir string) (mod, pkg string, err error) {
	rel := filepath.ToSlash(filepath.Clean(strings.TrimPrefix(dir, "./")))
	if _, err := os.Stat(filepath.Join(s.cfg.root, rel)); err != nil {
		return "", "", fmt.Errorf("-pkg %s: %w", dir, err)
	}
	best := "."
	for _, m := range s.mods {
		if m != "." && (rel == m || strings.HasPrefix(rel, m+"/")) && len(m) > len(best) {
			best = m
		}
	}
	if best == "." {
		return ".", "./" + rel, nil
	}
	inner := strings.TrimPrefix(strings.TrimPrefix(rel, best), "/")
	if inner == "" {
		return best, ".", nil
	}
	return best, "./" + inner, nil
}

var errNoBudgets = errors.New("docs/testing.md has no budget table")
