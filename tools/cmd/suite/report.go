package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// modulePrefix is the import path every package of the repository starts
// with; a package is named by the rest (its directory).
const modulePrefix = "github.com/fencelock/fencelock"

// dirOf is the package's directory in the repository ("." for the root).
func dirOf(pkg string) string {
	if pkg == modulePrefix {
		return "."
	}
	return strings.TrimPrefix(pkg, modulePrefix+"/")
}

// budgets are the packages' time budgets, from docs/testing.md's table
// (a row "| `dir` | n s |").
type budgets map[string]time.Duration

var budgetRow = regexp.MustCompile("(?m)^\\| `([^`]+)` \\| (\\d+) s \\|")

func readBudgets(path string) (budgets, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseBudgets(string(b))
}

func parseBudgets(doc string) (budgets, error) {
	out := budgets{}
	for _, m := range budgetRow.FindAllStringSubmatch(doc, -1) {
		n, err := strconv.Atoi(m[2])
		if err != nil {
			return nil, err
		}
		out[m[1]] = time.Duration(n) * time.Second
	}
	if len(out) == 0 {
		return nil, errNoBudgets
	}
	return out, nil
}

// printer writes results as they come, one line each; nil w prints
// nothing.
type printer struct {
	mu sync.Mutex
	w  io.Writer
	// failuresOnly prints only failed packages, each line after prefix.
	failuresOnly bool
	prefix       string
}

func newPrinter(w io.Writer) *printer { return &printer{w: w} }

func (p *printer) printf(format string, args ...any) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
}

func (p *printer) step(m, what string, d time.Duration) {
	p.printf("ok    %-34s %7.1fs  %s\n", "("+m+")", d.Seconds(), what)
}

func (p *printer) failedStep(m, what string, d time.Duration, out string, err error) {
	p.printf("FAIL  %-34s %7.1fs  %s: %v\n%s", "("+m+")", d.Seconds(), what, err, indent(tail(out, 80)))
}

func (p *printer) pkg(r pkgResult, b budgets) {
	if r.Skipped {
		return
	}
	dir := dirOf(r.Package)
	budget := ""
	if d, ok := b[dir]; ok {
		budget = fmt.Sprintf("budget %3.0fs", d.Seconds())
		if r.Elapsed > d {
			budget += "  OVER BUDGET (docs/testing.md)"
		}
	} else {
		budget = "no budget in docs/testing.md"
	}
	if r.Passed {
		if !p.failuresOnly {
			p.printf("ok    %-34s %7.1fs  %s\n", dir, r.Elapsed.Seconds(), budget)
		}
		return
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%sFAIL  %-34s %7.1fs  %s\n", p.prefix, dir, r.Elapsed.Seconds(), budget)
	for _, f := range r.Failed {
		name := f.Test
		if name == "" {
			name = "(the package, outside its tests)"
		}
		fmt.Fprintf(&sb, "  --- FAIL: %s (%s)\n%s", name, dir, indent(tail(f.Output, 60)))
	}
	p.printf("%s", sb.String())
}

// summary ends make test: the packages over budget and the slowest.
func (p *printer) summary(res *results, b budgets) {
	var over, missing []string
	type slow struct {
		dir string
		d   time.Duration
	}
	var all []slow
	for _, pkg := range res.packages() {
		for _, r := range res.of(pkg) {
			if r.Skipped {
				continue
			}
			dir := dirOf(pkg)
			all = append(all, slow{dir, r.Elapsed})
			if d, ok := b[dir]; !ok {
				missing = append(missing, dir)
			} else if r.Elapsed > d {
				over = append(over, fmt.Sprintf("%s %.0fs (budget %.0fs)", dir, r.Elapsed.Seconds(), d.Seconds()))
			}
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].d > all[j].d })
	var top []string
	for _, s := range all[:min(5, len(all))] {
		top = append(top, fmt.Sprintf("%s %.0fs", s.dir, s.d.Seconds()))
	}
	p.printf("suite: %d packages; slowest: %s\n", len(all), strings.Join(top, ", "))
	p.printf("suite: slowest tests: %s\n", strings.Join(slowestTests(res, 8), ", "))
	if len(over) > 0 {
		p.printf("suite: over their budget in docs/testing.md (on this machine; a new test must fit its package's budget): %s\n", strings.Join(over, "; "))
	}
	if len(missing) > 0 {
		p.printf("suite: no budget in docs/testing.md for: %s (add a row)\n", strings.Join(missing, ", "))
	}
}

func slowestTests(res *results, n int) []string {
	type tt struct {
		name string
		d    time.Duration
	}
	var all []tt
	for _, pkg := range res.packages() {
		for _, r := range res.of(pkg) {
			for _, t := range r.Tests {
				all = append(all, tt{dirOf(pkg) + "." + t.Test, t.Elapsed})
			}
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].d > all[j].d })
	var out []string
	for _, t := range all[:min(n, len(all))] {
		out = append(out, fmt.Sprintf("%s %.0fs", t.name, t.d.Seconds()))
	}
	return out
}

// flakeTable ends make flakes: per package, the runs it survived and the
// tests that failed, with how often.
func (p *printer) flakeTable(res *results) {
	p.printf("\n| package | runs | passed | failing tests |\n| --- | ---: | ---: | --- |\n")
	for _, pkg := range res.packages() {
		rs := res.of(pkg)
		if len(rs) > 0 && rs[0].Skipped {
			continue
		}
		passed := 0
		fails := map[string]int{}
		for _, r := range rs {
			if r.Passed {
				passed++
			}
			for _, f := range r.Failed {
				name := f.Test
				if name == "" {
					name = "(package)"
				}
				fails[name]++
			}
		}
		var names []string
		for n, c := range fails {
			names = append(names, fmt.Sprintf("%s ×%d", n, c))
		}
		sort.Strings(names)
		p.printf("| %s | %d | %d | %s |\n", dirOf(pkg), len(rs), passed, strings.Join(names, ", "))
	}
}

func tail(s string, lines int) string {
	var all []string
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		all = append(all, sc.Text())
	}
	if len(all) > lines {
		all = append([]string{fmt.Sprintf("[... %d lines before]", len(all)-lines)}, all[len(all)-lines:]...)
	}
	return strings.Join(all, "\n")
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "      " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n      ") + "\n"
}
