package testenv

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A machine without the servers gets an error that names what to install.
func TestMissingBinariesNameThePackage(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	oldRedis, oldPG := redisPaths, postgresGlob
	redisPaths, postgresGlob = []string{"/nonexistent/redis-server"}, "/nonexistent/*/bin"
	t.Cleanup(func() { redisPaths, postgresGlob = oldRedis, oldPG })

	_, err := RedisBinary()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "apt-get install redis-server")
	_, err = StartRedis()
	require.Error(t, err, "StartRedis must fail, not skip")

	_, err = PostgresBinDir()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "postgresql-15")
	_, err = StartPostgres()
	require.Error(t, err)
}

func TestMissingPgBouncerNamesThePackage(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	old := pgbouncerPaths
	pgbouncerPaths = []string{"/nonexistent/pgbouncer"}
	t.Cleanup(func() { pgbouncerPaths = old })

	_, err := PgBouncerBinary()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "apt-get install pgbouncer")
	_, err = StartPgBouncer(&Postgres{Addr: "127.0.0.1:1"}, 0)
	require.Error(t, err, "StartPgBouncer must fail, not skip")
	assert.Contains(t, err.Error(), "apt-get install pgbouncer")
}
