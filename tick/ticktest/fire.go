package ticktest

import (
	"context"
	"sync"
	"time"

	"github.com/fencelock/fencelock/tick"
)

// Fire calls fire for every tick of s, as it falls on clock (a clock that
// is off is how a test offsets an instance), each call in a goroutine of
// its own as gocron and robfig's cron run a job's firings: a call that
// waits does not hold up the next tick's. It returns when ctx ends and
// every call has returned.
func Fire(ctx context.Context, s tick.Schedule, clock func() time.Time, fire func(ctx context.Context, at time.Time)) {
	FireFrom(ctx, s, clock, time.Time{}, fire)
}

// FireFrom is Fire from the tick first on (the next tick when zero): a
// first tick already past is fired at once, late, as by a scheduler that
// started late.
func FireFrom(ctx context.Context, s tick.Schedule, clock func() time.Time, first time.Time, fire func(ctx context.Context, at time.Time)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	next := first
	if next.IsZero() {
		next = s.Next(clock())
	}
	for {
		timer := time.NewTimer(next.Sub(clock()))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		if clock().Before(next) {
			continue // woke early by this clock (it was stepped): wait again
		}
		at := next
		wg.Go(func() { fire(ctx, at) })
		next = s.Next(next)
	}
}
