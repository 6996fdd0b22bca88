// Package fencelockotel reports fencelock's lock and guarded-write events
// as OpenTelemetry metrics and spans. It is a module of its own
// (github.com/fencelock/fencelock/otel), versioned apart from the library,
// so that the library's go.mod carries no OpenTelemetry dependency.
//
// One [Observer] serves both sides: pass it to fence.WithObserver (lock
// events) and to pgfence.WithObserver (every guard.Exec, Advance and run
// step through that store) or guard.WithObserver (one call):
//
//	obs, err := fencelockotel.New() // the global MeterProvider and TracerProvider
//	client, err := fence.New(rdb, fence.WithObserver(obs))
//	store, err := pgfence.New(pool, pgfence.WithObserver(obs))
//
// Metrics: counters and histograms of acquisitions, waits, holds,
// renewals, losses, guarded writes and Advance calls, with small fixed
// attribute sets (lock and resource names only with [WithNameAttribute]).
// The metrics' names and attributes, what to alert on, and a whole
// Prometheus program are in README.md
// (https://github.com/fencelock/fencelock/blob/main/otel/README.md).
//
// Spans: "fence.Acquire" per acquisition, "fence.Release" per release
// (Lock.Release and Client.Close), "guard.Exec" per guarded write and
// "guard.Advance" per Store.Advance, children of the span in the call's
// ctx, with the name, token, outcome and reason as attributes (always: a
// span is one event, not a series). All are recorded when the call ends,
// from the event's start and duration, so they do not parent the spans
// made inside the call (pgx's, say).
//
// A span's status is Error when the call failed, its outcome is unknown,
// or the refusal means trouble; README.md lists which outcomes those are.
package fencelockotel
