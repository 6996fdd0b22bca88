// Package testenv starts real, throwaway Redis and Postgres servers for tests
// and for the demo, and injects real faults into them.
//
// Servers are started from the binaries on the machine (redis-server, and
// Postgres initdb/postgres from /usr/lib/postgresql/<v>/bin or
// pg_config --bindir) on free 127.0.0.1 ports, in temporary directories, and
// stopped when the test or the demo ends. A missing binary is an error that
// names the Debian package to install; nothing skips.
//
// Faults:
//   - [Redis.Pause] / [Redis.Resume] (SIGSTOP / SIGCONT), [Redis.Restart]
//     with or without its data, [Redis.Flush], [Redis.Kill];
//   - [Postgres.Restart];
//   - [Proxy], a TCP proxy between client and server that can
//     [Proxy.Cut], [Proxy.Blackhole] or [Proxy.Delay] the connection and
//     [Proxy.Restore] it.
//
// When FENCE_TEST_REDIS_URL or FENCE_TEST_DATABASE_URL are set, [NewRedis]
// and [NewDB] use those servers instead (a unique key prefix or a fresh
// database per test). Tests that inject faults into a server always start a
// private one ([NewRedisServer], [StartPostgres]).
//
// testenv imports no package of the library, so the library's own tests can
// use it without cycles.
package testenv
