// Package outboxtest runs outbox relays for tests and fault trials: in the
// test's process ([StartRelay]), or as processes of their own that a test
// can SIGKILL ([RelayProcess], [StartProcess]). The outbox's tests, otel's
// and the chaos suite's relay trials use it. It also writes a large
// backlog ([LoadBacklog]) and reads back the plans Postgres ran, with the
// rows they read ([Plans]), for the tests that pin that the outbox's
// statements stay bounded (the outbox's and fencectl's).
//
// A binary that starts relay processes runs [RelayMain] first thing when
// [IsRelayProcess] reports true, as a test binary's TestMain does:
//
//	func TestMain(m *testing.M) {
//		if outboxtest.IsRelayProcess() {
//			os.Exit(outboxtest.RelayMain())
//		}
//		os.Exit(m.Run())
//	}
package outboxtest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock/outbox"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Quiet is a logger that drops everything: the relays' default here.
var Quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// StartRelay runs a relay on db with sender and opts (after a default of
// WithLogger(Quiet)) until the test ends, then stops it and fails the
// test if Run returned an error or did not return within a minute.
func StartRelay(t testing.TB, db outbox.DB, sender outbox.Sender, opts ...outbox.RelayOption) *outbox.Relay {
	t.Helper()
	r, err := outbox.NewRelay(db, sender, append([]outbox.RelayOption{outbox.WithLogger(Quiet)}, opts...)...)
	if err != nil {
		t.Fatalf("outboxtest: NewRelay: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("outboxtest: Relay.Run: %v", err)
			}
		case <-time.After(time.Minute):
			t.Errorf("outboxtest: Relay.Run did not return within a minute of its context ending")
		}
	})
	return r
}

// RelayEnv is the environment variable that makes a process a relay
// process: it holds the process's RelayConfig as JSON.
const RelayEnv = "FENCELOCK_OUTBOX_RELAY"

// RelayConfig configures a relay process.
type RelayConfig struct {
	// URL is the database's.
	URL string `json:"url"`
	// Batch is the relay's claim batch and its concurrency.
	Batch int `json:"batch"`
	// Visibility is the relay's visibility timeout.
	Visibility time.Duration `json:"visibility"`
	// SendTimeout is its send timeout; 0 means a quarter of Visibility.
	SendTimeout time.Duration `json:"send_timeout"`
	// Poll is its poll interval.
	Poll time.Duration `json:"poll"`
}

// Options are the relay options of c, with a backoff of twice the
// visibility timeout after a failed attempt: a send that times out on a
// loaded machine is retried only after that, so that every repeat of an
// effect, whether its relay was killed or its send timed out, comes at
// least the visibility timeout less the send timeout after the first send,
// which is what the kill trials check.
func (c RelayConfig) Options() []outbox.RelayOption {
	send := c.SendTimeout
	if send == 0 {
		send = c.Visibility / 4
	}
	return []outbox.RelayOption{outbox.WithBatchSize(c.Batch), outbox.WithConcurrency(c.Batch),
		outbox.WithVisibilityTimeout(c.Visibility), outbox.WithSendTimeout(send), outbox.WithPollInterval(c.Poll),
		outbox.WithBackoff(2*c.Visibility, 2*c.Visibility), outbox.WithLogger(Quiet)}
}

// IsRelayProcess reports whether this process was started as a relay
// process (RelayEnv is set).
func IsRelayProcess() bool { return os.Getenv(RelayEnv) != "" }

// RelayMain runs the relay that RelayEnv configures, with an HTTPSender,
// until its stdin closes (or it is killed), and returns the process's
// exit code: 0 after a clean stop, 1 when the relay failed, 2 for a bad
// RelayEnv.
func RelayMain() int {
	var cfg RelayConfig
	if err := json.Unmarshal([]byte(os.Getenv(RelayEnv)), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "outboxtest: relay process: bad %s: %v\n", RelayEnv, err)
		return 2
	}
	ctx, stop := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	pool, err := pgxpool.New(ctx, cfg.URL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "outboxtest: relay process:", err)
		return 1
	}
	defer pool.Close()
	r, err := outbox.NewRelay(pool, &outbox.HTTPSender{}, cfg.Options()...)
	if err == nil {
		err = r.Run(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "outboxtest: relay process:", err)
		return 1
	}
	return 0
}

// Process is a relay process.
type Process struct {
	cmd   *exec.Cmd
	stdin io.Closer
}

// StartProcess starts cmd as a relay process configured by cfg: cmd runs
// a binary whose main calls RelayMain when IsRelayProcess (the running
// binary, re-executed). The process dies with its parent (Pdeathsig);
// its stderr is the parent's.
func StartProcess(cmd *exec.Cmd, cfg RelayConfig) (*Process, error) {
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cmd.Env = append(os.Environ(), RelayEnv+"="+string(b))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("outboxtest: start relay process: %w", err)
	}
	return &Process{cmd: cmd, stdin: stdin}, nil
}

// RelayProcess starts the running test binary again as a relay process
// configured by cfg (its TestMain must call RelayMain, see the package
// documentation), stopped when the test ends.
func RelayProcess(t testing.TB, cfg RelayConfig) *Process {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("outboxtest: %v", err)
	}
	p, err := StartProcess(exec.Command(exe, "-test.run=^$"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// Kill SIGKILLs the relay and waits for it: whatever it claimed stays
// claimed until the visibility timeout passes.
func (p *Process) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
}

// Stop ends the relay gracefully (it finishes its sends and records their
// outcomes), or kills it after 30 s. Stopping a relay already stopped or
// killed does nothing.
func (p *Process) Stop() {
	_ = p.stdin.Close()
	done := make(chan struct{})
	go func() {
		_ = p.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}
