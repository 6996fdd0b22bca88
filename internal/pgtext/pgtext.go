// Package pgtext checks strings before pgfence or sqlfence sends them to
// Postgres, so that bad input is a clear error and nothing is written.
package pgtext

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Len rejects s longer than max bytes; the error matches invalid (the
// package's ErrInvalidInput) and kind.
func Len(what, s string, max int, invalid, kind error) error {
	if len(s) <= max {
		return nil
	}
	return fmt.Errorf("%w: %w: %s is %d bytes, at most %d are accepted (it is part of a btree key): use a shorter one, e.g. a hash of it", invalid, kind, what, len(s), max)
}

// Text rejects strings that Postgres text cannot hold; the error matches
// invalid.
func Text(what, s string, invalid error) error {
	if strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("%w: %s contains a NUL byte", invalid, what)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not valid UTF-8", invalid, what)
	}
	return nil
}
