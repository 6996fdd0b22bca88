package docs_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/tick"
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

// TestDefaultsQuoted: the defaults the docs quote are the library's. Each
// entry is a file, a pattern whose groups are the figures as written, and
// the values they must show, formatted as the page writes them.
func TestDefaultsQuoted(t *testing.T) {
	secs := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + " s" }
	for _, c := range []struct {
		file, pattern string
		want          []string
	}{
		{"docs/locks.md", `fence\.New\(rdb\) // default lease (\d+ s), renewed every (\d+ s)`,
			[]string{secs(fence.DefaultLease), secs(fence.DefaultLease / 3)}},
		{"docs/leaders.md", "`fence.DefaultTermLease` \\((\\d+ s)\\)", []string{secs(fence.DefaultTermLease)}},
		{"docs/leaders.md", `liveness/3, (\d+ s) by default`, []string{secs(fence.DefaultLiveness / 3)}},
		{"docs/operations.md", `liveness/3, (\d+ s) by default`, []string{secs(fence.DefaultLiveness / 3)}},
		{"docs/troubleshooting.md", `liveness/3, (\d+ s) by default`, []string{secs(fence.DefaultLiveness / 3)}},
		{"docs/troubleshooting.md", `the default wait limit, (\S+) after the call`, []string{fence.DefaultWaitLimit.String()}},
		{"docs/scheduled-jobs.md", "`tick.WithTolerance`, default\\s+(one second)", []string{map[time.Duration]string{time.Second: "one second"}[tick.DefaultTolerance]}},
		{"docs/outbox.md", `every (\d+ ms) by default`, []string{strconv.FormatInt(outbox.DefaultPollInterval.Milliseconds(), 10) + " ms"}},
		{"docs/outbox.md", `runs out of attempts \((\d+) by default`, []string{strconv.Itoa(outbox.DefaultMaxAttempts)}},
		{"docs/troubleshooting.md", "`WithMaxAttempts` \\((\\d+),", []string{strconv.Itoa(outbox.DefaultMaxAttempts)}},
	} {
		b, err := os.ReadFile(filepath.Join(repoRoot(t), filepath.FromSlash(c.file)))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(c.pattern).FindStringSubmatch(string(b))
		if m == nil {
			t.Errorf("%s: nothing matches %s: the page no longer quotes this default; update this test with the page", c.file, c.pattern)
			continue
		}
		if got := m[1:]; !slices.Equal(got, c.want) {
			t.Errorf("%s: %q quotes %q; the library's defaults give %q", c.file, m[0], got, c.want)
		}
	}
}
