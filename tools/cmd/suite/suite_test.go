package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseBudgets(t *testing.T) {
	b, err := parseBudgets("| package | budget |\n| --- | --- |\n| `fence` | 150 s |\n| `cmd/fencectl` | 90 s | why\n| fence | 1 s |\n")
	if err != nil {
		t.Fatal(err)
	}
	want := budgets{"fence": 150 * time.Second, "cmd/fencectl": 90 * time.Second}
	if len(b) != len(want) || b["fence"] != want["fence"] || b["cmd/fencectl"] != want["cmd/fencectl"] {
		t.Errorf("budgets %v, want %v", b, want)
	}
	if _, err := parseBudgets("no table"); err != errNoBudgets {
		t.Errorf("a page without the table: %v, want errNoBudgets", err)
	}
}

// A failing subtest is reported by its leaf name with its own output; a
// package that fails outside its tests (a panic in TestMain, a build
// error) with the package's output; a package without test files is
// marked skipped.
func TestParser(t *testing.T) {
	stream := strings.Join([]string{
		`{"Action":"start","Package":"github.com/fencelock/fencelock/outbox"}`,
		`{"Action":"run","Package":"github.com/fencelock/fencelock/outbox","Test":"TestA"}`,
		`{"Action":"output","Package":"github.com/fencelock/fencelock/outbox","Test":"TestA/sub","Output":"    a_test.go:9: expected 2, actual 1\n"}`,
		`{"Action":"fail","Package":"github.com/fencelock/fencelock/outbox","Test":"TestA/sub","Elapsed":0.1}`,
		`{"Action":"fail","Package":"github.com/fencelock/fencelock/outbox","Test":"TestA","Elapsed":0.2}`,
		`{"Action":"pass","Package":"github.com/fencelock/fencelock/outbox","Test":"TestB","Elapsed":0.2}`,
		`{"Action":"fail","Package":"github.com/fencelock/fencelock/outbox","Elapsed":35.8}`,
		`{"Action":"output","Package":"github.com/fencelock/fencelock/fence","Output":"panic: boom\n"}`,
		`{"Action":"fail","Package":"github.com/fencelock/fencelock/fence","Elapsed":1}`,
		`{"Action":"output","Package":"github.com/fencelock/fencelock/guard/guardtest","Output":"?   \tgithub.com/fencelock/fencelock/guard/guardtest\t[no test files]\n"}`,
		`{"Action":"skip","Package":"github.com/fencelock/fencelock/guard/guardtest","Elapsed":0}`,
		`not json`,
	}, "\n")
	var got []pkgResult
	p := newParser(".", func(r pkgResult) { got = append(got, r) })
	p.read(strings.NewReader(stream))
	if len(got) != 3 {
		t.Fatalf("%d results, want 3: %+v", len(got), got)
	}
	o := got[0]
	if o.Passed || dirOf(o.Package) != "outbox" || o.Elapsed != 35800*time.Millisecond {
		t.Errorf("outbox: %+v", o)
	}
	if len(o.Failed) != 1 || o.Failed[0].Test != "TestA/sub" || !strings.Contains(o.Failed[0].Output, "expected 2, actual 1") {
		t.Errorf("outbox's failures: %+v", o.Failed)
	}
	if len(o.Tests) != 2 || o.Tests[0].Test != "TestA" || o.Tests[1].Elapsed != 200*time.Millisecond {
		t.Errorf("outbox's top-level test times: %+v", o.Tests)
	}
	if f := got[1]; f.Passed || len(f.Failed) != 1 || f.Failed[0].Test != "" || !strings.Contains(f.Failed[0].Output, "panic: boom") {
		t.Errorf("fence: %+v", f)
	}
	if g := got[2]; !g.Passed || !g.Skipped {
		t.Errorf("guardtest: %+v", g)
	}
	if !p.sawFailure() {
		t.Error("sawFailure: false after two failed packages")
	}
}

func TestLocate(t *testing.T) {
	s := &suite{cfg: config{root: "../../.."}, mods: []string{".", "chaos", "examples/sqlx-gorm", "tools"}}
	for _, c := range []struct{ dir, mod, pkg string }{
		{"./outbox", ".", "./outbox"},
		{"outbox/", ".", "./outbox"},
		{"./chaos", "chaos", "."},
		{"./chaos/cmd/chaos", "chaos", "./cmd/chaos"},
		{"examples/sqlx-gorm", "examples/sqlx-gorm", "."},
		{"./examples/inventory-sync", ".", "./examples/inventory-sync"},
	} {
		m, p, err := s.locate(c.dir)
		if err != nil || m != c.mod || p != c.pkg {
			t.Errorf("locate(%q) = %q, %q, %v; want %q, %q", c.dir, m, p, err, c.mod, c.pkg)
		}
	}
	if _, _, err := s.locate("./nosuch"); err == nil {
		t.Error("locate of a missing directory: no error")
	}
}

// A package whose binary timed out fails with the tests that never
// ended, each with its output and the package's (the timeout's panic).
func TestParserTimeout(t *testing.T) {
	stream := strings.Join([]string{
		`{"Action":"run","Package":"github.com/fencelock/fencelock/docs","Test":"TestFast"}`,
		`{"Action":"pass","Package":"github.com/fencelock/fencelock/docs","Test":"TestFast","Elapsed":0.1}`,
		`{"Action":"run","Package":"github.com/fencelock/fencelock/docs","Test":"TestSlow"}`,
		`{"Action":"run","Package":"github.com/fencelock/fencelock/docs","Test":"TestSlow/README"}`,
		`{"Action":"output","Package":"github.com/fencelock/fencelock/docs","Test":"TestSlow/README","Output":"building README.md:60\n"}`,
		`{"Action":"output","Package":"github.com/fencelock/fencelock/docs","Output":"panic: test timed out after 9m0s\n"}`,
		`{"Action":"fail","Package":"github.com/fencelock/fencelock/docs","Elapsed":540}`,
	}, "\n")
	var got []pkgResult
	p := newParser(".", func(r pkgResult) { got = append(got, r) })
	p.read(strings.NewReader(stream))
	if len(got) != 1 || got[0].Passed {
		t.Fatalf("results %+v, want docs failed", got)
	}
	f := got[0].Failed
	if len(f) != 1 || f[0].Test != "TestSlow/README (did not finish)" ||
		!strings.Contains(f[0].Output, "building README.md:60") || !strings.Contains(f[0].Output, "panic: test timed out") {
		t.Errorf("failures %+v, want TestSlow/README unfinished with its output and the panic", f)
	}
}

// make flakes -pkg counts the load's runs too, but not what its kill at
// the end reports, and prints only the load's failures, marked as the
// load's.
func TestLoadResults(t *testing.T) {
	load := newResults()
	ok := pkgResult{Package: "github.com/fencelock/fencelock/outbox", Passed: true}
	fail := pkgResult{Package: "github.com/fencelock/fencelock/fence", Failed: []testFailure{{Test: "TestX", Output: "boom\n"}}}
	if !load.add(ok) || !load.add(fail) {
		t.Fatal("add refused a result before freeze")
	}
	load.freeze()
	killed := pkgResult{Package: "github.com/fencelock/fencelock/fence", Failed: []testFailure{{Test: "TestKilled"}}}
	if load.add(killed) {
		t.Error("add took a result after freeze")
	}
	if load.count() != 2 || load.failed() != 1 {
		t.Errorf("count %d failed %d, want 2 and 1", load.count(), load.failed())
	}
	var out strings.Builder
	p := &printer{w: &out, failuresOnly: true, prefix: "load: "}
	p.pkg(ok, nil)
	p.pkg(fail, nil)
	if got := out.String(); strings.Contains(got, "outbox") || !strings.HasPrefix(got, "load: FAIL  fence") || !strings.Contains(got, "TestX") {
		t.Errorf("the load's printer printed:\n%s", got)
	}
}
