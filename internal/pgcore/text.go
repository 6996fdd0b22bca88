package pgcore

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/fencelock/fencelock/guard"
)

// CheckLen rejects s longer than max bytes; the error matches
// guard.ErrInvalidInput and kind.
func CheckLen(what, s string, max int, kind error) error {
	if len(s) <= max {
		return nil
	}
	return &inputError{kind: kind, msg: fmt.Sprintf("%s is %d bytes, at most %d are accepted (it is part of a btree key): use a shorter one, e.g. a hash of it", what, len(s), max)}
}

// inputError is bad input of a kind (guard.ErrInvalidLease,
// guard.ErrInvalidOption, ...) that also matches guard.ErrInvalidInput,
// with one prefix: its kind's.
type inputError struct {
	kind error
	msg  string
}

func (e *inputError) Error() string { return e.kind.Error() + ": " + e.msg }

func (e *inputError) Unwrap() []error {
	if e.kind == guard.ErrInvalidInput {
		return []error{e.kind}
	}
	return []error{e.kind, guard.ErrInvalidInput}
}

// CheckText rejects strings that Postgres text cannot hold; the error
// matches guard.ErrInvalidInput.
func CheckText(what, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("%w: %s contains a NUL byte", guard.ErrInvalidInput, what)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not valid UTF-8", guard.ErrInvalidInput, what)
	}
	return nil
}

// CheckClaim rejects what guard.NewClaim rejects, for callers that build a
// Claim by hand, strings Postgres cannot store as text, and strings longer
// than guard's limits: all before any round trip, so bad input writes
// nothing, not even the fence row.
func CheckClaim(c guard.Claim) error {
	switch {
	case c.Resource == "":
		return fmt.Errorf("%w: empty resource name", guard.ErrInvalidLease)
	case c.Token <= 0:
		return fmt.Errorf("%w: token must be > 0, got %d", guard.ErrInvalidLease, c.Token)
	case c.Holder == "":
		return fmt.Errorf("%w: empty holder", guard.ErrInvalidLease)
	}
	for _, f := range []struct {
		what string
		s    string
		max  int
		kind error
	}{
		{"resource name", c.Resource, guard.MaxResourceLen, guard.ErrInvalidLease},
		{"holder", c.Holder, guard.MaxHolderLen, guard.ErrInvalidLease},
		{"idempotency key", c.Key, guard.MaxKeyLen, guard.ErrInvalidOption},
	} {
		if err := CheckLen(f.what, f.s, f.max, f.kind); err != nil {
			return err
		}
		if err := CheckText(f.what, f.s); err != nil {
			return err
		}
	}
	return nil
}

// CheckRunKey rejects an empty, oversized or untextual run key.
func CheckRunKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty run key: name the batch, e.g. \"stock-sync-2026-11-30\"", guard.ErrInvalidInput)
	}
	if err := CheckLen("run key", key, guard.MaxKeyLen, guard.ErrInvalidInput); err != nil {
		return err
	}
	return CheckText("run key", key)
}

// CheckCursor rejects an oversized or untextual cursor.
func CheckCursor(cursor string) error {
	if len(cursor) > guard.MaxCursorLen {
		return fmt.Errorf("%w: cursor is %d bytes, at most %d are accepted: keep a position in it (a chunk number, the last id), not the data", guard.ErrInvalidInput, len(cursor), guard.MaxCursorLen)
	}
	return CheckText("cursor", cursor)
}
