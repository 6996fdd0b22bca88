package docs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"testing"
)

// exits are the calls that end a program without running its deferred
// calls: a lock's deferred Release (or the client's Close) would be
// skipped, and the lock held until its lease runs out.
var exits = map[string]bool{"log.Fatal": true, "log.Fatalf": true, "log.Fatalln": true, "os.Exit": true}

// TestProgramsReleaseOnEveryPath checks every program in the Markdown (a
// ```go block of package main) that takes a lock, since readers copy
// them: it may end the process (log.Fatal, os.Exit) only in main's last
// statement, and main defers nothing, so that every deferred Release and
// Close has run when it does. A helper such as check(err) that calls
// log.Fatal after an Acquire would hold a failed run's lock for a whole
// lease; the README's quickstart once had one.
func TestProgramsReleaseOnEveryPath(t *testing.T) {
	root := repoRoot(t)
	found := 0
	for _, f := range markdownFiles(t, root) {
		for _, b := range parseBlocks(t, root, f) {
			if b.info != "go" || !startsWithPackage(b.body) {
				continue
			}
			fset := token.NewFileSet()
			file, err := parser.ParseFile(fset, b.file, b.body, 0)
			if err != nil || file.Name.Name != "main" || !takesLock(file) {
				continue // TestGoBlocksBuild reports a block that does not parse
			}
			found++
			for _, p := range releaseProblems(file) {
				t.Errorf("%s:%d: %s", b.file, b.line+fset.Position(p.pos).Line, p.msg)
			}
		}
	}
	if found == 0 {
		t.Fatal("no program that takes a lock found in the Markdown: README.md's quickstart is one, the check is broken")
	}
}

// takesLock reports whether file calls an Acquire or a TryAcquire.
func takesLock(file *ast.File) bool {
	found := false
	ast.Inspect(file, func(n ast.Node) bool {
		if c, ok := n.(*ast.CallExpr); ok {
			if s, ok := c.Fun.(*ast.SelectorExpr); ok && (s.Sel.Name == "Acquire" || s.Sel.Name == "TryAcquire") {
				found = true
			}
		}
		return !found
	})
	return found
}

type problem struct {
	pos token.Pos
	msg string
}

// releaseProblems are file's calls of exits anywhere but in main's last
// statement, and main's defer statements (which such a call in main
// skips).
func releaseProblems(file *ast.File) []problem {
	var main *ast.FuncDecl
	for _, d := range file.Decls {
		if f, ok := d.(*ast.FuncDecl); ok && f.Recv == nil && f.Name.Name == "main" && f.Body != nil {
			main = f
		}
	}
	var allowed ast.Node
	if main != nil && len(main.Body.List) > 0 {
		allowed = main.Body.List[len(main.Body.List)-1]
	}
	var out []problem
	ast.Inspect(file, func(n ast.Node) bool {
		if n == nil || n == allowed {
			return false
		}
		if c, ok := n.(*ast.CallExpr); ok {
			if s, ok := c.Fun.(*ast.SelectorExpr); ok {
				if pkg, ok := s.X.(*ast.Ident); ok && exits[pkg.Name+"."+s.Sel.Name] {
					out = append(out, problem{c.Pos(), pkg.Name + "." + s.Sel.Name + " ends the process without running the deferred calls (a lock's Release): " +
						"return the error to main, and end the process only in main's last statement"})
				}
			}
		}
		return true
	})
	if main != nil {
		ast.Inspect(main.Body, func(n ast.Node) bool {
			if d, ok := n.(*ast.DeferStmt); ok {
				out = append(out, problem{d.Pos(), "main defers a call, which its log.Fatal or os.Exit would skip: defer it in the function main calls (run), which returns its error"})
			}
			_, lit := n.(*ast.FuncLit)
			return !lit
		})
	}
	return out
}

// The check itself catches a check(err) helper that calls log.Fatal
// after an Acquire, an os.Exit after a deferred Release, and main
// deferring what its log.Fatal skips; the README's shape (run returns
// its error, main's last statement exits) passes.
func TestProgramsReleaseCheckCatches(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		problems  int
	}{
		{"check after Acquire", `package main
func main() {
	l, err := locks.Acquire(ctx, "x")
	check(err)
	defer l.Release(ctx)
	check(work())
}
func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}`, 2},
		{"os.Exit inside run", `package main
func main() { run() }
func run() { l, _ := locks.TryAcquire(ctx, "x"); defer l.Release(ctx); os.Exit(1) }`, 1},
		{"main defers", `package main
func main() {
	l, _ := locks.Acquire(ctx, "x")
	defer l.Release(ctx)
	log.Fatal(work())
}`, 1},
		{"the README's shape", `package main
func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}
func run() error { l, err := locks.Acquire(ctx, "x"); if err != nil { return err }; defer l.Release(ctx); return work() }`, 0},
	} {
		file, err := parser.ParseFile(token.NewFileSet(), tc.name, tc.src, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !takesLock(file) {
			t.Errorf("%s: takesLock missed the Acquire", tc.name)
		}
		if got := releaseProblems(file); len(got) != tc.problems {
			t.Errorf("%s: %d problems found, want %d: %v", tc.name, len(got), tc.problems, got)
		}
	}
}
