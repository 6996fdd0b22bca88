package natsoutbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/outbox"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Scheme starts every destination a Sender delivers to: nats://<subject>.
const Scheme = "nats://"

// HeaderMsgID is JetStream's deduplication header; the Sender sets it to
// [MsgID] of the effect's subject, resource and key.
const HeaderMsgID = "Nats-Msg-Id"

// MsgID is the Nats-Msg-Id the Sender gives an effect: the hex SHA-256 of
// its subject, resource and key, each but the last prefixed with its
// length in bytes ("<len>:<subject><len>:<resource><key>"), so that no two
// different triples share an id.
//
// JetStream deduplicates by this id across the whole stream, so the id
// holds everything that tells two effects apart for a receiver. A fenced
// receiver applies a key once per resource (guard.WithKey): the same key
// under two resources is two effects, and with the key alone as the id the
// stream would take the second for a copy of the first and the relay would
// delete its row unsent. The subject is in the id because one stream may
// feed consumers of different subjects, each with its own database. The
// token is not: every attempt at one effect carries the same resource, key
// and token, and two transactions that record the same key for the same
// resource (two tokens) are the case a receiver applies once, so the
// stream stores them once as well.
func MsgID(subject, resource, key string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s%d:%s%s", len(subject), subject, len(resource), resource, key)
	return hex.EncodeToString(h.Sum(nil))
}

// Sender is an outbox.Sender that publishes each effect to NATS
// JetStream, to the subject of its destination (nats://<subject>): the
// payload as the message's data, the effect's headers as NATS headers,
// four more,
//
//	Idempotency-Key:  the effect's key
//	Fencing-Token:    the token of the transaction that recorded it
//	Fencing-Resource: its resource (lock name)
//	Fencing-Holder:   its holder
//
// and Nats-Msg-Id, [MsgID] of the subject, the resource and the key, so
// that the stream stores a message sent again (a relay that died after
// publishing, an ack lost to a timeout) once, as long as the first copy is
// within the stream's duplicate window, while effects that share a key
// under other resources or subjects are stored each.
//
// Send returns nil once JetStream has acknowledged the message as stored,
// and an error wrapping guard.ErrAlreadyApplied when it acknowledges a
// duplicate of a message it stored before (the relay deletes the row, as
// delivered before, and counts it in RelayStats.AlreadyApplied). Failures
// the effect itself causes are
// terminal (outbox.ErrTerminal: the row goes dead with the reason, as for
// an HTTP 4xx): a destination that is not nats://<subject> or whose
// subject cannot take a publish (empty token, a wildcard, whitespace, the
// server's own $JS/$SYS/_INBOX subjects), no stream bound to the subject,
// a server or account without JetStream, a message over the server's or
// the stream's size limit, any JetStream answer in the 4xx range (a
// sealed stream, say). Everything else is retried with the relay's
// backoff: a timeout (the send timeout), a connection lost or
// reconnecting, a stream that exists but does not answer (its leader is
// changing), JetStream's 5xx answers (storage failed, limits reached).
type Sender struct {
	js jetstream.JetStream
}

var _ outbox.Sender = (*Sender)(nil)

// NewSender returns a Sender that publishes through js. The connection
// behind js is the caller's: its reconnect options decide how a lost
// server is waited for, each Send within the relay's send timeout. A
// publish made while the connection reconnects waits in the client's
// reconnect buffer and goes out when it is back, possibly after its Send
// has timed out and the relay has tried again: the stream takes the copies
// within its duplicate window as one.
func NewSender(js jetstream.JetStream) (*Sender, error) {
	if js == nil {
		return nil, ErrNilJetStream
	}
	return &Sender{js: js}, nil
}

// Send publishes d and waits for JetStream's acknowledgement, within ctx
// (the relay's send timeout).
func (s *Sender) Send(ctx context.Context, d outbox.Delivery) error {
	subject, err := Subject(d.Destination)
	if err != nil {
		return outbox.Terminal(err)
	}
	msg := &nats.Msg{Subject: subject, Data: d.Payload, Header: make(nats.Header, len(d.Header)+5)}
	for name, values := range d.Header {
		if name == HeaderMsgID {
			return outbox.Terminal(fmt.Errorf("natsoutbox: the effect sets header %s, which the sender sets to an id of its subject, resource and key", HeaderMsgID))
		}
		msg.Header[name] = append([]string(nil), values...)
	}
	msg.Header.Set(outbox.HeaderIdempotencyKey, d.Key)
	msg.Header.Set(outbox.HeaderFencingToken, strconv.FormatInt(d.Token, 10))
	msg.Header.Set(outbox.HeaderFencingResource, d.Resource)
	msg.Header.Set(outbox.HeaderFencingHolder, d.Holder)
	// No retries on no-responders here: the relay's backoff retries a
	// stream that did not answer, and the send timeout stays the relay's.
	ack, err := s.js.PublishMsg(ctx, msg, jetstream.WithMsgID(MsgID(subject, d.Resource, d.Key)), jetstream.WithRetryAttempts(0))
	if err != nil {
		return s.failed(ctx, subject, err)
	}
	if ack.Duplicate {
		return fmt.Errorf("natsoutbox: publish to %s: stream %s stored it before, as message %d: %w", subject, ack.Stream, ack.Sequence, guard.ErrAlreadyApplied)
	}
	return nil
}

// failed names why a publish to subject failed, terminal when sending it
// again cannot help.
func (s *Sender) failed(ctx context.Context, subject string, err error) error {
	fail := func(err error) error { return fmt.Errorf("natsoutbox: publish to %s: %w", subject, err) }
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		return s.noResponse(ctx, subject, err)
	case errors.Is(err, nats.ErrMaxPayload):
		return outbox.Terminal(fail(fmt.Errorf("%w: the message is larger than the server's max_payload", err)))
	case errors.Is(err, nats.ErrBadSubject), errors.Is(err, jetstream.ErrInvalidSubject):
		return outbox.Terminal(fail(err))
	case errors.As(err, &apiErr) && apiErr.Code >= 400 && apiErr.Code < 500:
		return outbox.Terminal(fail(apiErr))
	case ctx.Err() != nil:
		// The send timeout: the message may have been stored (or be
		// waiting in the client's reconnect buffer); a retry with the same
		// Nats-Msg-Id is a duplicate then.
		if nc := s.js.Conn(); nc != nil && !nc.IsConnected() {
			return fail(fmt.Errorf("no acknowledgement from JetStream: not connected to a NATS server (%s): %w", nc.Status(), context.Cause(ctx)))
		}
		return fail(fmt.Errorf("no acknowledgement from JetStream: %w", context.Cause(ctx)))
	}
	return fail(err)
}

// noResponse decides what a publish that no stream answered means: no
// stream is bound to the subject (terminal), or one is and did not answer,
// as while its leader changes (retried).
func (s *Sender) noResponse(ctx context.Context, subject string, err error) error {
	stream, lerr := s.js.StreamNameBySubject(ctx, subject)
	switch {
	case errors.Is(lerr, jetstream.ErrStreamNotFound):
		return outbox.Terminal(fmt.Errorf("natsoutbox: publish to %s: no JetStream stream takes this subject: add one whose subjects match it, then fencectl outbox requeue", subject))
	case errors.Is(lerr, nats.ErrNoResponders), errors.Is(lerr, jetstream.ErrJetStreamNotEnabled), errors.Is(lerr, jetstream.ErrJetStreamNotEnabledForAccount):
		// No one answers JetStream's own API either: the server (or the
		// account) has no JetStream.
		return outbox.Terminal(fmt.Errorf("natsoutbox: publish to %s: JetStream is not enabled for this connection's account (%v): enable JetStream on the server (or the account), add a stream for the subject, then fencectl outbox requeue", subject, lerr))
	case lerr == nil:
		return fmt.Errorf("natsoutbox: publish to %s: stream %s takes the subject but did not answer (a leader election?): %w", subject, stream, err)
	}
	return fmt.Errorf("natsoutbox: publish to %s: %w (and the stream lookup failed: %v)", subject, err, lerr)
}

// reservedPrefixes are subjects of the server's own APIs and of replies:
// a publish there is a command, not a message.
var reservedPrefixes = []string{"$JS.", "$JSC.", "$SYS.", "$NRG.", "_INBOX."}

// Subject returns the subject of a destination nats://<subject>, or an
// error matching ErrBadDestination that says what is wrong with it.
func Subject(destination string) (string, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %q: %s", ErrBadDestination, destination, fmt.Sprintf(format, args...))
	}
	subject, ok := strings.CutPrefix(destination, Scheme)
	switch {
	case !ok:
		return "", bad("not a NATS destination: write %s<subject>, e.g. %sstock.eu", Scheme, Scheme)
	case subject == "":
		return "", bad("no subject after %s", Scheme)
	case !utf8.ValidString(subject):
		return "", bad("the subject is not valid UTF-8")
	}
	for i := 0; i < len(subject); i++ {
		if c := subject[i]; c <= ' ' || c == 0x7f {
			return "", bad("the subject has whitespace or a control character at byte %d", i)
		}
	}
	for _, token := range strings.Split(subject, ".") {
		switch token {
		case "":
			return "", bad("the subject has an empty token (a leading, trailing or double dot)")
		case "*", ">":
			return "", bad("the subject has the wildcard %q: a message is published to one subject", token)
		}
	}
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(subject, p) {
			return "", bad("%s... subjects belong to the server's own APIs or replies", strings.TrimSuffix(p, "."))
		}
	}
	return subject, nil
}
