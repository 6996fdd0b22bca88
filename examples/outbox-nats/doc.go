// Package natsoutbox delivers fenced side effects to NATS JetStream: a
// transport of the user's, written against the outbox.Sender interface,
// in a module of its own so that the NATS client and server never enter
// the library's go.mod.
//
// A fenced transaction records an effect whose destination is
// nats://<subject> (outbox.Add); an outbox.Relay whose Sender is a
// [Sender] publishes it to that subject once the transaction has
// committed, with the fencing headers as NATS headers and [MsgID] of its
// subject, resource and key as Nats-Msg-Id. A consumer applies each
// message with [Receive]:
// guard.Exec with the message's lease and key, on the consumer's own
// Postgres, so that a message is applied once and never after a newer
// holder's.
//
// # The promise
//
// What outbox promises holds up to the publish: nothing is published for a
// transaction that rolled back or was stale, and a committed effect is
// published at least once while a relay runs (or its row goes dead, see
// [Sender] for what is terminal). An effect is published again when a
// relay dies after publishing and before recording it, or when the
// acknowledgement does not arrive within the relay's send timeout. Then:
//
//   - The stream stores an effect once within its duplicate window.
//     Every attempt carries the same Nats-Msg-Id, and JetStream
//     acknowledges a message whose id it stored within the window
//     (StreamConfig.Duplicates, 2 minutes by default) as a duplicate
//     without storing it; the Sender returns guard.ErrAlreadyApplied for
//     it, and the relay deletes the row. Two attempts farther apart than
//     the window are stored twice. The id is that of the effect's subject,
//     resource and key, what a receiver tells effects apart by (it applies
//     a key once per resource): effects that share a key under different
//     resources or subjects are each stored, and a second transaction
//     recording the same key for the same resource and subject within the
//     window is taken for a copy, as a fenced receiver applies it once.
//   - Setting the window to at least the relay's longest redelivery delay,
//     Relay.MaxRedeliveryDelay() (about 68 minutes at the outbox's
//     defaults), makes it once for every redelivery a relay can make: a
//     relay's attempts at one effect are never farther apart than that. A
//     dead row requeued with fencectl outbox requeue starts a new series
//     of attempts, and is stored again if its first copy has left the
//     window. JetStream keeps the ids of the window in memory: a long
//     window costs one entry per message published within it.
//   - A consumer that runs [Receive] applies each key once, whatever the
//     stream stored, as long as its database keeps the key (JetStream
//     itself delivers at least once: a lost Ack delivers again). Every
//     copy is delivered at most the stream's MaxAge after it was stored,
//     so keys kept for MaxAge, plus MaxRedeliveryDelay when the window is
//     shorter than that, cover every copy; a stream that keeps messages
//     for good needs keys kept for good.
//   - The consumer refuses a message whose token is older than one it has
//     applied for the same resource (Term): a newer holder's effect has
//     overtaken it, as an HTTP receiver answers 409.
//
// What is not covered: a consumer that does not deduplicate by key sees
// the copies the stream stored; a NATS cluster that loses acknowledged
// messages (R1 streams on a lost disk) loses effects the outbox counted
// as delivered.
package natsoutbox
