package testenv

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Child is a process of the running test binary that plays a part in a
// test: a lock holder or a leader that the test kills or pauses, which a
// goroutine cannot stand in for (a SIGKILL ends a whole process, a SIGSTOP
// freezes all of it). The test binary's TestMain recognises the part by
// the environment [StartChild] gives it, plays it and exits, instead of
// running the tests:
//
//	func TestMain(m *testing.M) {
//		if os.Getenv("MYPKG_TEST_LEADER") != "" {
//			leaderProcess() // prints lines the test reads with Expect
//			return
//		}
//		testenv.Main(m)
//	}
//
// The child talks to the test in lines: it prints on stdout what the test
// waits for ([Child.Expect]) and reads the test's orders on stdin
// ([Child.Send]). Its stderr goes to the test binary's.
type Child struct {
	t     testing.TB
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	done  chan struct{}
}

// StartChild starts the test binary with env (KEY=VALUE) added to its
// environment and -test.run=^$, so that a TestMain that does not take the
// part runs no test. name names it in failures. The child is killed when
// the test ends, and with the test binary.
func StartChild(t testing.TB, name string, env ...string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatalf("testenv: child %s: %v", name, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("testenv: child %s: %v", name, err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start child %s: %v", name, err)
	}
	c := &Child{t: t, name: name, cmd: cmd, stdin: stdin, lines: make(chan string, 64), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		_ = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(c.Kill)
	return c
}

// PID is the child's process id.
func (c *Child) PID() int { return c.cmd.Process.Pid }

// Expect waits up to within for the child's next line, which must be word
// or start with word and a space, and returns the rest. A child that
// exits, says something else or stays silent fails the test.
func (c *Child) Expect(word string, within time.Duration) string {
	c.t.Helper()
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case l, ok := <-c.lines:
		if !ok {
			<-c.done
			c.t.Fatalf("testenv: child %s exited (%v) while the test waited for %q", c.name, c.cmd.ProcessState, word)
		}
		if l == word {
			return ""
		}
		if rest, ok := strings.CutPrefix(l, word+" "); ok {
			return rest
		}
		c.t.Fatalf("testenv: child %s said %q, the test waited for %q", c.name, l, word)
	case <-t.C:
		c.t.Fatalf("testenv: child %s said nothing for %v, the test waited for %q", c.name, within, word)
	}
	return ""
}

// Send writes line to the child's stdin.
func (c *Child) Send(line string) {
	c.t.Helper()
	if _, err := fmt.Fprintln(c.stdin, line); err != nil {
		c.t.Fatalf("testenv: child %s: send %q: %v", c.name, line, err)
	}
}

// Pause stops the child with SIGSTOP: it cannot run, renew or answer
// until [Child.Resume].
func (c *Child) Pause() {
	c.t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		c.t.Fatalf("testenv: child %s: SIGSTOP: %v", c.name, err)
	}
}

// Resume continues a paused child (SIGCONT).
func (c *Child) Resume() {
	c.t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		c.t.Fatalf("testenv: child %s: SIGCONT: %v", c.name, err)
	}
}

// Kill kills the child with SIGKILL (a crash: nothing of it runs after)
// and waits until it has exited. Killing a child that exited does nothing.
func (c *Child) Kill() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Kill()
	_ = c.stdin.Close()
	for range c.lines { // until its stdout closes
	}
	<-c.done
}
