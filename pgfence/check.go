package pgfence

import (
	"fmt"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgtext"
)

// Length limits, checked before anything is sent. The resource is the
// fence table's primary key, and (resource, key) and (resource, run key)
// are the primary keys of the applied keys and of the runs: a btree entry
// must fit in a third of a page (2,704 bytes on 8 kB pages), so each part
// is capped at 1 KiB, which leaves room for both parts of a key and the
// tuple's overhead. fence caps lock names and holder ids at 512 bytes
// (fence.MaxNameLen), well within these.
const (
	// MaxResourceLen is the longest resource (lease name) pgfence
	// accepts, in bytes.
	MaxResourceLen = 1024
	// MaxHolderLen is the longest holder pgfence accepts, in bytes.
	MaxHolderLen = 1024
	// MaxKeyLen is the longest idempotency key (guard.WithKey) and run
	// key (Store.Run) pgfence accepts, in bytes.
	MaxKeyLen = 1024
	// MaxCursorLen is the longest cursor Run.Step accepts, in bytes (the
	// cursor is not indexed: a sanity bound, the same as sqlfence's).
	MaxCursorLen = 1 << 20
)

// checkClaim rejects what guard.NewClaim rejects, for callers that build a
// Claim by hand, strings Postgres cannot store as text, and strings longer
// than the limits above: all before any round trip, so bad input writes
// nothing, not even the fence row.
func checkClaim(c guard.Claim) error {
	switch {
	case c.Resource == "":
		return fmt.Errorf("%w: empty resource name", guard.ErrInvalidLease)
	case c.Token <= 0:
		return fmt.Errorf("%w: token must be > 0, got %d", guard.ErrInvalidLease, c.Token)
	case c.Holder == "":
		return fmt.Errorf("%w: empty holder", guard.ErrInvalidLease)
	}
	if err := checkLen("resource name", c.Resource, MaxResourceLen, guard.ErrInvalidLease); err != nil {
		return err
	}
	if err := checkLen("holder", c.Holder, MaxHolderLen, guard.ErrInvalidLease); err != nil {
		return err
	}
	if err := checkLen("idempotency key", c.Key, MaxKeyLen, guard.ErrInvalidOption); err != nil {
		return err
	}
	for _, f := range []struct{ what, s string }{{"resource", c.Resource}, {"holder", c.Holder}, {"idempotency key", c.Key}} {
		if err := checkText(f.what, f.s); err != nil {
			return err
		}
	}
	return nil
}

func checkLen(what, s string, max int, kind error) error {
	return pgtext.Len(what, s, max, ErrInvalidInput, kind)
}

func checkText(what, s string) error { return pgtext.Text(what, s, ErrInvalidInput) }
