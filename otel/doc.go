// Package fencelockotel reports fencelock's lock and guarded-write events
// as OpenTelemetry metrics and spans. It is a module of its own
// (github.com/fencelock/fencelock/otel), versioned apart from the library,
// so that the library's go.mod carries no OpenTelemetry dependency.
//
// One [Observer] serves both sides: pass it to fence.WithObserver (lock
// events) and to pgfence.WithObserver (every guard.Exec and run step through
// that store) or guard.WithObserver (one call):
//
//	obs, err := fencelockotel.New() // the global MeterProvider and TracerProvider
//	client, err := fence.New(rdb, fence.WithObserver(obs))
//	store, err := pgfence.New(pool, pgfence.WithObserver(obs))
//
// Metrics (durations in seconds, histograms):
//
//	fencelock.lock.acquisitions    counter    outcome=acquired|reacquired|not_acquired|error
//	fencelock.lock.wait.duration   histogram  outcome   time an acquisition waited for another holder
//	fencelock.lock.hold.duration   histogram  end=released|lost|max_hold
//	fencelock.lock.renewals        counter    outcome=ok|error
//	fencelock.lock.losses          counter    reason=gone|taken|deadline|lease_ended|max_hold|other
//	fencelock.guard.execs          counter    outcome=committed|rejected|failed|unknown, reason
//	fencelock.guard.exec.duration  histogram  outcome
//
// The attribute sets are small and fixed, so series stay few. Lock and
// resource names are left out by default (a batch per customer would make
// one series each); [WithNameAttribute] adds them as fencelock.lock.name
// and fencelock.resource.
//
// Spans: "fence.Acquire" per acquisition and "guard.Exec" per guarded
// write, children of the span in the call's ctx, with the name, token,
// outcome and reason as attributes (always: a span is one event, not a
// series). Both are recorded when the call ends, from the event's start
// and duration, so they do not parent the spans made inside the call
// (pgx's, say).
package fencelockotel
