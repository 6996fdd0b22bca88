package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// etcdName names etcd's concurrency.Mutex in the results: a peer of the
// fair lock's scenarios (handoff2, fair), never of the Redis ones.
const etcdName = "etcd"

// etcdPrefix is where the bench's mutexes live: a mutex on name n is the
// prefix etcdPrefix + n + "/", one key per session under it.
const etcdPrefix = "/fencelock-bench/"

// etcdLocker is etcd's concurrency.Mutex used as its documentation shows:
// one client per process, a session (a lease kept alive by the client) per
// concurrent locker, a mutex per acquisition. A session's key is its
// lease id under the mutex's prefix, so two goroutines must not share a
// session: Acquire takes an idle one or makes one.
type etcdLocker struct {
	cli *clientv3.Client

	mu   sync.Mutex
	idle []*concurrency.Session
	all  []*concurrency.Session
}

func newEtcdLocker(endpoint string) (*etcdLocker, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", endpoint, err)
	}
	return &etcdLocker{cli: cli}, nil
}

func (l *etcdLocker) Name() string      { return etcdName }
func (l *etcdLocker) Counter() *counter { return &counter{} } // not Redis: nothing counted

func (l *etcdLocker) session() (*concurrency.Session, error) {
	l.mu.Lock()
	if n := len(l.idle); n > 0 {
		s := l.idle[n-1]
		l.idle = l.idle[:n-1]
		l.mu.Unlock()
		return s, nil
	}
	l.mu.Unlock()
	// Default TTL (60 s), kept alive by the client.
	s, err := concurrency.NewSession(l.cli)
	if err != nil {
		return nil, fmt.Errorf("etcd session: %w", err)
	}
	l.mu.Lock()
	l.all = append(l.all, s)
	l.mu.Unlock()
	return s, nil
}

type etcdHeld struct {
	l *etcdLocker
	s *concurrency.Session
	m *concurrency.Mutex
}

func (h etcdHeld) Release(ctx context.Context) error {
	err := h.m.Unlock(ctx)
	h.l.mu.Lock()
	h.l.idle = append(h.l.idle, h.s)
	h.l.mu.Unlock()
	return err
}

func (l *etcdLocker) Acquire(ctx context.Context, key string) (held, error) {
	s, err := l.session()
	if err != nil {
		return nil, err
	}
	m := concurrency.NewMutex(s, etcdPrefix+key+"/")
	if err := m.Lock(ctx); err != nil {
		l.mu.Lock()
		l.idle = append(l.idle, s)
		l.mu.Unlock()
		return nil, err
	}
	return etcdHeld{l: l, s: s, m: m}, nil
}

func (l *etcdLocker) Close() {
	l.mu.Lock()
	all := l.all
	l.all, l.idle = nil, nil
	l.mu.Unlock()
	for _, s := range all {
		_ = s.Close() // revokes the lease: its keys go
	}
	_ = l.cli.Close()
}
