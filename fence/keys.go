package fence

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

// keys are the Redis keys of one lock name. All share the hash tag
// {<name>}, so they live in one cluster slot and one script may touch them.
type keys struct {
	lock    string // "<token>:<holder>" with a PX expiry
	seq     string // token counter
	queue   string // waiting holder ids, in arrival order (a list)
	waiters string // holder id -> "<deadline ms>:<grant lease ms>" (a hash)
	channel string // grants and release notifications
	// script is {lock, seq, queue, waiters}: the keys of acquire.lua,
	// release.lua and leave.lua, made once per acquisition and shared by
	// its calls (never written to).
	script []string
}

func keysFor(prefix, name string) keys {
	// Two allocations on the acquire path: the keys are slices of
	// "<base>:seq<base>:q<base>:w<base>:ch", and the scripts' keys one
	// slice of them.
	base := len(prefix) + len(name) + 2
	s := prefix + "{" + name + "}:seq" + prefix + "{" + name + "}:q" + prefix + "{" + name + "}:w" +
		prefix + "{" + name + "}:ch"
	q := base + 4
	w := q + base + 2
	ch := w + base + 2
	k := keys{lock: s[:base], seq: s[:base+4], queue: s[q : q+base+2], waiters: s[w : w+base+2], channel: s[ch:]}
	k.script = []string{k.lock, k.seq, k.queue, k.waiters}
	return k
}

// scriptKeys are the keys of acquire.lua, release.lua and leave.lua.
func (k keys) scriptKeys() []string { return k.script }
