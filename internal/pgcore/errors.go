package pgcore

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/fencelock/fencelock/guard"
)

// Map turns a Postgres error in err's chain into guard's errors, the same
// whichever store and driver carried it: FL001 becomes a
// *guard.StaleTokenError (or an error wrapping guard.ErrStaleToken when the
// driver does not expose DETAIL), FL003 an error wrapping
// guard.ErrAlreadyApplied, FL002 guard.ErrNotClaimed, and so on. Errors of
// other kinds come back unchanged, and so does nil. Every message stays
// one line.
func Map(err error) error {
	e, ok := From(err)
	if !ok {
		return err
	}
	switch e.Code {
	case Stale:
		var d struct {
			Resource string `json:"resource"`
			Token    int64  `json:"token"`
			Current  int64  `json:"current"`
		}
		if e.Detail == "" || json.Unmarshal([]byte(e.Detail), &d) != nil {
			// Still a stale token; the figures are in the message.
			return fmt.Errorf("%w: %w", guard.ErrStaleToken, err)
		}
		return &guard.StaleTokenError{Resource: d.Resource, Token: d.Token, Current: d.Current}
	case Applied:
		var d struct {
			Resource string `json:"resource"`
			Key      string `json:"key"`
			Token    int64  `json:"token"`
		}
		if e.Detail == "" || json.Unmarshal([]byte(e.Detail), &d) != nil {
			return fmt.Errorf("%w: %w", guard.ErrAlreadyApplied, err)
		}
		return fmt.Errorf("%w: key %q of resource %q was applied by token %d; nothing was written", guard.ErrAlreadyApplied, d.Key, d.Resource, d.Token)
	case Finished:
		return wrap(guard.ErrRunFinished, err)
	case NotClaimed:
		return wrap(guard.ErrNotClaimed, err)
	case LockNotAvailable:
		return wrap(guard.ErrFenceBusy, err)
	case ReadOnly:
		return fmt.Errorf("%w (transaction_read_only is on): nothing was written: %w", guard.ErrReadOnly, err)
	case FeatureNotSupported:
		// A hot standby refuses BEGIN READ WRITE (lib/pq sends it) with
		// "cannot set transaction read-write mode during recovery".
		if strings.Contains(e.Message, "during recovery") {
			return fmt.Errorf("%w: the server is a hot standby: nothing was written: %w", guard.ErrReadOnly, err)
		}
	case InvalidParameter:
		if strings.HasPrefix(e.Message, "fencelock:") {
			return wrap(guard.ErrInvalidInput, err)
		}
	case InvalidSchema, UndefinedFunc, UndefinedTable:
		if strings.Contains(e.Message, "fencelock") {
			return &schemaError{msg: "guard: fencelock schema not installed: run migrations.Up(ctx, db), or: " + MigrateCommand + " (" + err.Error() + ")", kind: guard.ErrSchemaMissing, err: err}
		}
	}
	return err
}

// MigrateCommand installs the fencelock schema from a shell, anywhere Go
// is installed (the goose CLI's -dir needs a checkout of the migrations).
const MigrateCommand = `go run github.com/fencelock/fencelock/cmd/fencectl@latest migrate up --db "$DATABASE_URL"`

// wrap is "sentinel: err".
func wrap(sentinel, err error) error { return fmt.Errorf("%w: %w", sentinel, err) }
