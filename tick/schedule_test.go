package tick_test

import (
	"testing"
	"time"

	"github.com/fencelock/fencelock/tick"
	"github.com/stretchr/testify/assert"
)

func TestEveryIsAlignedToTheEpoch(t *testing.T) {
	e := tick.Every(5 * time.Minute)
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatalf("time zone data: %v (install the Debian package tzdata)", err)
	}
	at := time.Date(2026, 3, 29, 3, 7, 12, 0, paris) // 01:07:12 UTC, the night clocks spring forward
	assert.Equal(t, time.Date(2026, 3, 29, 1, 10, 0, 0, time.UTC), e.Next(at))
	assert.Equal(t, time.Date(2026, 3, 29, 1, 5, 0, 0, time.UTC), tick.Prev(e, at))
	on := time.Date(2026, 3, 29, 1, 5, 0, 0, time.UTC)
	assert.Equal(t, on, tick.Prev(e, on), "Prev of a tick is the tick")
	assert.Equal(t, on.Add(5*time.Minute), e.Next(on), "Next is strictly after")
	before := time.Date(1969, 12, 31, 23, 58, 0, 0, time.UTC)
	assert.Equal(t, time.Date(1969, 12, 31, 23, 55, 0, 0, time.UTC), tick.Prev(e, before), "floor before the epoch")
	assert.Equal(t, "2026-03-29T01:05:00Z", tick.Key(on.In(paris)), "a key is the instant in UTC")
}

// daily is a schedule without Every's shortcut: a tick every day at hh:mm
// UTC, for Prev's search.
type daily struct{ h, m int }

func (d daily) Next(t time.Time) time.Time {
	t = t.UTC()
	n := time.Date(t.Year(), t.Month(), t.Day(), d.h, d.m, 0, 0, time.UTC)
	if !n.After(t) {
		n = n.AddDate(0, 0, 1)
	}
	return n
}

func TestPrevSearchesAnySchedule(t *testing.T) {
	d := daily{3, 0}
	at := time.Date(2026, 5, 10, 2, 0, 0, 0, time.UTC)
	assert.Equal(t, time.Date(2026, 5, 9, 3, 0, 0, 0, time.UTC), tick.Prev(d, at))
	on := time.Date(2026, 5, 10, 3, 0, 0, 0, time.UTC)
	assert.Equal(t, on, tick.Prev(d, on))
	assert.True(t, tick.Prev(never{}, at).IsZero())
}

type never struct{}

func (never) Next(time.Time) time.Time { return time.Time{} }
