package fence_test

import (
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// typeCheck type-checks a file of package p that imports fence and
// returns the type errors. Imports are read from the compiler's export
// data (go list -export, cached by the go command): cheaper than
// type-checking go-redis from source under the race detector.
func typeCheck(t *testing.T, src string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-race", "-export", "-deps", "-f", "{{.ImportPath}}={{.Export}}",
		"context", "log/slog", "time", "github.com/fencelock/fencelock/fence").Output()
	require.NoError(t, err, "go list -export")
	exports := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, file, _ := strings.Cut(line, "=")
		exports[path] = file
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	require.NoError(t, err)
	var errs []string
	conf := types.Config{
		Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
			file, ok := exports[path]
			if !ok || file == "" {
				return nil, fmt.Errorf("no export data for %q", path)
			}
			return os.Open(file)
		}),
		Error: func(err error) { errs = append(errs, err.Error()) },
	}
	_, _ = conf.Check("p", fset, []*ast.File{f}, nil)
	return errs
}

// Options come in kinds: a client-only option passed to an acquisition is
// a compile error, not a run-time one; options valid at both levels are
// accepted at both.
func TestOptionKindsCheckedAtCompileTime(t *testing.T) {
	t.Parallel()
	errs := typeCheck(t, `package p

import (
	"context"
	"log/slog"
	"time"

	"github.com/fencelock/fencelock/fence"
)

func ok(rdb fence.RedisClient, c *fence.Client, ctx context.Context) {
	_, _ = fence.New(rdb, fence.WithPrefix("p:"), fence.WithLogger(slog.Default()), fence.WithLease(time.Second),
		fence.WithHolder("h"), fence.WithWaitLimit(time.Second), fence.WithMaxHold(0), fence.WithFixedLease(time.Second),
		fence.WithReplicaSync(0, 0))
	_, _ = c.Acquire(ctx, "x", fence.WithLease(time.Second), fence.WithHolder("h"), fence.WithWaitLimit(time.Second),
		fence.WithMaxHold(0), fence.WithFixedLease(time.Second), fence.WithReplicaSync(0, 0))
	var _ fence.ClientOption = fence.WithLease(time.Second)
	var _ fence.LockOption = fence.WithLease(time.Second)
}

func misuse(c *fence.Client, ctx context.Context) {
	_, _ = c.Acquire(ctx, "x", fence.WithPrefix("p:"))
	_, _ = c.TryAcquire(ctx, "x", fence.WithLogger(nil))
	_ = c.Do(ctx, "x", nil, fence.WithObserver(nil))
}
`)
	t.Log(strings.Join(errs, "\n"))
	require.Len(t, errs, 3, "exactly the three misuses fail to compile")
	for i, opt := range []string{"WithPrefix", "WithLogger", "WithObserver"} {
		assert.Contains(t, errs[i], opt)
		assert.Contains(t, errs[i], "does not implement fence.LockOption")
	}
}
