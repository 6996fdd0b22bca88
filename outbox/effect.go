package outbox

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
)

// Limits on an Effect, checked by Add before anything is queued.
const (
	// MaxPayload is the largest payload, in bytes.
	MaxPayload = 1 << 20
	// MaxDestinationLen is the longest destination, in bytes.
	MaxDestinationLen = 2048
	// MaxKeyLen is the longest key, in bytes: guard's limit, so that a
	// fenced receiver can use the key with guard.WithKey.
	MaxKeyLen = guard.MaxKeyLen
	// MaxHeaderBytes is the most an effect's headers may hold, names and
	// values together.
	MaxHeaderBytes = 64 << 10
)

// Header names the relay sets on every delivery (see [HTTPSender]); an
// Effect may not set them itself.
const (
	HeaderIdempotencyKey  = "Idempotency-Key"
	HeaderFencingToken    = "Fencing-Token"
	HeaderFencingResource = "Fencing-Resource"
	HeaderFencingHolder   = "Fencing-Holder"
)

// HeaderFencingOutcome is the answer header with which a receiver says it
// had applied a delivery before: [Receive] answers a redelivery 200 with
// "Fencing-Outcome: already_applied", and [HTTPSender] then returns
// guard.ErrAlreadyApplied, so the relay reports the outcome
// [AlreadyApplied] (the row is deleted, as for any delivery).
const HeaderFencingOutcome = "Fencing-Outcome"

// Effect is a side effect recorded in a fenced transaction and delivered
// by a [Relay] once that transaction has committed.
type Effect struct {
	// Destination says where the effect goes: a URL for [HTTPSender], any
	// non-empty string a Sender of your own understands.
	Destination string
	// Key identifies the effect at the receiver: sent as Idempotency-Key,
	// the same on every attempt. Derive it from what the transaction did
	// ("stock-sync:eu:batch-42"), so that a receiver applies it once.
	Key string
	// Payload is the body, at most MaxPayload bytes.
	Payload []byte
	// Header holds extra headers (Content-Type, say): valid HTTP names and
	// values, none of the four the relay sets.
	Header http.Header
	// Ordered asks for per-resource order: the effect is delivered only
	// after every older ordered effect of the same resource (older by the
	// token of its transaction, then by the order of Add) was delivered or
	// is dead. Unordered effects go as soon as a relay claims them.
	Ordered bool
}

// reserved are the headers the relay owns, canonical.
var reserved = map[string]bool{
	HeaderIdempotencyKey: true, HeaderFencingToken: true, HeaderFencingResource: true, HeaderFencingHolder: true,
}

// check says what is wrong with e, naming effect i of the call.
func (e *Effect) check(i int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: effect %d: %s", ErrInvalidEffect, i, fmt.Sprintf(format, args...))
	}
	switch {
	case e.Destination == "":
		return bad("empty Destination: say where it goes (a URL for HTTPSender)")
	case len(e.Destination) > MaxDestinationLen:
		return bad("Destination is %d bytes, the limit is %d", len(e.Destination), MaxDestinationLen)
	case !utf8.ValidString(e.Destination) || strings.IndexByte(e.Destination, 0) >= 0:
		return bad("Destination is not valid UTF-8 text without NUL bytes")
	case e.Key == "":
		return bad("empty Key: give it a key the receiver can deduplicate by, derived from what the transaction did")
	case len(e.Key) > MaxKeyLen:
		return bad("Key is %d bytes, the limit is %d", len(e.Key), MaxKeyLen)
	case !validHeaderValue(e.Key):
		return bad("Key %q cannot travel as an HTTP header value (control characters)", e.Key)
	case len(e.Payload) > MaxPayload:
		return bad("Payload is %d bytes, the limit is %d (MaxPayload): store large data elsewhere and send a reference", len(e.Payload), MaxPayload)
	}
	size := 0
	for name, values := range e.Header {
		if !validHeaderName(name) {
			return bad("header name %q is not a valid HTTP header name", name)
		}
		if reserved[http.CanonicalHeaderKey(name)] {
			return bad("header %s is set by the relay itself", http.CanonicalHeaderKey(name))
		}
		for _, v := range values {
			if !validHeaderValue(v) {
				return bad("header %s has a value with control characters: %q", name, v)
			}
			size += len(name) + len(v)
		}
	}
	if size > MaxHeaderBytes {
		return bad("headers hold %d bytes, the limit is %d", size, MaxHeaderBytes)
	}
	return nil
}

// validHeaderName reports whether s is an RFC 9110 field name (a token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// validHeaderValue reports whether s can be sent as a field value: no
// control characters but horizontal tab, valid UTF-8.
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return utf8.ValidString(s)
}

// row is an effect as sqlAddJSON (and fencelock.outbox_add) reads it.
type row struct {
	D string              `json:"d"`
	K string              `json:"k"`
	P string              `json:"p,omitempty"`
	H map[string][]string `json:"h,omitempty"`
	O bool                `json:"o,omitempty"`
}

// encode checks effects and returns the statement that records them for
// claim, with its arguments.
func encode(claim guard.Claim, effects []Effect) (pgcore.Queued, error) {
	if len(effects) == 0 {
		return pgcore.Queued{}, fmt.Errorf("%w: no effect given", ErrInvalidEffect)
	}
	for i := range effects {
		if err := effects[i].check(i); err != nil {
			return pgcore.Queued{}, err
		}
	}
	if len(effects) <= maxValuesRows {
		args := make([]any, 0, 3+5*len(effects))
		args = append(args, claim.Resource, claim.Token, claim.Holder)
		for i := range effects {
			e := &effects[i]
			var header any
			if h := canonical(e.Header); h != nil {
				b, err := json.Marshal(h)
				if err != nil {
					return pgcore.Queued{}, fmt.Errorf("outbox: encode effects: %w", err)
				}
				header = string(b)
			}
			payload := e.Payload
			if payload == nil {
				payload = []byte{} // NULL is not an empty payload
			}
			args = append(args, e.Destination, e.Key, payload, header, e.Ordered)
		}
		return pgcore.Queued{SQL: sqlAddValues[len(effects)], Args: args}, nil
	}
	rows := make([]row, len(effects))
	for i := range effects {
		e := &effects[i]
		rows[i] = row{D: e.Destination, K: e.Key, P: base64.StdEncoding.EncodeToString(e.Payload), H: canonical(e.Header), O: e.Ordered}
	}
	b, err := json.Marshal(rows)
	if err != nil {
		return pgcore.Queued{}, fmt.Errorf("outbox: encode effects: %w", err)
	}
	return pgcore.Queued{SQL: sqlAddJSON, Args: []any{claim.Resource, claim.Token, claim.Holder, string(b)}}, nil
}

// canonical is h with canonical names, nil when it holds nothing.
func canonical(h http.Header) map[string][]string {
	if len(h) == 0 {
		return nil
	}
	out := make(map[string][]string, len(h))
	for name, v := range h {
		out[http.CanonicalHeaderKey(name)] = append(out[http.CanonicalHeaderKey(name)], v...)
	}
	return out
}

// RedactDestination is destination as logs and traces show it: a URL
// with a password has it replaced by xxxxx (url.URL.Redacted); any other
// destination as it is. The relay's log lines and package fencelockotel's
// spans use it.
func RedactDestination(destination string) string {
	if u, err := url.Parse(destination); err == nil && u.Scheme != "" && u.User != nil {
		return u.Redacted()
	}
	return destination
}
