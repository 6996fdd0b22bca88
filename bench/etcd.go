package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fencelock/fencelock/testenv"
)

// etcdServer is a private single-member etcd the bench starts for the
// etcd peer of the fair lock's scenarios, on free loopback ports with a
// throwaway data directory.
type etcdServer struct {
	Endpoint string // http://127.0.0.1:<port>
	Version  string
	DataDir  string
	cmd      *exec.Cmd
	done     chan struct{}
	log      string
}

// etcdPaths are where etcd is looked for when it is not on PATH (Debian's
// etcd-server installs /usr/bin/etcd).
var etcdPaths = []string{"/usr/bin/etcd", "/usr/local/bin/etcd"}

// etcdBinary finds etcd, or says which package installs it.
func etcdBinary() (string, error) {
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	for _, p := range etcdPaths {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("etcd not found on PATH nor at " + strings.Join(etcdPaths, ", ") +
		": install the Debian package etcd-server (make deps-bench, or sudo apt-get install etcd-server), or leave the etcd peer out: go run . -etcd=false")
}

// etcdDataRoot is where the data directory goes: tmpfs when there is one,
// so that etcd's fsyncs cost nothing, as the bench's Redis persists
// nothing and its Postgres runs with fsync off.
func etcdDataRoot() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

// startEtcd starts etcd and waits until it answers /health.
func startEtcd(ctx context.Context) (*etcdServer, error) {
	bin, err := etcdBinary()
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 3 { // a port taken between choosing and binding: choose again
		s, err := startEtcdOnce(ctx, bin)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func startEtcdOnce(ctx context.Context, bin string) (*etcdServer, error) {
	client, err := testenv.ReservePort()
	if err != nil {
		return nil, err
	}
	peer, err := testenv.ReservePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(etcdDataRoot(), "fencelock-bench-etcd-")
	if err != nil {
		return nil, fmt.Errorf("etcd data dir: %w", err)
	}
	cu := "http://127.0.0.1:" + strconv.Itoa(client)
	pu := "http://127.0.0.1:" + strconv.Itoa(peer)
	s := &etcdServer{Endpoint: cu, DataDir: dir, done: make(chan struct{}), log: dir + ".log"}
	logf, err := os.Create(s.log)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s.cmd = exec.Command(bin,
		"--name", "bench", "--data-dir", dir,
		"--listen-client-urls", cu, "--advertise-client-urls", cu,
		"--listen-peer-urls", pu, "--initial-advertise-peer-urls", pu,
		"--initial-cluster", "bench="+pu, "--initial-cluster-state", "new",
		"--logger", "zap", "--log-level", "warn")
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	// Its own process group, as testenv's servers (pinGroup finds it);
	// killed with the bench.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		_ = logf.Close()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	_ = logf.Close()
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	if err := s.waitHealthy(ctx, 15*time.Second); err != nil {
		log := tailFile(s.log, 1500)
		s.Stop()
		return nil, fmt.Errorf("%w\netcd log:\n%s", err, log)
	}
	return s, nil
}

func (s *etcdServer) waitHealthy(ctx context.Context, limit time.Duration) error {
	hc := &http.Client{Timeout: 500 * time.Millisecond}
	deadline := time.Now().Add(limit)
	for {
		select {
		case <-s.done:
			return errors.New("etcd exited at start")
		default:
		}
		if resp, err := hc.Get(s.Endpoint + "/health"); err == nil {
			var b [64]byte
			n, _ := resp.Body.Read(b[:])
			_ = resp.Body.Close()
			if strings.Contains(string(b[:n]), `"true"`) {
				return s.readVersion(hc)
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("etcd on %s not healthy within %v", s.Endpoint, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *etcdServer) readVersion(hc *http.Client) error {
	resp, err := hc.Get(s.Endpoint + "/version")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var b [256]byte
	n, _ := resp.Body.Read(b[:])
	// {"etcdserver":"3.4.23","etcdcluster":"3.4.0"}
	if _, v, ok := strings.Cut(string(b[:n]), `"etcdserver":"`); ok {
		s.Version, _, _ = strings.Cut(v, `"`)
	}
	return nil
}

// PID is the server's process id.
func (s *etcdServer) PID() int { return s.cmd.Process.Pid }

// Stop kills the server and removes its data.
func (s *etcdServer) Stop() {
	if s == nil || s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
	_ = os.RemoveAll(s.DataDir)
	_ = os.Remove(s.log)
}

// metrics reads gauges and counters from etcd's /metrics (Prometheus text).
func (s *etcdServer) metrics(ctx context.Context, names ...string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.Endpoint+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || !want[name] {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
			out[name] = v
		}
	}
	return out, sc.Err()
}

// cpuSeconds is the server's CPU time (user+system, every thread), from
// /proc/<pid>/stat.
func (s *etcdServer) cpuSeconds() (float64, error) { return procCPU(s.PID()) }

// procCPU is a process's CPU time (user+system of all its threads), from
// /proc/<pid>/stat, in seconds (clock ticks of 10 ms).
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// Fields after the parenthesised command name: state is field 3, utime
	// and stime fields 14 and 15.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, errors.New("unreadable /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	sy, _ := strconv.ParseFloat(f[12], 64)
	return (u + sy) / 100, nil
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
