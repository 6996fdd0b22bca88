package docs_test

import (
	"bytes"
	"encoding/json"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// TestPublicAPINamesNoInternalPackage reads what go doc -all shows of every
// public package of every module of the repository (a package whose import
// path has no internal element, and is not a command) and fails if a
// declaration there names something of an internal package: a user sees
// that name in the docs and can neither import it nor look it up. An
// exported option type over an internal settings struct is the usual
// case: it is made opaque instead.
func TestPublicAPINamesNoInternalPackage(t *testing.T) {
	root := repoRoot(t)
	var pkgs []listedPackage
	names := map[string]string{} // import path -> package name, every module
	for _, mod := range modules(t, root) {
		for _, p := range listPackages(t, filepath.Join(root, mod)) {
			names[p.ImportPath] = p.Name
			p.mod = mod
			pkgs = append(pkgs, p)
		}
	}
	checked := 0
	for _, p := range pkgs {
		if isInternal(p.ImportPath) || p.Name == "main" || len(p.GoFiles) == 0 {
			continue
		}
		checked++
		quals := internalQualifiers(t, p, names)
		if len(quals) == 0 {
			continue
		}
		alt := make([]string, 0, len(quals))
		for q := range quals {
			alt = append(alt, regexp.QuoteMeta(q))
		}
		sort.Strings(alt)
		named := regexp.MustCompile(`(?:^|[^\w.])(` + strings.Join(alt, "|") + `)\.\w`)
		for _, d := range docDeclarations(t, filepath.Join(root, p.mod), p.ImportPath) {
			if m := named.FindStringSubmatch(d); m != nil {
				t.Errorf("%s: go doc shows %q, which names %s, an internal package a user can neither import nor look up: make the exported name opaque (an interface with an unexported method, a struct with unexported fields) or move the type out of internal/",
					p.ImportPath, strings.TrimSpace(d), quals[m[1]])
			}
		}
	}
	if checked < 5 {
		t.Fatalf("only %d public packages found in the repository's modules: the package listing is broken", checked)
	}
}

type listedPackage struct {
	ImportPath string
	Name       string
	Dir        string
	GoFiles    []string
	CgoFiles   []string
	mod        string
}

// modules lists the directories (relative to root) that hold a go.mod.
func modules(t *testing.T, root string) []string {
	t.Helper()
	var mods []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.Name() == "go.mod" {
			rel, _ := filepath.Rel(root, filepath.Dir(p))
			mods = append(mods, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return mods
}

func listPackages(t *testing.T, dir string) []listedPackage {
	t.Helper()
	out := goCmd(t, dir, "list", "-e", "-json=ImportPath,Name,Dir,GoFiles,CgoFiles", "./...")
	var pkgs []listedPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list in %s: %v", dir, err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// isInternal reports whether an import path has an internal element, which
// only the tree above it may import.
func isInternal(importPath string) bool {
	for _, e := range strings.Split(importPath, "/") {
		if e == "internal" {
			return true
		}
	}
	return false
}

// internalQualifiers returns the names by which p's files refer to internal
// packages (the import's own name, or the package's name), each with the
// import path it stands for.
func internalQualifiers(t *testing.T, p listedPackage, names map[string]string) map[string]string {
	t.Helper()
	quals := map[string]string{}
	fset := token.NewFileSet()
	for _, f := range append(p.GoFiles, p.CgoFiles...) {
		file, err := parser.ParseFile(fset, filepath.Join(p.Dir, f), nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range file.Imports {
			ip, _ := strconv.Unquote(imp.Path.Value)
			if !isInternal(ip) {
				continue
			}
			q := names[ip]
			if q == "" {
				q = path.Base(ip)
			}
			if imp.Name != nil {
				q = imp.Name.Name
			}
			switch q {
			case "_":
				continue
			case ".":
				t.Errorf("%s: %s dot-imports %s: its names would show unqualified in go doc, out of this test's sight; import it by name", p.ImportPath, f, ip)
				continue
			}
			quals[q] = ip
		}
	}
	return quals
}

// docDeclarations returns the declaration lines of go doc -all for pkg,
// without their comments: everything after the package overview that is
// not doc text (indented by four spaces).
func docDeclarations(t *testing.T, modDir, pkg string) []string {
	t.Helper()
	out := goCmd(t, modDir, "doc", "-all", pkg)
	var decls []string
	inDecls := false
	for _, line := range strings.Split(string(out), "\n") {
		switch line {
		case "CONSTANTS", "VARIABLES", "FUNCTIONS", "TYPES":
			inDecls = true
			continue
		}
		if !inDecls || strings.HasPrefix(line, "    ") {
			continue
		}
		code := strings.TrimLeft(line, "\t")
		if strings.HasPrefix(code, "//") {
			continue
		}
		if i := strings.Index(code, " //"); i >= 0 {
			code = code[:i]
		}
		if strings.TrimSpace(code) != "" {
			decls = append(decls, line)
		}
	}
	if !inDecls && bytes.Contains(out, []byte("\nfunc ")) {
		t.Fatalf("go doc -all %s: no CONSTANTS/VARIABLES/FUNCTIONS/TYPES section found: its output format changed, and this test reads nothing", pkg)
	}
	return decls
}

func goCmd(t *testing.T, dir string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(goBin(), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), goflags("-mod=readonly -race"), "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s (in %s): %v\n%s", strings.Join(args, " "), dir, err, stderr.String())
	}
	return out
}
