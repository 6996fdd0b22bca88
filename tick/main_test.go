package tick_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/testenv"
	"github.com/fencelock/fencelock/tick"
	"github.com/fencelock/fencelock/tick/ticktest"
)

func TestMain(m *testing.M) {
	if ticktest.IsInstance() {
		os.Exit(ticktest.InstanceMain()) // a scheduler instance of TestTicksAcrossProcesses
	}
	testenv.Main(m)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// recorder is a RunObserver and MissObserver that keeps every event.
type recorder struct {
	mu     sync.Mutex
	runs   []tick.RunEvent
	missed []tick.MissedEvent
}

func (r *recorder) OnTickRun(_ context.Context, e tick.RunEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs = append(r.runs, e)
}

func (r *recorder) OnTickMissed(_ context.Context, e tick.MissedEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.missed = append(r.missed, e)
}

func (r *recorder) missedEvents() []tick.MissedEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]tick.MissedEvent(nil), r.missed...)
}

func (r *recorder) runEvents() []tick.RunEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]tick.RunEvent(nil), r.runs...)
}
