package pgcore

import (
	"strconv"
	"unicode/utf8"
)

// OpenCheck is the check at the start of a guarded transaction, the same
// for both stores, as an expression over $1 resource, $2 token, $3 holder,
// $4 idempotency key and $5 run key (the empty string for none: keys and
// run keys are never empty, and with it rather than NULL the plan is the same for every
// transaction, so Postgres keeps one generic plan instead of planning the
// statement again each time) and $6 the claim (ClaimText). The common case
// (the stored token is this one with this holder, the key is new, the run
// not finished) reads the tables and sets the claim in the
// transaction-local setting fencelock.claim, which the protect trigger
// reads and pgfence's commit checks; anything else goes to
// fencelock.open, which raises what applies (stale token, applied key,
// finished run, bad argument) or claims. Its value is text. It locks
// nothing and calls no function in the common case: a function's executor
// start-up was most of a guarded transaction's cost on the server. Every
// name is schema-qualified, operators included, so the session's
// search_path cannot change it. The application role reads the tables
// (the migrations grant SELECT on them).
const OpenCheck = "CASE WHEN (SELECT f.token OPERATOR(pg_catalog.=) $2 AND f.holder OPERATOR(pg_catalog.=) $3" +
	" FROM fencelock.fence f WHERE f.resource OPERATOR(pg_catalog.=) $1)" +
	" AND NOT EXISTS (SELECT FROM fencelock.applied a" +
	" WHERE a.resource OPERATOR(pg_catalog.=) $1 AND a.key OPERATOR(pg_catalog.=) $4)" +
	" AND NOT EXISTS (SELECT FROM fencelock.runs r" +
	" WHERE r.resource OPERATOR(pg_catalog.=) $1 AND r.run_key OPERATOR(pg_catalog.=) $5 AND r.finished)" +
	" THEN pg_catalog.set_config('fencelock.claim', $6, true)" +
	" ELSE fencelock.open($1, $2, $3, CASE WHEN $4 OPERATOR(pg_catalog.=) '' THEN NULL ELSE $4 END," +
	" CASE WHEN $5 OPERATOR(pg_catalog.=) '' THEN NULL ELSE $5 END)::pg_catalog.text END"

// OpenCheckPlain is OpenCheck for a write without a key or a run (the
// same parameters; $4 and $5 are not read): the fence row only, since
// each subquery costs its executor start-up whether it runs or not.
const OpenCheckPlain = "CASE WHEN (SELECT f.token OPERATOR(pg_catalog.=) $2 AND f.holder OPERATOR(pg_catalog.=) $3" +
	" FROM fencelock.fence f WHERE f.resource OPERATOR(pg_catalog.=) $1)" +
	" AND $4::pg_catalog.text IS NOT NULL AND $5::pg_catalog.text IS NOT NULL" +
	" THEN pg_catalog.set_config('fencelock.claim', $6, true)" +
	" ELSE fencelock.open($1, $2, $3, NULL, NULL)::pg_catalog.text END"

// ClaimText appends to b the value of the setting fencelock.claim for a
// claim, as the migrations' functions write it:
// '<token>:<length of resource in characters>:<resource><holder>'.
func ClaimText(b, resource, token, holder []byte) []byte {
	b = append(b, token...)
	b = append(b, ':')
	b = strconv.AppendInt(b, int64(utf8.RuneCount(resource)), 10)
	b = append(b, ':')
	b = append(b, resource...)
	return append(b, holder...)
}
