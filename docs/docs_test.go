// Package docs_test checks the documentation against the checkout: every
// Go block in a Markdown file of the repository builds, programs shown with
// their output print that output against real servers, programs that take
// a lock release it on every path (release_test.go), the README stays a
// front door (at most 12 KiB), and what go doc shows of a public package
// names nothing internal (api_test.go). The convention is in
// CONTRIBUTING.md.
package docs_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/format"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/fencelock/fencelock/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// maxREADME is the README's budget: what a newcomer reads in minutes.
const maxREADME = 12 << 10

func TestREADMESize(t *testing.T) {
	st, err := os.Stat(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > maxREADME {
		t.Errorf("README.md is %d bytes, more than %d (12 KiB): move what is not for a newcomer to docs/ or a module's README and link it", st.Size(), maxREADME)
	}
}

// block is one fenced code block of a Markdown file.
type block struct {
	file  string // relative to the repository root, slash-separated
	line  int    // line of the opening fence (1-based)
	info  string // the info string: "go", "console", ...
	body  string
	index int // position among the file's blocks
}

func (b block) String() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

// TestGoBlocksBuild compiles every ```go block of every Markdown file against
// the checkout, in the module that holds the file (otel/README.md in the
// otel module, and so on), as if the block were a file of a package of its
// own there. A block must be a whole file (it starts with its package
// clause) and be gofmt-formatted.
func TestGoBlocksBuild(t *testing.T) {
	root := repoRoot(t)
	byModule := map[string][]block{} // module directory -> its Go blocks
	n := 0
	for _, f := range markdownFiles(t, root) {
		for _, b := range parseBlocks(t, root, f) {
			if b.info != "go" {
				// Go under another tag, or none, would escape the build.
				if strings.EqualFold(b.info, "golang") || strings.EqualFold(b.info, "go") || (b.info == "" && startsWithPackage(b.body)) {
					t.Errorf("%s: a Go block is tagged %q: tag it ```go, so that this test builds it", b, b.info)
				}
				continue
			}
			n++
			if !startsWithPackage(b.body) {
				t.Errorf("%s: a ```go block must be a whole Go file, starting with its package clause (package main for a program); show a fragment inside a function of a small file, or as ```text", b)
				continue
			}
			if formatted, err := format.Source([]byte(b.body)); err != nil {
				t.Errorf("%s: %v", b, err) // the build below names it too, with the line
			} else if string(formatted) != b.body {
				t.Errorf("%s: the block is not gofmt-formatted; gofmt gives:\n%s", b, formatted)
			}
			mod := moduleOf(root, f)
			byModule[mod] = append(byModule[mod], b)
		}
	}
	if n == 0 {
		t.Fatal("no ```go block found in the repository's Markdown files: the extraction is broken")
	}
	mods := make([]string, 0, len(byModule))
	for m := range byModule {
		mods = append(mods, m)
	}
	sort.Strings(mods)
	for _, mod := range mods {
		t.Run(strings.ReplaceAll(mod, "/", "_"), func(t *testing.T) {
			buildBlocks(t, root, mod, byModule[mod], "")
		})
	}
}

// TestProgramOutputs runs every program (a ```go block with package main)
// that the Markdown shows with its output, a ```console block right after it
// that starts with "$ go run .": the program runs with REDIS_URL and
// DATABASE_URL set to a fresh Redis server and a fresh database, and must
// print what the block shows.
func TestProgramOutputs(t *testing.T) {
	root := repoRoot(t)
	found := 0
	for _, f := range markdownFiles(t, root) {
		blocks := parseBlocks(t, root, f)
		for i := 0; i+1 < len(blocks); i++ {
			prog, out := blocks[i], blocks[i+1]
			if prog.info != "go" || out.info != "console" || !strings.HasPrefix(out.body, "$ go run .\n") {
				continue
			}
			found++
			t.Run(strings.ReplaceAll(prog.String(), "/", "_"), func(t *testing.T) {
				if moduleOf(root, f) != "." {
					t.Fatalf("%s: programs shown with their output run in the library module only; this one is in %s", prog, moduleOf(root, f))
				}
				bin := filepath.Join(t.TempDir(), "prog")
				buildBlocks(t, root, ".", []block{prog}, bin)
				if t.Failed() {
					return
				}
				rds := testenv.NewRedisServer(t)
				db := testenv.NewDB(t)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				cmd := exec.CommandContext(ctx, bin)
				cmd.Env = append(os.Environ(), "REDIS_URL="+rds.URL, "DATABASE_URL="+db.URL)
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				if err := cmd.Run(); err != nil {
					t.Fatalf("%s: the program failed: %v\nstdout:\n%s\nstderr:\n%s", prog, err, stdout.String(), stderr.String())
				}
				want := strings.TrimPrefix(out.body, "$ go run .\n")
				if got := stdout.String(); got != want {
					t.Errorf("%s: the program printed\n%s\nbut %s shows\n%s", prog, got, out, want)
				}
			})
		}
	}
	if found == 0 {
		t.Fatal("no program shown with its output (a ```console block starting with \"$ go run .\" after a ```go block): README.md's quickstart should be one")
	}
}

// TestLinks checks every relative link of the Markdown files: the file it
// names exists and, for a link to a heading (file.md#heading), the heading
// is there, so that moving a section cannot leave a link behind.
func TestLinks(t *testing.T) {
	root := repoRoot(t)
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	anchors := map[string]map[string]bool{} // file -> heading anchors
	anchorsOf := func(file string) map[string]bool {
		if a, ok := anchors[file]; ok {
			return a
		}
		a := map[string]bool{}
		data, _ := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
		inCode := false
		for _, line := range strings.Split(string(data), "\n") {
			trimmed := strings.TrimLeft(line, " ")
			if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
				inCode = !inCode
			}
			if !inCode && strings.HasPrefix(line, "#") {
				a[slug(strings.TrimLeft(line, "# "))] = true
			}
		}
		anchors[file] = a
		return a
	}
	for _, f := range markdownFiles(t, root) {
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			t.Fatal(err)
		}
		text := stripCode(string(data))
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			dest := f
			if file != "" {
				dest = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(f), file)))
				if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(dest))); err != nil {
					t.Errorf("%s: link %q: no such file %s", f, target, dest)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[frag] {
				t.Errorf("%s: link %q: %s has no heading with the anchor #%s", f, target, dest, frag)
			}
		}
	}
}

// slug is the anchor GitHub gives a heading: lower case, punctuation
// dropped, spaces as dashes.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// stripCode blanks out fenced code blocks and inline code, where a "](" is
// not a link.
func stripCode(md string) string {
	var out []string
	inCode := false
	for _, line := range strings.Split(md, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			inCode = !inCode
			out = append(out, "")
			continue
		}
		if inCode {
			out = append(out, "")
			continue
		}
		out = append(out, inlineCode.ReplaceAllString(line, "``"))
	}
	return strings.Join(out, "\n")
}

var inlineCode = regexp.MustCompile("`[^`]*`")

// buildBlocks builds blocks, each as a package of its own inside module mod
// (a directory relative to root), through an overlay: nothing is written
// into the checkout. With out set (one block), the program is written there.
func buildBlocks(t *testing.T, root, mod string, blocks []block, out string) {
	t.Helper()
	tmp := t.TempDir()
	overlay := map[string]string{}
	where := map[string]block{} // "b<i>" -> block
	var pkgs []string
	for i, b := range blocks {
		dir := fmt.Sprintf("zz_doccheck/b%d", i)
		src := filepath.Join(tmp, fmt.Sprintf("b%d.go", i))
		if err := os.WriteFile(src, []byte(b.body), 0o644); err != nil {
			t.Fatal(err)
		}
		overlay[filepath.Join(root, mod, filepath.FromSlash(dir), "doc.go")] = src
		where[fmt.Sprintf("b%d", i)] = b
		pkgs = append(pkgs, "./"+dir)
	}
	data, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	ovl := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(ovl, data, 0o644); err != nil {
		t.Fatal(err)
	}
	// Without a program to run, the blocks are compiled (go list -export
	// compiles a package for its export data, and fails as go build does)
	// but not linked: a program per block costs far more to link than to
	// compile.
	args := []string{"list", "-export", "-f", "{{.Export}}", "-overlay", ovl}
	if out != "" {
		args = []string{"build", "-overlay", ovl, "-o", out}
	}
	cmd := exec.Command(goBin(), append(args, pkgs...)...)
	cmd.Dir = filepath.Join(root, mod)
	cmd.Env = append(os.Environ(), goflags("-mod=readonly -race"), "GOWORK=off")
	var msg bytes.Buffer // the errors; go list's output is the export files
	cmd.Stderr = &msg
	if err := cmd.Run(); err != nil {
		t.Errorf("a Go block shown in the docs does not compile against the checkout (fix the doc, or the code it shows):\n%s",
			relocate(msg.String(), where))
	}
}

// relocate rewrites the compiler's positions in a block's file
// (/tmp/.../b3.go:12:5, or zz_doccheck/b3/doc.go:12:5) into Markdown
// positions (README.md:140:5).
var overlayPos = regexp.MustCompile(`(?:\S*/(b\d+)\.go|(?:\./)?zz_doccheck/(b\d+)/doc\.go):(\d+)`)

func relocate(msg string, where map[string]block) string {
	return overlayPos.ReplaceAllStringFunc(msg, func(s string) string {
		m := overlayPos.FindStringSubmatch(s)
		b, ok := where[m[1]+m[2]]
		if !ok {
			return s
		}
		line, _ := strconv.Atoi(m[3])
		return fmt.Sprintf("%s:%d", b.file, b.line+line)
	})
}

// markdownFiles lists the repository's Markdown files (relative, slash
// separated), leaving out .git and testdata.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			rel, _ := filepath.Rel(root, path)
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// parseBlocks returns the fenced code blocks (``` or ~~~) of a Markdown
// file; a fence indented in a list item has its indentation removed from
// the block's lines.
func parseBlocks(t *testing.T, root, file string) []block {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
	if err != nil {
		t.Fatal(err)
	}
	var (
		blocks []block
		cur    *block
		fence  string
		indent string
		body   strings.Builder
	)
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for ln := 1; sc.Scan(); ln++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		if cur == nil {
			if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
				fence = trimmed[:3]
				indent = line[:len(line)-len(trimmed)]
				cur = &block{file: file, line: ln, info: strings.Fields(trimmed[3:] + " x")[0], index: len(blocks)}
				if cur.info == "x" {
					cur.info = ""
				}
				body.Reset()
			}
			continue
		}
		if strings.HasPrefix(trimmed, fence) && strings.TrimSpace(trimmed[3:]) == "" {
			cur.body = body.String()
			blocks = append(blocks, *cur)
			cur = nil
			continue
		}
		body.WriteString(strings.TrimPrefix(line, indent))
		body.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Errorf("%s: a code block is never closed", cur)
	}
	return blocks
}

// startsWithPackage reports whether src, after comments and blank lines,
// starts with a package clause.
func startsWithPackage(src string) bool {
	inComment := false
	for _, line := range strings.Split(src, "\n") {
		l := strings.TrimSpace(line)
		switch {
		case inComment:
			if strings.Contains(l, "*/") {
				inComment = false
			}
		case l == "" || strings.HasPrefix(l, "//"):
		case strings.HasPrefix(l, "/*"):
			inComment = !strings.Contains(l, "*/")
		default:
			return strings.HasPrefix(l, "package ")
		}
	}
	return false
}

// moduleOf returns the directory (relative to root, "." for the library)
// of the module that holds file: its nearest directory with a go.mod.
func moduleOf(root, file string) string {
	dir := filepath.Dir(filepath.FromSlash(file))
	for dir != "." {
		if _, err := os.Stat(filepath.Join(root, dir, "go.mod")); err == nil {
			return filepath.ToSlash(dir)
		}
		dir = filepath.Dir(dir)
	}
	return "."
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod in %s: run the test from the docs directory of the checkout", root)
	}
	return root
}

// goflags is GOFLAGS with flags added to the caller's own (less any -mod,
// which the test sets itself).
func goflags(flags string) string {
	var keep []string
	for _, f := range strings.Fields(os.Getenv("GOFLAGS")) {
		if !strings.HasPrefix(f, "-mod=") {
			keep = append(keep, f)
		}
	}
	return "GOFLAGS=" + strings.Join(append(keep, flags), " ")
}

// goBin is the go command: GOROOT's when set, else the one on PATH (the
// one that runs these tests, as make test and CONTRIBUTING.md run them).
func goBin() string {
	if root := os.Getenv("GOROOT"); root != "" {
		if p := filepath.Join(root, "bin", "go"); fileExists(p) {
			return p
		}
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
