package testenv_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/testenv"
)

// envLockPort makes the test binary a child that tries to lock a port
// (portLocker) instead of running the tests.
const envLockPort = "TESTENV_TEST_LOCK_PORT"

// portLocker tries the port in envLockPort and says how it went.
func portLocker() {
	port, err := strconv.Atoi(os.Getenv(envLockPort))
	if err != nil {
		fmt.Println("bad port:", err)
		return
	}
	if f, err := testenv.LockPort(port); err != nil {
		fmt.Println("refused:", err)
	} else {
		_ = f.Close()
		fmt.Println("locked")
	}
}

// ephemeralRange is the kernel's range for port 0 listeners and outgoing
// connections' source ports.
func ephemeralRange(t *testing.T) (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	require.NoError(t, err)
	f := strings.Fields(string(b))
	require.Len(t, f, 2)
	lo, err = strconv.Atoi(f[0])
	require.NoError(t, err)
	hi, err = strconv.Atoi(f[1])
	require.NoError(t, err)
	return lo, hi
}

// A server's port, and RefusedAddr's, stay refused for the rest of the
// test binary: they lie outside the kernel's ephemeral range (no port 0
// listener, such as a cut proxy answering EOF, can land there), a dial is
// refused after the server stopped, and another process (another package's
// test binary) cannot lock them while this one runs, though it can lock a
// port no one holds.
func TestReservedPortsStayRefused(t *testing.T) {
	lo, hi := ephemeralRange(t)
	r := testenv.NewRedisServer(t)
	stopped := r.Addr
	require.NoError(t, r.Stop())
	addrs := []string{stopped, testenv.RefusedAddr(t)}
	for _, addr := range addrs {
		_, p, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		port, err := strconv.Atoi(p)
		require.NoError(t, err)
		assert.False(t, port >= lo && port <= hi, "%s lies in the kernel's ephemeral range %d-%d, where a port 0 listener may take it: "+
			"testenv draws from 2000 or more ports between 10000 and 65535 outside net.ipv4.ip_local_port_range, and this machine's range leaves fewer", addr, lo, hi)

		_, err = net.DialTimeout("tcp", addr, 5*time.Second)
		assert.ErrorIs(t, err, syscall.ECONNREFUSED, addr)

		child := testenv.StartChild(t, "port locker", envLockPort+"="+p)
		assert.Contains(t, child.Expect("refused:", 30*time.Second), "is taken", addr)
	}

	// The control: a lock no one holds is the child's to take. It is the
	// lock of a number no port has and no other process would try (this
	// process' id above the port range), so no test binary running beside
	// this one can take it first.
	nobodys := strconv.Itoa(100000 + os.Getpid())
	t.Cleanup(func() { _ = os.Remove(filepath.Join(testenv.PortsDir(), nobodys)) }) // after the child's end
	child := testenv.StartChild(t, "port locker", envLockPort+"="+nobodys)
	child.Expect("locked", 30*time.Second)
}
