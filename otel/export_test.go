package fencelockotel

import "time"

// WithClock makes the backlog gauge read its interval on now instead of
// time.Now, so that a test decides when a reading is due.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) error {
		c.now = now
		return nil
	})
}
