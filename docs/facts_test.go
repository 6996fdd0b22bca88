package docs_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestModulesListed: CONTRIBUTING.md's layout marks every module of the
// repository (each directory with a go.mod but the root) "own module",
// and nothing else; make vet, tidy and test find the modules by their
// go.mod, so a module missing from the table is one a contributor does
// not know to test from its directory.
func TestModulesListed(t *testing.T) {
	root := repoRoot(t)
	var modules []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return fs.SkipDir
		}
		if d.Name() == "go.mod" && filepath.Dir(path) != root {
			rel, _ := filepath.Rel(root, filepath.Dir(path))
			modules = append(modules, filepath.ToSlash(rel)+"/")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "CONTRIBUTING.md"))
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([^`]+)` \\|[^\\n]*\\(own module\\)").FindAllStringSubmatch(string(b), -1) {
		listed = append(listed, m[1])
	}
	sort.Strings(modules)
	sort.Strings(listed)
	if strings.Join(modules, " ") != strings.Join(listed, " ") {
		t.Errorf("CONTRIBUTING.md's layout marks %v as own modules; the repository's modules are %v: mark each row of a directory with a go.mod \"(own module)\"", listed, modules)
	}
}
