package natsoutbox

import "errors"

// ErrNilJetStream is returned by NewSender for a nil JetStream.
var ErrNilJetStream = errors.New("natsoutbox: nil JetStream: pass jetstream.New(nc)")

// ErrBadDestination is matched by the error of Subject, and of Send (as a
// terminal one), for a destination that is not nats://<subject> with a
// subject a message can be published to.
var ErrBadDestination = errors.New("natsoutbox: bad destination")
