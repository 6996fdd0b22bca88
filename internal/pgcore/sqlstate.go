// Package pgcore is what the Postgres stores (pgfence over pgx, sqlfence
// over database/sql) share: the one place that knows the SQLSTATEs of the
// fencelock functions and maps them to guard's errors, whatever the driver
// that carries them (pgx, pgx's database/sql driver, lib/pq); the checks of
// input before anything is sent; the claim cache; the settings a Store is
// configured with; resumable runs, Advance and Prune over a driver; and the
// hook that queues statements onto an open guarded transaction's commit.
// The stores keep only what differs: the driver.
package pgcore

import (
	"errors"
	"reflect"
)

// SQLSTATEs raised by the fencelock functions (see package migrations) and
// the Postgres ones a store names.
const (
	Stale      = "FL001" // stale token
	NotClaimed = "FL002" // protected table written without a fence claim
	Applied    = "FL003" // idempotency key already applied
	Finished   = "FL004" // resumable run finished

	InvalidParameter    = "22023" // invalid_parameter_value, bad argument to a fencelock function
	ReadOnly            = "25006" // read_only_sql_transaction
	FeatureNotSupported = "0A000" // feature_not_supported (a hot standby refusing a read-write transaction)
	LockNotAvailable    = "55P03" // lock_timeout expired
	InvalidSchema       = "3F000" // invalid_schema_name
	UndefinedFunc       = "42883" // undefined_function
	UndefinedTable      = "42P01" // undefined_table
)

// Error is what a store reads of a Postgres error.
type Error struct {
	Code    string // SQLSTATE
	Message string // primary message
	Detail  string // DETAIL, "" when the driver does not expose it
}

// sqlStater is the method Postgres drivers put on their server errors:
// *pgconn.PgError (pgx, and pgx's database/sql driver) and *pq.Error
// (lib/pq) both have it.
type sqlStater interface {
	error
	SQLState() string
}

// From finds a Postgres server error in err's chain. The code comes from
// the SQLState method; the message and DETAIL from the error's Message and
// Detail string fields, which both pgx's and lib/pq's error structs have
// (a driver without them still gets its code mapped, only the figures of a
// stale-token error are then missing).
func From(err error) (Error, bool) {
	var s sqlStater
	if err == nil || !errors.As(err, &s) {
		return Error{}, false
	}
	e := Error{Code: s.SQLState()}
	if e.Code == "" {
		return Error{}, false
	}
	v := reflect.ValueOf(s)
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return e, true
		}
		v = v.Elem()
	}
	if v.Kind() == reflect.Struct {
		e.Message = stringField(v, "Message")
		e.Detail = stringField(v, "Detail")
	}
	if e.Message == "" {
		e.Message = s.Error()
	}
	return e, true
}

func stringField(v reflect.Value, name string) string {
	f := v.FieldByName(name)
	if !f.IsValid() || f.Kind() != reflect.String {
		return ""
	}
	return f.String()
}

// Code is the SQLSTATE of the Postgres error in err's chain, or "".
func Code(err error) string {
	e, _ := From(err)
	return e.Code
}
