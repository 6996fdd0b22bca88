package testenv_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/testenv"
)

// A password user logs in with its password only (NewPasswordUser itself
// fails the test when a wrong one is accepted); other roles stay trusted.
func TestPasswordUser(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	db := testenv.NewDB(t)
	user, u := db.NewPasswordUser(t, "pa:ss@word")
	c, err := pgx.Connect(ctx, u)
	require.NoError(t, err)
	defer c.Close(ctx)
	var who string
	require.NoError(t, c.QueryRow(ctx, `SELECT current_user`).Scan(&who))
	assert.Equal(t, user, who)
	// Without a password the server asks for one; the test's pool (trusted
	// postgres role) works as before.
	_, err = pgx.Connect(ctx, "postgres://"+user+"@"+db.Server.Addr+"/"+db.Name+"?sslmode=disable")
	require.ErrorContains(t, err, "28P01")
	require.NoError(t, db.Pool.Ping(ctx))
}
