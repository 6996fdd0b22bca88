package testenv

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// Ports.
//
// A server's port is reserved for the life of the test binary: no test
// binary on the machine is handed it again, and nothing else listens on it
// by chance. A server a test stopped or killed must refuse connections
// until the test ends (tests assert "connection refused", and a listener
// that took the port over, a cut proxy say, answers EOF instead), and a
// stale dial (a cluster node handshaking with a killed peer) must not reach
// a newer server.
//
// Two things make it so. Ports come from below the kernel's ephemeral
// range (net.ipv4.ip_local_port_range), where neither a listener on port 0
// (a proxy, an HTTP test server) nor an outgoing connection's source port
// lands. And each is locked (flock) in a directory every test binary on
// the machine shares, the lock held until the binary exits, so the go
// test binaries make test runs side by side never share one.

// portsDir is where the port locks live, shared by every test binary.
func portsDir() string { return filepath.Join(os.TempDir(), "fencelock-testenv-ports") }

var ports struct {
	once   sync.Once
	lo, hi int // the range ports are drawn from; 0, 0: the kernel's choice
	err    error

	mu   sync.Mutex
	held []*os.File // the locks, open until the binary exits
}

// portRange returns the ports below the kernel's ephemeral range (or, if
// there is no room there, above it) to draw from, or 0, 0 when there is
// no room either side.
func portRange() (lo, hi int) {
	low, high := 32768, 60999 // Linux's default
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			l, err1 := strconv.Atoi(f[0])
			h, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil && l <= h {
				low, high = l, h
			}
		}
	}
	const room = 2000
	switch {
	case low-1-10000 >= room:
		return max(10000, low-12000), low - 1
	case 65535-high >= room:
		return high + 1, 65535
	}
	return 0, 0
}

// reservePort returns a 127.0.0.1 TCP port nothing listens on, reserved for
// the life of the test binary (see Ports above).
func reservePort() (int, error) {
	ports.once.Do(func() {
		ports.lo, ports.hi = portRange()
		dir := portsDir()
		if ports.err = os.MkdirAll(dir, 0o777); ports.err == nil {
			// Every user's test binaries share the locks.
			_ = os.Chmod(dir, 0o777|os.ModeSticky)
		} else {
			ports.err = fmt.Errorf("testenv: the port lock directory: %w", ports.err)
		}
	})
	if ports.err != nil {
		return 0, ports.err
	}
	for range 1000 {
		port := 0
		if ports.lo != 0 {
			port = ports.lo + rand.IntN(ports.hi-ports.lo+1)
		} else {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return 0, fmt.Errorf("testenv: find a free port: %w", err)
			}
			port = l.Addr().(*net.TCPAddr).Port
			_ = l.Close()
		}
		lock, err := lockPort(port)
		if errors.Is(err, errPortTaken) {
			continue // another test binary's, or handed out here before
		}
		if err != nil {
			return 0, fmt.Errorf("testenv: lock port %d: %w; fix: make %s writable by every user who runs the tests (chmod 1777), or remove it", port, err, portsDir())
		}
		// Free now? (Something outside testenv may listen there.)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			_ = lock.Close()
			continue
		}
		_ = l.Close()
		ports.mu.Lock()
		ports.held = append(ports.held, lock)
		ports.mu.Unlock()
		return port, nil
	}
	if ports.lo != 0 {
		return 0, fmt.Errorf("testenv: find a free port: none of 1000 tries in %d-%d was free and unlocked (locks in %s)", ports.lo, ports.hi, portsDir())
	}
	return 0, fmt.Errorf("testenv: find a free port: every port the kernel offered was locked (locks in %s)", portsDir())
}

// errPortTaken: another open file holds the port's lock.
var errPortTaken = errors.New("taken")

// lockPort takes the port's lock without waiting. A lock this process
// holds is refused too: flock locks belong to the open file, not the
// process.
func lockPort(port int) (*os.File, error) {
	// Read-only: flock needs no write access, so a lock file another user
	// created serves as well.
	f, err := os.OpenFile(filepath.Join(portsDir(), strconv.Itoa(port)), os.O_RDONLY|os.O_CREATE, 0o666)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("port %d is %w", port, errPortTaken)
		}
		return nil, err
	}
	return f, nil
}

// RefusedAddr returns a 127.0.0.1 address on which nothing listens for the
// rest of the test binary: connections to it are refused (ECONNREFUSED),
// every time. (A port found by listening on port 0 and closing may be
// taken by any listener a moment later.)
func RefusedAddr(t testing.TB) string {
	t.Helper()
	port, err := reservePort()
	if err != nil {
		t.Fatalf("%v", err)
	}
	return "127.0.0.1:" + strconv.Itoa(port)
}

// ReservePort returns a free 127.0.0.1 TCP port reserved for the rest of
// the process, for a server a test (or the bench) starts itself: no other
// test binary is handed it, and no listener on port 0 takes it.
func ReservePort() (int, error) { return reservePort() }
