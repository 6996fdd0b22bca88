// Package testenv starts real, throwaway Redis and Postgres servers for tests
// and for the demo, and injects real faults into them.
//
// Servers are started from the binaries on the machine (redis-server, and
// Postgres initdb/postgres from /usr/lib/postgresql/<v>/bin or
// pg_config --bindir) on 127.0.0.1 ports, in temporary directories, and
// stopped when the test or the demo ends. A server's port is reserved for
// the life of the test binary: it lies below the kernel's ephemeral range
// and is locked against every other test binary on the machine, so a
// server a test stopped stays refused ([RefusedAddr] gives such an address
// outright, [ReservePort] a port for a server the test starts itself). A
// missing binary is an error that names the Debian package to install;
// nothing skips.
//
// Topologies besides the single server:
//   - [NewRedisCluster] / [StartRedisCluster]: a Redis Cluster (default 3
//     masters with 1 replica each, node timeout 1 s) with a
//     ready [Cluster.Client]; [SharedRedisCluster] is one per test binary for
//     tests that inject no faults;
//   - [NewSentinel] / [StartSentinel]: a master, its replica and three
//     sentinels (redis-server --sentinel) with a ready failover client
//     ([Sentinel.Client]).
//
// Faults:
//   - [Redis.Pause] / [Redis.Resume] (SIGSTOP / SIGCONT), [Redis.Restart]
//     with or without its data, [Redis.Flush], [Redis.Kill] — on single
//     servers and on every cluster node, replica and sentinel alike;
//   - [Redis.MissWrites]: a replica that misses the master's next writes,
//     so that a failover to it loses them;
//   - [ClusterNode.Failover] (CLUSTER FAILOVER, FORCE or TAKEOVER) and
//     [Cluster.WaitFailover] after a master was paused or killed;
//     [Sentinel.Failover] (SENTINEL FAILOVER) and [Sentinel.WaitFailover];
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
// PgBouncer: [StartPgBouncer] puts a PgBouncer (Debian package pgbouncer)
// in transaction pooling mode in front of a Postgres; [SharedPgBouncer] is
// the one per test binary in front of the shared server, and
// [NewDBViaPgBouncer] gives a test a fresh database with a pool through it
// ([DB.DirectURL] still reaches the server, e.g. for migrations, whose
// session lock a transaction pooler cannot carry).
//
// testenv imports no package of the library, so the library's own tests can
// use it without cycles.
package testenv
