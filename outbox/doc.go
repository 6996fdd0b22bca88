// Package outbox makes a fenced transaction's side effects (an HTTP call,
// a message, an e-mail) as safe as its writes: the effects are recorded
// as rows of fencelock.outbox inside the transaction, so they commit with
// its writes or not at all, and a [Relay] delivers the committed ones
// afterwards through a [Sender] ([HTTPSender] is in the library; other
// transports implement the interface). The seam with the stores is the
// commit queue of fn's transaction, which [Add] finds from fn's ctx and tx,
// typed by the store's transaction type; outbox owns the rows, the relay
// and the senders.
//
// # Recording effects
//
// Inside guard.Exec's fn, [Add] records effects on fn's transaction, with
// either store (pgfence's pgx.Tx, sqlfence's *sql.Tx):
//
//	_, err := guard.Exec(ctx, store, lock, func(ctx context.Context, tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, `UPDATE stock SET qty = $1 WHERE sku = $2`, qty, sku); err != nil {
//			return err
//		}
//		return outbox.Add(ctx, tx, outbox.Effect{
//			Destination: "https://shop.example/stock",
//			Key:         "stock-sync:eu:" + batchID,
//			Payload:     body,
//		})
//	}, guard.WithKey(batchID))
//
// Both stores record effects the same way: the commit writes them, live,
// in the committing transaction, after fn returned nil (pgfence in the
// commit's own round trip, sqlfence one statement per Add after the
// claim). A fn that ends the transaction itself records none; a savepoint
// rolled back drops them only if the store sees it (pgfence's tx.Begin),
// not one made in SQL; see [Add]. Each Add is one plain INSERT of rows
// that carry the transaction's claim (resource, token, holder); the
// commit's own check of that claim, under the fence lock, is what lets
// them go out, so they cost no check of their own. pgfence prepares the
// statement once per connection.
// The relays of the process wake when the commit succeeds; [Notify] wakes
// those of other processes too.
//
// Writers in other languages record effects with the SQL API: after
// fencelock.claim in the transaction that writes,
//
//	SELECT fencelock.outbox_add('[{"d": "https://shop.example/stock", "k": "sync:eu:42", "p": "<base64>"}]');
//
// d is the destination, k the key, p the payload (base64), h the headers
// ({"Name": ["value"]}), o true for per-resource order; a second argument
// true also notifies. outbox_add claims the transaction's claim itself
// (FL001 when it is stale) and writes rows for it. The outbox's row
// trigger refuses a row written without a claim in its transaction, or
// for another claim than the transaction's (FL002); a raw INSERT into
// fencelock.outbox (an application role may insert the columns a writer
// sets) must therefore carry its claim, and claim it before COMMIT.
//
// # The promise
//
//   - Nothing leaves a rolled-back or stale transaction. An effect row
//     commits with the transaction that records it, or not at all: fn's
//     error, a panic, a cancelled context, a stale token at the commit, an
//     applied key (guard.ErrAlreadyApplied: a retry records nothing).
//     Relays send committed rows only.
//   - At least once while a relay runs. A committed effect is sent until
//     a Send succeeds, the receiver refuses it as superseded (409,
//     [ErrSuperseded]: the row is deleted), or it fails for good (a 4xx,
//     [ErrTerminal]) or runs out of attempts: then its row is dead, kept
//     with the reason, listed by fencectl outbox list --dead and sent
//     again after fencectl outbox requeue.
//   - Effectively once where the receiver deduplicates by key for longer
//     than the longest redelivery delay ([Relay.MaxRedeliveryDelay]). An
//     effect is sent more than once when a relay dies (or loses the
//     database) after sending and before recording the delivery — at most
//     its concurrency (WithConcurrency) per death —, when a send overruns the send timeout,
//     or when the receiver's answer is lost; every attempt carries the same
//     Idempotency-Key. A receiver running [Receive] (guard.Exec with
//     guard.WithKey on its own Postgres) answers a repeat 200 and applies
//     it once, as long as the key is kept: prune keys (pgfence's or
//     sqlfence's Prune, fencectl keys prune) only with an age above the
//     longest redelivery delay of the relays that send to it.
//
// A fenced receiver also refuses a delivery whose token is older than one
// it has applied for the same resource (409): a newer holder's effect has
// overtaken it. Effects that must all arrive, in commit order, set
// Effect.Ordered.
//
// # Relays
//
// A relay claims due rows in one short statement (FOR UPDATE SKIP LOCKED:
// relays never wait for one another), holds them for a visibility timeout
// while it sends — no transaction is open meanwhile —, and records each
// outcome naming its claim: a relay that outlived its claim (killed,
// paused, cut off) changes nothing, and the rows it held are claimed again
// once their visibility timeout has passed. A failed attempt is retried
// after a backoff that doubles, with jitter; a Send that panics, hangs
// past the send timeout or returns an error is a failed attempt, and the
// relay goes on. Any number of relays, in any number of processes, may
// serve one database. A relay reports its claims, the outcome of every
// attempt at a delivery, its records and the database trouble it waits
// through to its observers ([WithObserver], [Observer]).
//
// A relay wakes up when a transaction of its own process that added
// effects commits (a commit knows no relay, so the package keeps the set
// of the process's running relays: its one package-level state), on
// NOTIFY fencelock_outbox with [WithListen] (effects added with notify; a
// commit that notifies takes a database-wide lock, so keep that for low
// rates), and by polling, which is always on and the only mode behind a
// transaction pooler such as PgBouncer.
//
// A claim reads indexes only, never the table: unordered rows by due time,
// ordered rows by a loose scan over the resources that have any (one
// index probe per resource), starting where the previous claim stopped so
// that every resource gets its turn. A backlog of a million rows costs a
// claim no more than a backlog of a hundred, and a relay holds in memory
// what its batches hold. The operators' reads are bounded the same way:
// [Backlog] counts by state up to a limit over indexes, [List] reads as
// many dead rows as it lists; [Count], exact, reads the whole table.
//
// Per-resource order ([Effect].Ordered): an ordered effect is sent only
// once every older ordered effect of its resource (by the token of its
// transaction, then by the order of recording) has been delivered or is
// dead. Tokens of committed transactions of a resource never decrease in
// commit order, so this is commit order, but for two transactions of the
// same holder committed concurrently. A dead row leaves the order: the
// ones after it go on, and a requeued row is sent when it comes due.
package outbox
