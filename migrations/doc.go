// Package migrations holds the goose SQL migrations that install the
// fencelock schema into a target database.
package migrations
