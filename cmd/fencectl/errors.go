package main

import (
	"context"
	"errors"
	"fmt"
	"net"
)

// usageError is a mistake in the command line: exit 2 and a pointer to help.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, a ...any) error {
	return &usageError{msg: fmt.Sprintf(format, a...)}
}

// errFailed is returned by doctor after printing a failing check: the output
// already says everything, so run prints nothing more.
var errFailed = errors.New("failed")

// errAborted is returned when the operator declines a confirmation.
var errAborted = errors.New("aborted: nothing was changed")

// unreachableError is the one line printed for a server that does not answer.
type unreachableError struct {
	what, addr string
	err        error
}

func (e *unreachableError) Error() string {
	msg := e.err.Error()
	var ne net.Error
	if errors.Is(e.err, context.DeadlineExceeded) || (errors.As(e.err, &ne) && ne.Timeout()) {
		msg = "no answer within the timeout (--timeout)"
	}
	return fmt.Sprintf("%s at %s is not reachable: %s", e.what, e.addr, msg)
}

func (e *unreachableError) Unwrap() error { return e.err }

// errSchemaMissing says how to install the schema, with the goose CLI's
// -table too (without it goose records the versions in the application's
// own table).
var errSchemaMissing = errors.New("the fencelock schema is not installed in this database: run 'fencectl migrate up'" +
	" (with the goose CLI: goose -dir migrations -table fencelock_db_version postgres \"$DATABASE_URL\" up)")
