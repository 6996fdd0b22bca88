package pgstore_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/pgstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type execObserver struct{}

func (execObserver) OnExec(context.Context, guard.ExecEvent) {}

// The options come to Settings in order, each adding its observer; bad
// ones are an error that matches guard.ErrInvalidOption and names the
// option and the value given.
func TestApply(t *testing.T) {
	var logs strings.Builder
	s, err := pgstore.Apply(
		pgstore.WithLockTimeout(250*time.Millisecond),
		pgstore.WithIdleTimeout(time.Minute),
		pgstore.WithObserver(execObserver{}),
		pgstore.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		pgstore.WithoutPreparedStatements(),
	)
	require.NoError(t, err)
	assert.Equal(t, 250*time.Millisecond, s.LockTimeout)
	assert.Equal(t, time.Minute, s.IdleTimeout)
	assert.True(t, s.Unprepared)
	require.Len(t, s.Observers, 2)
	assert.Equal(t, execObserver{}, s.Observers[0], "in the order given")

	none, err := pgstore.Apply()
	require.NoError(t, err)
	assert.Equal(t, pgstore.Settings{}, none, "no option leaves the servers' settings")

	for _, c := range []struct {
		opt  pgstore.Option
		says string
	}{
		{nil, "nil Option"},
		{pgstore.WithLockTimeout(0), "WithLockTimeout(0s): must be at least 1ms"},
		{pgstore.WithIdleTimeout(time.Microsecond), "WithIdleTimeout(1µs): must be at least 1ms"},
		{pgstore.WithObserver(nil), "WithObserver(nil)"},
		{pgstore.WithObserver("not an observer"), "WithObserver(string): it implements none of guard's observer interfaces"},
		{pgstore.WithLogger(nil), "WithLogger(nil)"},
	} {
		_, err := pgstore.Apply(pgstore.WithLockTimeout(time.Second), c.opt)
		require.ErrorIs(t, err, guard.ErrInvalidOption, c.says)
		assert.Contains(t, err.Error(), c.says)
	}
}

// Settings made by one Apply do not share their observers with another's
// (each option appends to its own copy).
func TestApplyDoesNotShareObservers(t *testing.T) {
	base := []pgstore.Option{pgstore.WithObserver(execObserver{}), pgstore.WithObserver(execObserver{})}
	a, err := pgstore.Apply(append(base, pgstore.WithLogger(slog.Default()))...)
	require.NoError(t, err)
	b, err := pgstore.Apply(base...)
	require.NoError(t, err)
	assert.Len(t, a.Observers, 3)
	assert.Len(t, b.Observers, 2)
}
