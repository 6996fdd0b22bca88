package gocrontick

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/go-co-op/gocron/v2"
)

// Elector is a gocron.Elector over fence's leader election: it campaigns
// in the background, and IsLeader answers nil while this instance holds a
// term, so that gocron runs jobs on the leader alone. A task fences its
// writes with the term ([Elector.Term]): a guard.Lease whose context ends
// with the term, so that a leader that was paused past its term is
// refused by the database.
//
// An Elector gives one scheduler at a time, not one run per tick: a
// leader that dies in the middle of a tick leaves it to nobody, and its
// successor may run a tick it had run. For a run per tick, add the jobs
// with a [Locker] (every instance may then run the scheduler).
type Elector struct {
	e      *fence.Election
	value  string
	cancel context.CancelFunc
	done   chan struct{}

	mu   sync.Mutex
	term *fence.Lock
	err  error // the last campaign's error, while not leading
}

var _ gocron.Elector = (*Elector)(nil)

// NewElector starts campaigning in e with value (the leader's value, e.g.
// the instance's address); Close stops it and resigns.
func NewElector(e *fence.Election, value string) (*Elector, error) {
	if e == nil {
		return nil, fmt.Errorf("%w: NewElector: nil *fence.Election: make one with fence.Client.Election", ErrInvalidInput)
	}
	if len(value) > fence.MaxValueLen {
		return nil, fmt.Errorf("%w: NewElector(%q): the value is %d bytes, at most fence.MaxValueLen (%d) are accepted", ErrInvalidInput, e.Name(), len(value), fence.MaxValueLen)
	}
	ctx, cancel := context.WithCancel(context.Background())
	el := &Elector{e: e, value: value, cancel: cancel, done: make(chan struct{})}
	go el.campaign(ctx)
	return el, nil
}

// campaign campaigns until ctx ends, holding each term until it ends.
func (el *Elector) campaign(ctx context.Context) {
	defer close(el.done)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		term, err := el.e.Campaign(ctx, el.value)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			el.set(nil, err)
			if errors.Is(err, fence.ErrClosed) || errors.Is(err, fence.ErrInvalidOption) || errors.Is(err, fence.ErrInvalidName) {
				return // for good: IsLeader says why
			}
			if !errors.Is(err, context.DeadlineExceeded) { // not a wait that ended: back off
				if sleep(ctx, backoff) != nil {
					return
				}
				backoff = min(2*backoff, 5*time.Second)
			}
			continue
		}
		backoff = 100 * time.Millisecond
		el.set(term, nil)
		select {
		case <-term.Done():
			el.set(nil, term.Err())
		case <-ctx.Done():
			el.set(nil, nil)
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = term.Release(rctx) // resign: the next candidate leads at once
			cancel()
			return
		}
	}
}

func (el *Elector) set(term *fence.Lock, err error) {
	el.mu.Lock()
	defer el.mu.Unlock()
	el.term, el.err = term, err
}

// Term is this instance's current term, nil when it does not lead. Fence
// the leader's writes with it (guard.Exec, a store's Run): its context
// ends when the term does.
func (el *Elector) Term() *fence.Lock {
	el.mu.Lock()
	defer el.mu.Unlock()
	if el.term == nil || el.term.Err() != nil {
		return nil
	}
	return el.term
}

// IsLeader implements gocron.Elector: nil while this instance holds a
// live term, else an error matching [ErrNotLeader] (with the last
// campaign's error, when it failed).
func (el *Elector) IsLeader(context.Context) error {
	if el.Term() != nil {
		return nil
	}
	el.mu.Lock()
	defer el.mu.Unlock()
	if el.err != nil {
		return fmt.Errorf("%w of %q: %w", ErrNotLeader, el.e.Name(), el.err)
	}
	return fmt.Errorf("%w of %q", ErrNotLeader, el.e.Name())
}

// Close stops campaigning and resigns a term this instance holds; ctx
// bounds the wait for the campaign to stop.
func (el *Elector) Close(ctx context.Context) error {
	el.cancel()
	select {
	case <-el.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
