package sqlfence

import (
	"context"

	"github.com/fencelock/fencelock/guard"
)

// Advance claims the fence for lease right away, in its own transaction.
// Call it just after acquiring the lock: from then on a previous holder
// that is paused (GC, SIGSTOP, partition) is rejected even if it writes
// before this holder's first write. It returns a *guard.StaleTokenError if
// the database has already seen a newer token, guard.ErrReadOnly on a read-only
// database. ctx bounds the call, including a wait for the fence row held
// by an open transaction.
func (s *Store) Advance(ctx context.Context, lease guard.Lease) error {
	c, err := guard.NewClaim(lease)
	if err != nil {
		return err
	}
	if err := checkClaim(c); err != nil {
		return err
	}
	if _, err = s.db.ExecContext(ctx, "SELECT fencelock.claim($1, $2, $3)", c.Resource, c.Token, c.Holder); err != nil {
		return mapError(err)
	}
	s.adv.Add(c.Resource, c.Token, c.Holder)
	return nil
}
