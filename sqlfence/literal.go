package sqlfence

import (
	"database/sql"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
)

// lib/pq sends a statement that has arguments in two round trips (Parse
// and Describe, then Bind and Execute) unless its DSN says
// binary_parameters=yes, and one without arguments as a simple query, in
// one. So with lib/pq sqlfence sends its own statements (advance, the
// check, the claim; never fn's) with their values written in as literals:
// a guarded transaction then takes two round trips more than a plain one
// instead of four. Other drivers get bound parameters (pgx's driver caches
// its prepared statements: one round trip each, and literals would defeat
// its cache).
func literalDriver(db *sql.DB) bool {
	return reflect.TypeOf(db.Driver()).String() == "*pq.Driver"
}

var placeholder = regexp.MustCompile(`\$[0-9]+`)

// inline is q with each $n replaced by the literal of args[n-1]. q is one
// of sqlfence's own statements (no $ in its string constants).
func inline(q string, args []any) string {
	return placeholder.ReplaceAllStringFunc(q, func(m string) string {
		n, _ := strconv.Atoi(m[1:])
		return literal(args[n-1])
	})
}

// literal writes v as a typed SQL literal. Strings are escape strings
// (E'...'), whose meaning does not depend on standard_conforming_strings;
// they never hold a NUL byte (checked before anything is sent).
func literal(v any) string {
	switch v := v.(type) {
	case nil:
		return "NULL"
	case string:
		return "E'" + strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(v) + "'::pg_catalog.text"
	case int64:
		return strconv.FormatInt(v, 10) + "::pg_catalog.int8"
	case bool:
		return strconv.FormatBool(v) + "::pg_catalog.bool"
	}
	panic(fmt.Sprintf("sqlfence: no literal for %T", v))
}
