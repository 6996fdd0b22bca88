package prequeue

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxNameLen is the longest lock name accepted, in bytes. Holder ids
// (WithHolder) have the same cap. Both fit the limits the Postgres stores
// check before they send anything (guard.MaxResourceLen, MaxHolderLen and
// MaxKeyLen, 1 KiB each, sized so that resource plus key fit one btree
// entry of the fence tables), so a lock's name and holder are always
// accepted there.
const MaxNameLen = 512

// validateName rejects names that cannot be used safely (see textProblem
// for the characters). Braces are
// rejected rather than escaped: the name is the cluster hash tag of its
// keys (<prefix>{<name>}), and a '}' inside it would end the tag early and
// put the lock key and its counter in different slots; an escaping scheme
// would make the keys unreadable for operators, and no caller needs braces.
func validateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: the name is empty; give every lock a non-empty name", ErrInvalidName)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: the name is %d bytes, the limit is %d; use a shorter name (a hash of a long one)",
			ErrInvalidName, len(name), MaxNameLen)
	case strings.ContainsAny(name, "{}"):
		return fmt.Errorf("%w: %q contains '{' or '}', which would break the cluster hash tag of its keys; use other characters",
			ErrInvalidName, name)
	}
	if why := textProblem(name); why != "" {
		return fmt.Errorf("%w: %q %s; use printable UTF-8 text (encode binary names, e.g. in hex)", ErrInvalidName, name, why)
	}
	return nil
}

// textProblem says what makes s unfit for a name, a holder id or a
// prefix, or "" when it is fit: it must be valid UTF-8 without control
// characters, because it reaches Redis keys, log lines, operators'
// terminals and the fence table (Postgres text refuses invalid UTF-8 and
// NUL).
func textProblem(s string) string {
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			return fmt.Sprintf("is not valid UTF-8 (at byte %d)", i)
		case unicode.IsControl(r):
			return fmt.Sprintf("contains a control character (%U at byte %d)", r, i)
		}
	}
	return ""
}

// keys are the Redis keys of one lock name. All three share the hash tag
// {<name>}, so they live in one cluster slot and one script may touch them.
type keys struct {
	lock    string // "<token>:<holder>" with a PX expiry
	seq     string // token counter
	channel string // release notifications
}

func keysFor(prefix, name string) keys {
	// One allocation on the acquire path: the three keys are slices of
	// "<base>:seq<base>:ch".
	n := len(prefix) + len(name) + 2
	s := prefix + "{" + name + "}:seq" + prefix + "{" + name + "}:ch"
	return keys{lock: s[:n], seq: s[:n+4], channel: s[n+4:]}
}
