//go:build ignore

// installcheck proves that cmd/fencectl installs from this checkout the two
// ways a user gets it, from an empty directory and with nothing but the
// module's own go.mod and go.sum:
//
//  1. go install -n github.com/fencelock/fencelock/cmd/fencectl@<version>
//     (what go run ...@<version> resolves, downloads and loads, without
//     compiling), served by a local module proxy that holds the checkout as
//     that version (the library's go.mod alone decides what is built, as it
//     does for a published version);
//  2. from an empty module that requires the library with a replace to the
//     checkout: go run github.com/fencelock/fencelock/cmd/fencectl --help.
//
// Run by make test as `go run .ci/installcheck.go`; it needs the Go module
// cache to hold the library's dependencies (any build of the module fills
// it) and no network.
package main

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

const (
	modPath = "github.com/fencelock/fencelock"
	cmdPath = modPath + "/cmd/fencectl"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "installcheck:", err)
		os.Exit(1)
	}
	fmt.Println("installcheck: fencectl runs from an empty module (go run @version, and with a replace)")
}

func run() error {
	root, err := filepath.Abs(".")
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, "cmd", "fencectl")); err != nil {
		return fmt.Errorf("run it from the repository root (no cmd/fencectl in %s)", root)
	}
	modcache, err := goEnv("GOMODCACHE")
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "installcheck-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	const fix = "fix: make the library module tidy: go mod tidy (then commit go.mod and go.sum)"

	// 1. The checkout as one version of the module, in a local proxy that
	// also serves, from the module cache, exact versions of other modules
	// but no version lists: a dependency that the library's go.mod does
	// not name cannot be resolved to some latest version, and no network
	// is needed.
	version := fmt.Sprintf("v0.0.0-checkout.%d", time.Now().Unix())
	proxy := filepath.Join(tmp, "proxy")
	if err := linkExactVersions(proxy, filepath.Join(modcache, "cache", "download")); err != nil {
		return err
	}
	if err := writeModule(proxy, root, version); err != nil {
		return err
	}
	empty := filepath.Join(tmp, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		return err
	}
	// go install -n resolves and downloads every module the command
	// needs, as go run does, and loads its packages, without compiling
	// them: in a module cache of its own every dependency would compile
	// again (minutes on 2 cores), and 2. below compiles and runs the same
	// code from the same go.mod.
	err = installResolves(empty, cmdPath+"@"+version,
		"GOPROXY=file://"+filepath.ToSlash(proxy),
		"GOSUMDB=off", // offline; the cache's files were verified when go downloaded them
		"GOMODCACHE="+filepath.Join(tmp, "modcache"),
		"GOBIN="+filepath.Join(tmp, "bin"),
		goflags("-modcacherw"), // so that the temporary module cache can be removed
		"GOWORK=off")
	if err != nil {
		return fmt.Errorf("go install %s@%s from an empty directory (the checkout served as that version): %w\n%s", cmdPath, version, err, fix)
	}

	// 2. A module that requires the library with a replace to the checkout
	// and holds the library's go.sum: the library's go.mod must name every
	// module its command needs, and its go.sum their checksums.
	consumer := filepath.Join(tmp, "consumer")
	if err := os.Mkdir(consumer, 0o755); err != nil {
		return err
	}
	gomod := "module example.com/consumer\n\ngo 1.26.0\n\n" +
		"require " + modPath + " v0.0.0-00010101000000-000000000000\n\n" +
		"replace " + modPath + " => " + root + "\n"
	if err := os.WriteFile(filepath.Join(consumer, "go.mod"), []byte(gomod), 0o644); err != nil {
		return err
	}
	gosum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(consumer, "go.sum"), gosum, 0o644); err != nil {
		return err
	}
	// -race, as make test builds: the command's packages are those the
	// tests compiled, and only its main package compiles here.
	err = fencectlHelp(consumer, cmdPath, "GOPROXY=off", goflags("-mod=readonly -race"), "GOWORK=off")
	if err != nil {
		return fmt.Errorf("go run %s from a module that requires the library with a replace to %s and holds its go.sum: %w\n%s", cmdPath, root, err, fix)
	}
	return nil
}

// installResolves runs `go install -n <target>` in dir: the modules of
// target resolved and downloaded, its packages loaded, nothing compiled.
func installResolves(dir, target string, env ...string) error {
	cmd := exec.Command("go", "install", "-n", target)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%v\n%s", err, lastLines(out.String(), 20))
	}
	return nil
}

// lastLines is the last n lines of s (go install -n prints every command
// it would run).
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// fencectlHelp runs `go run <target> --help` in dir and checks that it
// printed fencectl's help.
func fencectlHelp(dir, target string, env ...string) error {
	cmd := exec.Command("go", "run", target, "--help")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%v\n%s", err, strings.TrimSpace(out.String()))
	}
	if !strings.Contains(out.String(), "fencectl") || !strings.Contains(out.String(), "migrate") {
		return fmt.Errorf("it exited 0 but did not print fencectl's help:\n%s", out.String())
	}
	return nil
}

// linkExactVersions fills the GOPROXY directory proxy with links to the
// version files (info, mod, zip) of every module in the module cache's
// download directory, leaving out the version lists.
func linkExactVersions(proxy, download string) error {
	return filepath.WalkDir(download, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(download, path)
		if d.IsDir() {
			if rel == "sumdb" {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".info", ".mod", ".zip":
		default:
			return nil // list, lock, ziphash, partial downloads
		}
		dst := filepath.Join(proxy, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		return os.Symlink(path, dst)
	})
}

// writeModule adds to the GOPROXY directory proxy the library module of
// root as version.
func writeModule(proxy, root, version string) error {
	dir := filepath.Join(proxy, filepath.FromSlash(modPath), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return err
	}
	info, _ := json.Marshal(map[string]string{"Version": version, "Time": time.Now().UTC().Format(time.RFC3339)})
	for name, data := range map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": info,
		version + ".mod":  gomod,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	f, err := os.Create(filepath.Join(dir, version+".zip"))
	if err != nil {
		return err
	}
	if err := writeZip(f, root, modPath+"@"+version); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeZip writes the module zip of root: its files (those git tracks or
// would track, when root is a git checkout) under the prefix
// module@version/, leaving out directories that are modules of their own
// (bench, chaos, otel, ...), as the go command does.
func writeZip(w io.Writer, root, prefix string) error {
	files, err := moduleFiles(root)
	if err != nil {
		return err
	}
	zw := zip.NewWriter(w)
	for _, rel := range files {
		data, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return err
		}
		fw, err := zw.Create(prefix + "/" + filepath.ToSlash(rel))
		if err != nil {
			return err
		}
		if _, err := fw.Write(data); err != nil {
			return err
		}
	}
	return zw.Close()
}

// moduleFiles lists the regular files of the module rooted at root,
// relative to it.
func moduleFiles(root string) ([]string, error) {
	var all []string
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	if out, err := cmd.Output(); err == nil {
		all = strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	} else { // not a git checkout: every file but .git
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == ".git" {
				return filepath.SkipDir
			}
			if !d.IsDir() {
				rel, _ := filepath.Rel(root, path)
				all = append(all, rel)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	var files []string
	nested := map[string]bool{} // directory -> holds a go.mod of its own (or is inside one)
	for _, rel := range all {
		if st, err := os.Lstat(filepath.Join(root, rel)); err != nil || !st.Mode().IsRegular() {
			continue // deleted in the work tree, or a link
		}
		if inNestedModule(root, filepath.Dir(rel), nested) {
			continue
		}
		files = append(files, rel)
	}
	return files, nil
}

func inNestedModule(root, dir string, memo map[string]bool) bool {
	if dir == "." || dir == "" {
		return false
	}
	if v, ok := memo[dir]; ok {
		return v
	}
	_, err := os.Stat(filepath.Join(root, dir, "go.mod"))
	v := err == nil || inNestedModule(root, filepath.Dir(dir), memo)
	memo[dir] = v
	return v
}

// goflags is GOFLAGS with flags added to the caller's own (less any -mod,
// which the check sets itself).
func goflags(flags string) string {
	var keep []string
	for _, f := range strings.Fields(os.Getenv("GOFLAGS")) {
		if !strings.HasPrefix(f, "-mod=") {
			keep = append(keep, f)
		}
	}
	return "GOFLAGS=" + strings.Join(append(keep, flags), " ")
}

func goEnv(name string) (string, error) {
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}
