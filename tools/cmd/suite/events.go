package main

import (
	"bufio"
	"encoding/json"
	"io"
	"sort"
	"strings"
	"sync"
	"time"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// pkgResult is one package's outcome in one run.
type pkgResult struct {
	Module  string
	Package string
	Passed  bool
	Skipped bool // no test files
	Elapsed time.Duration
	Failed  []testFailure // the failing tests, or one without a name for a package that failed outside them
	Tests   []testTime    // the top-level tests' times
}

type testTime struct {
	Test    string
	Elapsed time.Duration
}

type testFailure struct {
	Test   string
	Output string
}

// parser turns a go test -json stream into package results, handing
// each to done as soon as its package ends.
type parser struct {
	module string
	done   func(pkgResult)
	output map[string]*strings.Builder // by package + "\x00" + test
	failed map[string][]string         // failing tests by package, in order
	times  map[string][]testTime       // top-level tests' times by package
	// running: the tests of each package that started and have not
	// ended; those left when the package fails did not finish (the
	// binary timed out, or a panic ended it).
	running map[string]map[string]bool
	any     bool
}

func newParser(module string, done func(pkgResult)) *parser {
	return &parser{module: module, done: done, output: map[string]*strings.Builder{}, failed: map[string][]string{},
		times: map[string][]testTime{}, running: map[string]map[string]bool{}}
}

func (p *parser) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Package == "" {
			continue
		}
		p.handle(e)
	}
}

func (p *parser) handle(e event) {
	key := e.Package + "\x00" + e.Test
	switch e.Action {
	case "run":
		if p.running[e.Package] == nil {
			p.running[e.Package] = map[string]bool{}
		}
		p.running[e.Package][e.Test] = true
	case "pass", "fail", "skip":
		delete(p.running[e.Package], e.Test)
	}
	switch e.Action {
	case "output", "build-output":
		b := p.output[key]
		if b == nil {
			b = &strings.Builder{}
			p.output[key] = b
		}
		b.WriteString(e.Output)
	case "fail", "pass":
		if e.Test != "" && !strings.Contains(e.Test, "/") {
			p.times[e.Package] = append(p.times[e.Package], testTime{e.Test, time.Duration(e.Elapsed * float64(time.Second))})
		}
	}
	switch e.Action {
	case "fail":
		if e.Test != "" {
			p.failed[e.Package] = append(p.failed[e.Package], e.Test)
			return
		}
		p.any = true
		p.finish(e, false)
	case "pass", "skip":
		if e.Test == "" {
			p.finish(e, true)
		}
	}
}

func (p *parser) finish(e event, passed bool) {
	r := pkgResult{Module: p.module, Package: e.Package, Passed: passed,
		Elapsed: time.Duration(e.Elapsed * float64(time.Second))}
	if b := p.output[e.Package+"\x00"]; b != nil && strings.Contains(b.String(), "[no test files]") {
		r.Skipped = true
	}
	if !passed {
		for _, t := range p.failed[e.Package] {
			// A parent fails with its subtests: report the leaves.
			if hasChild(p.failed[e.Package], t) {
				continue
			}
			r.Failed = append(r.Failed, testFailure{Test: t, Output: p.text(e.Package, t)})
		}
		r.Failed = append(r.Failed, p.unfinished(e.Package)...)
		if len(r.Failed) == 0 {
			r.Failed = []testFailure{{Output: p.text(e.Package, "")}}
		}
	}
	delete(p.running, e.Package)
	for k := range p.output {
		if strings.HasPrefix(k, e.Package+"\x00") {
			delete(p.output, k)
		}
	}
	r.Tests = p.times[e.Package]
	delete(p.failed, e.Package)
	delete(p.times, e.Package)
	p.done(r)
}

// unfinished are the failures of pkg's tests that never ended, each
// with its output and then the package's own (where go test prints a
// timeout's panic and the goroutines).
func (p *parser) unfinished(pkg string) []testFailure {
	var names []string
	for t := range p.running[pkg] {
		if !hasChild(keys(p.running[pkg]), t) {
			names = append(names, t)
		}
	}
	sort.Strings(names)
	var out []testFailure
	for _, t := range names {
		out = append(out, testFailure{Test: t + " (did not finish)", Output: p.text(pkg, t) + p.text(pkg, "")})
	}
	return out
}

func keys(m map[string]bool) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func (p *parser) text(pkg, test string) string {
	if b := p.output[pkg+"\x00"+test]; b != nil {
		return b.String()
	}
	return ""
}

func (p *parser) sawFailure() bool { return p.any }

func hasChild(tests []string, t string) bool {
	for _, u := range tests {
		if strings.HasPrefix(u, t+"/") {
			return true
		}
	}
	return false
}

// results gathers package results across runs.
type results struct {
	mu     sync.Mutex
	byPk   map[string][]pkgResult
	frozen bool // see freeze
}

func newResults() *results { return &results{byPk: map[string][]pkgResult{}} }

// add records x; false, recording nothing, once r is frozen.
func (r *results) add(x pkgResult) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.frozen {
		return false
	}
	r.byPk[x.Package] = append(r.byPk[x.Package], x)
	return true
}

// freeze makes r take no more results: what a run that is about to be
// killed reports is its kill, not a flake.
func (r *results) freeze() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.frozen = true
}

func (r *results) failed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, xs := range r.byPk {
		for _, x := range xs {
			if !x.Passed {
				n++
			}
		}
	}
	return n
}

func (r *results) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, xs := range r.byPk {
		n += len(xs)
	}
	return n
}

// packages returns the packages in order, with their results.
func (r *results) packages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for p := range r.byPk {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

func (r *results) of(pkg string) []pkgResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]pkgResult(nil), r.byPk[pkg]...)
}
