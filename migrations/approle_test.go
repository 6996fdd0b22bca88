package migrations_test

import (
	"errors"
	neturl "net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every instance runs Up at start-up, as an application role (USAGE and
// EXECUTE only, no privilege on the version table, not the schema's
// owner): with the schema current, Up does nothing and succeeds; with a
// migration pending, Up changes nothing and fails with one error naming
// the role, the versions and the owner (once), whose fix, the URL the
// application connects with (pgx's driver shows it) as the owner,
// migrates the database as written.
func TestUpAsApplicationRole(t *testing.T) {
	tdb := testenv.NewDB(t)
	owner := openDB(t, tdb.URL)
	ctx := ctxT(t)
	require.NoError(t, migrations.Up(ctx, owner))
	role, appURL := newAppRole(t, owner, tdb.URL)
	app := openDB(t, appURL)
	var readable bool
	require.NoError(t, app.QueryRowContext(ctx, `SELECT has_table_privilege($1, 'SELECT')`, migrations.VersionTable).Scan(&readable))
	require.False(t, readable, "the application role cannot read %s", migrations.VersionTable)

	require.NoError(t, migrations.Up(ctx, app), "the schema is current")
	require.NoError(t, migrations.Up(ctx, app), "and again")

	last := lastVersion(t)
	_, err := gooseProvider(t, owner, migrations.FS()).DownTo(ctx, last-1)
	require.NoError(t, err)
	err = migrations.Up(ctx, app)
	require.ErrorIs(t, err, migrations.ErrNotOwner)
	var nerr *migrations.NotOwnerError
	require.True(t, errors.As(err, &nerr), "%T", err)
	assert.Equal(t, last-1, nerr.Version)
	assert.Equal(t, last, nerr.Last)
	assert.Equal(t, "postgres", nerr.Owner)
	msg := err.Error()
	t.Log(msg)
	assert.NotContains(t, msg, "\n")
	assert.Regexp(t, `^migrations: up: role "`+regexp.QuoteMeta(role[1:len(role)-1])+`" cannot migrate schema fencelock \(version `+strconv.FormatInt(last-1, 10)+` of `+strconv.FormatInt(last, 10)+` installed\): only its owner, role "postgres", may: `, msg)
	assert.Equal(t, allVersions(t)[:last-1], recorded(t, owner), "nothing applied")

	assert.Equal(t, 1, strings.Count(msg, `"postgres"`), "the owner is named once: %s", msg)
	m := regexp.MustCompile(`: run migrations.Up\(ctx, db\) on a connection as the owner, or: fencectl migrate up --db '([^']+)' \(with the owner's password in place of xxxxx\)$`).FindStringSubmatch(msg)
	require.Len(t, m, 2, msg)
	fixURL, err := neturl.Parse(m[1])
	require.NoError(t, err)
	assert.Equal(t, "postgres", fixURL.User.Username(), "the owner migrates")
	assert.Equal(t, tdb.Server.Addr, fixURL.Host, "where the application's connection goes, as pgx's driver says")
	require.NoError(t, migrations.Up(ctx, openDB(t, m[1])), "the fix: %s", m[1])
	assert.Equal(t, allVersions(t), recorded(t, owner))
	require.NoError(t, migrations.Up(ctx, app))
}
