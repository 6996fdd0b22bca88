// Package fencelockotel reports fencelock's lock and guarded-write events
// as OpenTelemetry metrics and spans. It is a module of its own
// (github.com/fencelock/fencelock/otel), versioned apart from the library,
// so that the library's go.mod carries no OpenTelemetry dependency.
//
// One [Observer] serves every side: pass it to fence.WithObserver (lock
// events), to pgstore.WithObserver (every guard.Exec, Advance and run
// step through that store) or guard.WithObserver (one call), and to
// outbox.WithObserver (a relay's claims, deliveries, records and errors),
// and to tick.WithObserver (scheduled jobs' ticks, missed ones included):
//
//	obs, err := fencelockotel.New() // the global MeterProvider and TracerProvider
//	client, err := fence.New(rdb, fence.WithObserver(obs))
//	store, err := pgfence.New(pool, pgstore.WithObserver(obs))
//	relay, err := outbox.NewRelay(pool, sender, outbox.WithObserver(obs))
//
// Metrics: counters and histograms of acquisitions, waits, holds,
// renewals, losses, guarded writes, Advance calls and the outbox relays'
// claims, deliveries (by outcome, with the lag since the commit), records
// and database errors, with small fixed attribute sets (lock and resource
// names only with [WithNameAttribute]); with [WithOutboxBacklog], a gauge
// of the outbox's rows by state, read at most once per interval.
// The metrics' names and attributes, what to alert on, and a whole
// Prometheus program are in README.md
// (https://github.com/fencelock/fencelock/blob/main/otel/README.md).
//
// Spans: "fence.Acquire" per acquisition, "fence.Release" per release
// (Lock.Release and Client.Close), "guard.Exec" per guarded write and
// "guard.Advance" per Store.Advance, children of the span in the call's
// ctx, with the name, token, outcome and reason as attributes (always: a
// span is one event, not a series); "outbox.Send" per attempt at a
// delivery, a child of the span in the relay's Run ctx. All are recorded when the call ends,
// from the event's start and duration, so they do not parent the spans
// made inside the call (pgx's, say).
//
// A span's status is Error when the call failed, its outcome is unknown,
// or the refusal means trouble; README.md lists which outcomes those are.
// A delivery refused as superseded (409) or already applied is not an
// error: its outcome attribute says what happened.
package fencelockotel
