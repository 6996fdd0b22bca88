package sqlstate

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/fencelock/fencelock/guard"
)

// Mapper maps the fencelock SQLSTATEs to the errors of guard and to the
// sentinels of one store package, given here. A nil sentinel leaves its
// code unmapped.
type Mapper struct {
	// SchemaMissing: the fencelock schema, a function or a table of it is
	// missing (3F000, 42883, 42P01 naming fencelock).
	SchemaMissing error
	// NotClaimed: FL002.
	NotClaimed error
	// RunFinished: FL004; it should wrap guard.ErrAlreadyApplied.
	RunFinished error
	// FenceBusy: 55P03, a lock wait past lock_timeout.
	FenceBusy error
	// InvalidInput: 22023 raised by a fencelock function.
	InvalidInput error
	// ReadOnly: 25006, a write in a read-only transaction (a read-only
	// database, default_transaction_read_only, a hot standby).
	ReadOnly error
}

// Map turns a Postgres error in err's chain into the errors of guard and
// of the store: FL001 becomes a *guard.StaleTokenError (or an error
// wrapping guard.ErrStaleToken when the driver does not expose DETAIL),
// FL003 an error wrapping guard.ErrAlreadyApplied, and so on. Errors of
// other kinds come back unchanged, and so does nil. Every message stays
// one line.
func (m *Mapper) Map(err error) error {
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
		return wrap(m.RunFinished, err)
	case NotClaimed:
		return wrap(m.NotClaimed, err)
	case LockNotAvailable:
		return wrap(m.FenceBusy, err)
	case ReadOnly:
		if m.ReadOnly != nil {
			return fmt.Errorf("%w (transaction_read_only is on): nothing was written: %w", m.ReadOnly, err)
		}
	case FeatureNotSupported:
		// A hot standby refuses BEGIN READ WRITE (lib/pq sends it) with
		// "cannot set transaction read-write mode during recovery".
		if strings.Contains(e.Message, "during recovery") && m.ReadOnly != nil {
			return fmt.Errorf("%w: the server is a hot standby: nothing was written: %w", m.ReadOnly, err)
		}
	case InvalidParameter:
		if strings.HasPrefix(e.Message, "fencelock:") {
			return wrap(m.InvalidInput, err)
		}
	case InvalidSchema, UndefinedFunc, UndefinedTable:
		if strings.Contains(e.Message, "fencelock") && m.SchemaMissing != nil {
			return fmt.Errorf("%w (%w)", m.SchemaMissing, err)
		}
	}
	return err
}

// wrap is "sentinel: err", or err when there is no sentinel.
func wrap(sentinel, err error) error {
	if sentinel == nil {
		return err
	}
	return fmt.Errorf("%w: %w", sentinel, err)
}
