package migrations

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/fencelock/fencelock/testenv"
	"github.com/stretchr/testify/require"
)

// What Up adopts is computed from the migration files: after a real Up the
// schema must be exactly the files' final state. This fails when a
// migration changes the schema in a way expectedStates does not read
// (ALTER TABLE, a new kind of object...): teach it, or adoption breaks.
func TestExpectedMatchesInstalled(t *testing.T) {
	tdb := testenv.NewDB(t)
	db, err := sql.Open("pgx", tdb.URL)
	require.NoError(t, err)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, Up(ctx, db))
	p, err := newProvider(db)
	require.NoError(t, err)
	states, err := expectedStates(p.ListSources())
	require.NoError(t, err)
	require.Len(t, states, 2)
	require.Len(t, states[0].objects.tables, 3)
	require.Empty(t, states[0].objects.functions)
	got, exists, err := installedObjects(ctx, db)
	require.NoError(t, err)
	require.True(t, exists)
	require.Equal(t, "", states[1].objects.diff(got))
	require.Equal(t, "resource,run_key,token,cursor,finished,finished_at,updated_at", got.tables["runs"])
}
