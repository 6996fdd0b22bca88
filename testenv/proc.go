package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// process is a server process owned by testenv. It is killed with the test
// binary (Pdeathsig) so a crashed test leaves no server behind.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // exit status, valid after done is closed

	mu     sync.Mutex
	paused bool
}

func startProcess(cmd *exec.Cmd, cred *syscall.Credential) (*process, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *process) signal(sig syscall.Signal) error {
	if p.exited() {
		return errors.New("testenv: process has exited")
	}
	return p.cmd.Process.Signal(sig)
}

func (p *process) pause() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	p.paused = true
	return nil
}

func (p *process) resume() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.signal(syscall.SIGCONT); err != nil {
		return err
	}
	p.paused = false
	return nil
}

// stop sends sig (after SIGCONT, so a paused server can act on it), waits up
// to grace, then kills the process group.
func (p *process) stop(sig syscall.Signal, grace time.Duration) error {
	if p.exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	_ = p.cmd.Process.Kill()
	<-p.done
	return nil
}

// kill sends SIGKILL and waits for the process to exit.
func (p *process) kill() {
	if p.exited() {
		return
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	_ = p.cmd.Process.Kill()
	<-p.done
}

// ProcessAlive reports whether a process with this PID exists and is not a
// zombie. Tests use it to check that no server outlives its cleanup.
func ProcessAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// Field 3, after the parenthesised command name, is the state.
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == ')' {
			if i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X') {
				return false
			}
			return true
		}
	}
	return true
}

// unprivileged returns the credential to run a server as when the process is
// root (Postgres refuses to run as root), or nil otherwise.
func unprivileged() (*syscall.Credential, int, int, error) {
	if os.Geteuid() != 0 {
		return nil, -1, -1, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, 0, 0, fmt.Errorf("testenv: running as root and no 'postgres' user to run Postgres as: %w (install Debian package postgresql-15, or create the user)", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, uid, gid, nil
}

// tail returns the last n bytes of a log file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
