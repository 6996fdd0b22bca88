package migrations_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A wrong password (a real password login, sslmode=prefer as a URL without
// sslmode has it): Up, Down and Status say so in one line, the server's
// answer first and once, without the TLS attempt pgx made before it; the
// server's error is still there for errors.As.
func TestConnectErrorOneLine(t *testing.T) {
	tdb := testenv.NewDB(t)
	_, url := tdb.NewPasswordUser(t, "right-password")
	url = strings.Replace(url, "right-password", "wrong-password", 1)
	url = strings.Replace(url, "sslmode=disable", "sslmode=prefer", 1)
	db := openDB(t, url)
	ctx := ctxT(t)
	_, statusErr := migrations.Status(ctx, db)
	for op, err := range map[string]error{
		"up":     migrations.Up(ctx, db),
		"down":   migrations.Down(ctx, db),
		"status": statusErr,
	} {
		require.Error(t, err, op)
		msg := err.Error()
		t.Logf("%s: %s", op, msg)
		assert.NotContains(t, msg, "\n", op)
		assert.NotContains(t, msg, "tls", op)
		assert.True(t, strings.HasPrefix(msg, "migrations: "+op+": "), msg)
		assert.Equal(t, 1, strings.Count(msg, "password authentication failed"), msg)
		assert.Less(t, strings.Index(msg, "password authentication failed"), strings.Index(msg, "from Postgres at"), msg)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), op)
		assert.Equal(t, "28P01", pgErr.Code)
	}

	// Nothing listens: the refusal once, with the address.
	addr := testenv.RefusedAddr(t)
	err := migrations.Up(ctx, openDB(t, "postgres://app@"+addr+"/app?sslmode=prefer&connect_timeout=5"))
	require.Error(t, err)
	t.Log(err)
	assert.NotContains(t, err.Error(), "\n")
	assert.Equal(t, 1, strings.Count(err.Error(), "connection refused"), err.Error())
	assert.Contains(t, err.Error(), "migrations: up: cannot reach Postgres at "+addr)
}
