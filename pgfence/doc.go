// Package pgfence is the Postgres (pgx v5) backend of guard, with table
// protection triggers and resumable runs.
package pgfence
