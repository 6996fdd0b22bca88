package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/fencelock/fencelock/fence"
)

// The elections, as lockers: Acquire campaigns (its term is the held
// lock), Release resigns, so that the handover scenarios time them as
// they time the locks.

const (
	// electionName names fence's Election in the results.
	electionName = "fence election"
	// etcdElectionName names etcd's concurrency.Election.
	etcdElectionName = "etcd election"
	// etcdElectionPrefix is where the bench's etcd elections live.
	etcdElectionPrefix = "/fencelock-bench-election/"
	// campaignValue is every candidate's value: a leader's address, say.
	campaignValue = "10.0.0.7:8080"
)

// electionLocker is fence's Election on a client of its own, at its
// defaults (term lease fence.DefaultTermLease).
type electionLocker struct{ *fenceLocker }

func newElectionLocker(addr string, opts ...fence.ClientOption) (*electionLocker, error) {
	f, err := newFenceLocker(addr, opts...)
	if err != nil {
		return nil, err
	}
	return &electionLocker{f}, nil
}

func (l *electionLocker) Name() string { return electionName }

func (l *electionLocker) Acquire(ctx context.Context, key string) (held, error) {
	e, err := l.c.Election(key)
	if err != nil {
		return nil, err
	}
	term, err := e.Campaign(ctx, campaignValue)
	if err != nil {
		return nil, err
	}
	return term, nil
}

// etcdElectionLocker is etcd's concurrency.Election as its documentation
// shows: one client per process, a session (default TTL 60 s) per
// concurrent candidate, Campaign to lead and Resign to step down.
type etcdElectionLocker struct {
	cli *clientv3.Client

	mu   sync.Mutex
	idle []*concurrency.Session
	all  []*concurrency.Session
}

func newEtcdElectionLocker(endpoint string) (*etcdElectionLocker, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", endpoint, err)
	}
	return &etcdElectionLocker{cli: cli}, nil
}

func (l *etcdElectionLocker) Name() string      { return etcdElectionName }
func (l *etcdElectionLocker) Counter() *counter { return &counter{} } // not Redis: nothing counted

func (l *etcdElectionLocker) session() (*concurrency.Session, error) {
	l.mu.Lock()
	if n := len(l.idle); n > 0 {
		s := l.idle[n-1]
		l.idle = l.idle[:n-1]
		l.mu.Unlock()
		return s, nil
	}
	l.mu.Unlock()
	s, err := concurrency.NewSession(l.cli)
	if err != nil {
		return nil, fmt.Errorf("etcd session: %w", err)
	}
	l.mu.Lock()
	l.all = append(l.all, s)
	l.mu.Unlock()
	return s, nil
}

func (l *etcdElectionLocker) putBack(s *concurrency.Session) {
	l.mu.Lock()
	l.idle = append(l.idle, s)
	l.mu.Unlock()
}

type etcdTerm struct {
	l  *etcdElectionLocker
	s  *concurrency.Session
	el *concurrency.Election
}

func (t etcdTerm) Release(ctx context.Context) error {
	err := t.el.Resign(ctx)
	t.l.putBack(t.s)
	return err
}

func (l *etcdElectionLocker) Acquire(ctx context.Context, key string) (held, error) {
	s, err := l.session()
	if err != nil {
		return nil, err
	}
	el := concurrency.NewElection(s, etcdElectionPrefix+key+"/")
	if err := el.Campaign(ctx, campaignValue); err != nil {
		l.putBack(s)
		return nil, err
	}
	return etcdTerm{l: l, s: s, el: el}, nil
}

func (l *etcdElectionLocker) Close() {
	l.mu.Lock()
	all := l.all
	l.all, l.idle = nil, nil
	l.mu.Unlock()
	for _, s := range all {
		_ = s.Close()
	}
	_ = l.cli.Close()
}

// isEtcd reports an etcd peer: it does not say when it waits, and its
// queue is read from etcd.
func isEtcd(lib string) bool { return lib == etcdName || lib == etcdElectionName }
