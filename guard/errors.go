package guard

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fencelock/fencelock/internal/oneline"
)

var (
	// ErrStaleToken is returned by Exec (as a *StaleTokenError when the
	// store reports the current token, as pgfence does) when
	// the store has already seen a higher token for the resource, or the
	// same token from another holder: another holder took over, and nothing
	// of this transaction is committed. Do not retry with the same token.
	ErrStaleToken = errors.New("guard: stale fencing token")

	// ErrAlreadyApplied is returned by Exec with WithKey when the key was
	// applied before for the resource (by this or an earlier holder):
	// nothing of this transaction is committed.
	ErrAlreadyApplied = errors.New("guard: idempotency key already applied")

	// ErrLeaseLost is matched (errors.Is) by the error of Exec whenever the
	// lease was lost before the transaction started, while fn ran, or while
	// the commit was refused; the error is then a *LeaseLostError that also
	// matches the lease's own cause (for a *fence.Lock, fence.ErrLockLost,
	// fence.ErrMaxHold, ...). Nothing was committed, except when the error
	// also matches ErrUnknownOutcome or ErrTxEnded.
	ErrLeaseLost = errors.New("guard: lease lost")

	// ErrTxOwned is returned by Commit and Rollback of the transaction fn
	// receives: Exec owns the transaction, and the call leaves it
	// untouched. Return nil from fn to commit (with the fence check), an
	// error to roll back. Savepoints (tx.Begin) commit and roll back as
	// usual.
	ErrTxOwned = errors.New("guard: the transaction belongs to guard.Exec: return nil from fn to commit it, an error to roll it back")

	// ErrTxEnded is matched by the error of Exec when the transaction was
	// no longer open after fn: fn ended it behind Exec's back (a raw
	// COMMIT or ROLLBACK sent through Exec, a closed connection). Its
	// writes may have committed without the fence check: check the data.
	ErrTxEnded = errors.New("guard: the transaction was ended inside fn (a raw COMMIT or ROLLBACK): its writes may have committed without the fence check")

	// ErrUnknownOutcome is matched by the error of Exec when the
	// connection was lost, or ctx ended, while the commit was in flight:
	// the transaction may or may not have committed. With WithKey a retry
	// tells (ErrAlreadyApplied if it did).
	ErrUnknownOutcome = errors.New("guard: commit outcome unknown: the connection was lost while the commit was in flight; it may have committed (retry WithKey to find out)")

	// ErrInvalidLease is returned by Exec for a nil lease, an empty name,
	// a token <= 0 or an empty holder; nothing is written.
	ErrInvalidLease = errors.New("guard: invalid lease")

	// ErrInvalidOption is returned by Exec for a bad option (such as an
	// empty idempotency key), and by the stores' New for a bad option;
	// nothing is written.
	ErrInvalidOption = errors.New("guard: invalid option")

	// ErrInvalidInput is returned by the stores for input they cannot
	// store or that makes no sense: an empty run key, a string with a NUL
	// byte or invalid UTF-8, a string over its length limit
	// ([MaxResourceLen] and the others), a negative Prune age. Nothing is
	// written.
	ErrInvalidInput = errors.New("guard: invalid input")

	// ErrReadOnly is returned by Exec, the stores' Advance, Prune and
	// Run's methods when the database refuses writes: a read-only default
	// (default_transaction_read_only, for the database, the role or the
	// session) or a hot standby; the message names which. fn did not run
	// and nothing was written; no store overrides the setting.
	ErrReadOnly = errors.New("guard: the database is read-only")

	// ErrRunFinished is returned by a store's Run.Step when the run was
	// finished (by this or an earlier holder): fn did not run, nothing was
	// written. It matches ErrAlreadyApplied too (a finished run is a key
	// applied for good).
	ErrRunFinished error = &kindError{msg: "guard: run already finished, nothing was written", kind: ErrAlreadyApplied}

	// ErrSchemaMissing is matched by the error of every store call when
	// the store's schema (its tables and functions) is not installed in
	// the database: fn did not run and nothing was written. A store's
	// message names the database and the command that installs it.
	ErrSchemaMissing = errors.New("guard: the store's schema is not installed")

	// ErrSchemaOutdated is matched by the error of every store call when
	// the store's schema is installed but older than the store needs
	// (migrations added since have not run): fn did not run and nothing
	// was written. A store's message names both versions and the command
	// that migrates the database. It matches ErrSchemaMissing too: what
	// the store needs of the schema is missing, and the fix is the same.
	ErrSchemaOutdated error = &kindError{msg: "guard: the store's schema is out of date", kind: ErrSchemaMissing}

	// ErrPermission is matched by the error of a store call, a relay or
	// an outbox call when the database refused the role a privilege on
	// the store's schema: nothing was written. A store's message names
	// the role, what it lacks on which object, and the grant that fixes
	// it, run by whom and where; the error also matches the driver's.
	ErrPermission = errors.New("guard: permission denied on the store's schema")

	// ErrNotClaimed is returned when a store refuses a write made outside
	// a guarded transaction to data it fences for a resource (with the
	// Postgres stores, a table protected by pgfence's Protect): the writing
	// transaction neither checked nor claimed the resource's fence, and
	// nothing was written. Write through Exec, or claim as the store's
	// documentation says.
	ErrNotClaimed = errors.New("guard: write to a protected table without a fence claim")

	// ErrFenceBusy is returned (with a store's lock timeout) when the
	// resource's fence stayed held by another open transaction longer
	// than the timeout: typically a previous holder paused after writing
	// to data the store protects (a guarded transaction otherwise holds
	// the fence only while it commits). Nothing was written; retry once
	// the other transaction ends.
	ErrFenceBusy = errors.New("guard: the resource's fence lock is held by another transaction beyond the lock timeout")

	// ErrNilDB is returned by the stores' New for a nil database handle.
	ErrNilDB = errors.New("guard: nil DB")

	// ErrNilStore is returned by Exec for a nil store.
	ErrNilStore = errors.New("guard: nil store: pass a store such as *pgfence.Store")

	// ErrNilFunc is returned by Exec for a nil fn.
	ErrNilFunc = errors.New("guard: nil fn: pass the function that does the writes")
)

// StaleTokenError is the error of a rejected claim: Token was presented for
// Resource, but the store had already seen Current (higher, or equal from
// another holder). errors.Is(err, ErrStaleToken) holds.
type StaleTokenError struct {
	Resource string
	Token    int64
	Current  int64
}

func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("guard: stale fencing token %d for resource %q: the store has seen token %d; another holder took over, nothing was written", e.Token, e.Resource, e.Current)
}

// Unwrap returns ErrStaleToken.
func (e *StaleTokenError) Unwrap() error { return ErrStaleToken }

// LeaseLostError is the error of Exec when the lease was lost. Cause is
// the lease's own reason (its Err(), the cause of its context: for a
// *fence.Lock fence.ErrLockLost, fence.ErrMaxHold, ...; nil when the
// lease gives none). Err is what the loss ended, or the store's answer to
// the commit (nil when nothing had started). errors.Is matches
// ErrLeaseLost, Cause and Err.
type LeaseLostError struct {
	Cause error
	Err   error
}

func (e *LeaseLostError) Error() string {
	var b strings.Builder
	b.WriteString(ErrLeaseLost.Error())
	var cause string
	if e.Cause != nil {
		cause = oneline.Fold(e.Cause.Error())
		b.WriteString(" (")
		b.WriteString(cause)
		b.WriteString(")")
	}
	if e.Err != nil {
		// What the loss ended often says the cause again (a store's
		// "begin: <the context's cause>"): it is named once, above.
		if msg := withoutCause(oneline.Fold(e.Err.Error()), cause); msg != "" {
			b.WriteString("; ")
			b.WriteString(msg)
		}
	}
	return b.String()
}

// withoutCause is msg without the text of cause (and the ": " before it).
func withoutCause(msg, cause string) string {
	if cause == "" {
		return msg
	}
	i := strings.Index(msg, cause)
	if i < 0 {
		return msg
	}
	return strings.TrimSuffix(strings.TrimSpace(msg[:i]), ":") + msg[i+len(cause):]
}

// Unwrap returns ErrLeaseLost, Cause and Err (those that are set).
func (e *LeaseLostError) Unwrap() []error {
	errs := []error{ErrLeaseLost}
	if e.Cause != nil {
		errs = append(errs, e.Cause)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// kindError is a sentinel that is also a kind of another one (errors.Is
// matches both) without repeating the other's text in its message.
type kindError struct {
	msg  string
	kind error
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// Length limits every store accepts, checked before anything is sent (the
// Postgres stores' reasons: package pgstore). fence caps lock names and
// holder ids at 512 bytes (fence.MaxNameLen), well within these. A longer
// string is an error matching ErrInvalidInput and, for the lease's parts,
// ErrInvalidLease (for the key, ErrInvalidOption).
const (
	// MaxResourceLen is the longest resource (lease name), in bytes.
	MaxResourceLen = 1024
	// MaxHolderLen is the longest holder, in bytes.
	MaxHolderLen = 1024
	// MaxKeyLen is the longest idempotency key (WithKey) and run key, in
	// bytes.
	MaxKeyLen = 1024
	// MaxCursorLen is the longest cursor of a run's step, in bytes (the
	// cursor is not indexed: a sanity bound).
	MaxCursorLen = 1 << 20
)

// interrupted words an error of Exec that ended because ctx ended or the
// database connection was lost before the commit was sent (fn's statement
// cut, the server shut down): a bare "context deadline exceeded" or a
// server's "FATAL: terminating connection" says neither that nothing was
// committed nor that a retry is safe. An unknown outcome, a transaction
// ended inside fn and a lost lease say what they mean already.
func interrupted(err error, key string) error {
	if err == nil || errors.Is(err, ErrUnknownOutcome) || errors.Is(err, ErrTxEnded) || errors.Is(err, ErrLeaseLost) {
		return err
	}
	if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !connectionLost(err) {
		return err
	}
	what := "interrupted, nothing was committed"
	if strings.Contains(err.Error(), "nothing was committed") {
		what = "interrupted"
	}
	retry := "retrying is safe"
	if key != "" {
		retry = fmt.Sprintf("retrying with the same key (%q) is safe", key)
	}
	return &wrapped{msg: "guard: " + what + "; " + retry + ": " + err.Error(), err: err}
}

// connectionLost reports whether err is a connection the server ended
// (SQLSTATE classes 57P, an operator's or a crash's shutdown, and 08). A
// connection that could not be made is the stores' own message, which
// names the address to check.
func connectionLost(err error) bool {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		c := s.SQLState()
		return strings.HasPrefix(c, "57P") || strings.HasPrefix(c, "08")
	}
	return false
}

// wrapped is err under a message of its own, which names err's cause.
type wrapped struct {
	msg string
	err error
}

func (e *wrapped) Error() string { return e.msg }
func (e *wrapped) Unwrap() error { return e.err }
