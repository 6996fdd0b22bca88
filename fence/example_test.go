package fence_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// exampleRedis starts a throwaway Redis for an example; real code has its
// own address.
func exampleRedis() (*testenv.Redis, *redis.Client) {
	srv, err := testenv.StartRedis()
	if err != nil {
		log.Fatal(err)
	}
	return srv, redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
}

// Acquire a lock, do the work with its context and fencing token, release.
func Example() {
	srv, rdb := exampleRedis()
	defer srv.Stop()
	defer rdb.Close()
	ctx := context.Background()

	locks, err := fence.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close(ctx)

	lock, err := locks.Acquire(ctx, "stock-sync:warehouse-7")
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Release(ctx)

	// Do the work under lock.Context(), and pass lock.Token() with every
	// write so that the storage can reject a stale holder.
	fmt.Println("holding", lock.Name(), "token > 0:", lock.Token() > 0)

	// A second worker does not get it while we hold it.
	_, err = locks.TryAcquire(ctx, "stock-sync:warehouse-7")
	fmt.Println("second worker:", errors.Is(err, fence.ErrNotAcquired))
	// Output:
	// holding stock-sync:warehouse-7 token > 0: true
	// second worker: true
}

// Do acquires, runs the function with a context that ends if the lock is
// lost, and releases.
func ExampleClient_Do() {
	srv, rdb := exampleRedis()
	defer srv.Stop()
	defer rdb.Close()
	ctx := context.Background()

	locks, err := fence.New(rdb, fence.WithLease(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close(ctx)

	var last int64
	for range 3 {
		err := locks.Do(ctx, "nightly-report", func(ctx context.Context, l *fence.Lock) error {
			fmt.Println("token increased:", l.Token() > last)
			last = l.Token()
			return nil
		}, fence.WithWaitLimit(30*time.Second))
		if err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// token increased: true
	// token increased: true
	// token increased: true
}

// Watch for loss: the lock's context is cancelled the moment the lock is
// lost, and Err says why. Here someone deletes the key by hand; a paused
// Redis or a partition is signalled the same way, by the local deadline.
func ExampleLock_Context() {
	srv, rdb := exampleRedis()
	defer srv.Stop()
	defer rdb.Close()
	ctx := context.Background()

	locks, err := fence.New(rdb, fence.WithLease(300*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close(ctx)

	lock, err := locks.Acquire(ctx, "import")
	if err != nil {
		log.Fatal(err)
	}
	rdb.Del(ctx, "fence:{import}") // the lock vanishes (FLUSHALL, failover, operator)

	select {
	case <-lock.Done():
		var lost *fence.LostError
		fmt.Println("lost:", errors.Is(lock.Err(), fence.ErrLockLost), errors.As(lock.Err(), &lost) && lost.Reason == fence.ReasonGone)
	case <-time.After(10 * time.Second):
		fmt.Println("still held")
	}
	fmt.Println("release:", errors.Is(lock.Release(ctx), fence.ErrNotHeld))
	// Output:
	// lost: true true
	// release: true
}

// syncStock stands for the protected work: it writes with the token, so
// that the database can reject a stale holder (see package guard).
func syncStock(ctx context.Context, token int64) error { return ctx.Err() }

// docs/locks.md's example: acquire, work under the lock's context with its
// token, and say why if the lock was lost.
func ExampleClient_Acquire() {
	srv, rdb := exampleRedis()
	defer srv.Stop()
	defer rdb.Close()
	ctx := context.Background()

	run := func() error {
		locks, err := fence.New(rdb) // default lease 9 s, renewed every 3 s
		if err != nil {
			return err
		}
		defer locks.Close(ctx)

		lock, err := locks.Acquire(ctx, "stock-sync:warehouse-7")
		if err != nil {
			return err // matches fence.ErrNotAcquired when ctx or the wait limit ends first
		}
		defer lock.Release(ctx)

		token := lock.Token()                                    // strictly increasing per name: pass it with every write
		if err := syncStock(lock.Context(), token); err != nil { // lock.Context() ends the moment the lock is lost
			return err
		}
		if err := lock.Err(); err != nil {
			return err // a *fence.LostError (errors.Is fence.ErrLockLost) that says why, or fence.ErrMaxHold
		}
		return nil
	}
	fmt.Println("synced:", run() == nil)
	// Output:
	// synced: true
}

// A worker that restarts with the same holder id gets its lock back at
// once, with the same token, instead of waiting out its old lease.
func ExampleWithHolder() {
	srv, rdb := exampleRedis()
	defer srv.Stop()
	defer rdb.Close()
	ctx := context.Background()

	before, _ := fence.New(rdb)
	first, err := before.Acquire(ctx, "import", fence.WithHolder("host-7/importer"))
	if err != nil {
		log.Fatal(err)
	}
	// ... the process dies here without releasing; its successor:
	after, _ := fence.New(rdb, fence.WithHolder("host-7/importer"))
	defer after.Close(ctx)
	again, err := after.TryAcquire(ctx, "import")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("same token:", again.Token() == first.Token())
	_ = again.Release(ctx)
	_ = before.Close(ctx) // here only: the first client's lock is gone already
	// Output:
	// same token: true
}

// An observer implements only the events it wants.
type lossLogger struct{ done chan struct{} }

func (o lossLogger) OnLoss(_ context.Context, e fence.LossEvent) {
	var lost *fence.LostError
	if errors.As(e.Err, &lost) {
		fmt.Println("lost", e.Name, "reason:", lost.Reason, "taken by:", lost.TakenBy)
	}
	close(o.done)
}

func ExampleWithObserver() {
	srv, rdb := exampleRedis()
	defer srv.Stop()
	defer rdb.Close()
	ctx := context.Background()

	obs := lossLogger{done: make(chan struct{})}
	locks, err := fence.New(rdb, fence.WithObserver(obs), fence.WithLease(300*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close(ctx)
	lock, err := locks.Acquire(ctx, "report")
	if err != nil {
		log.Fatal(err)
	}
	rdb.Set(ctx, "fence:{report}", "1:someone-else", time.Minute) // the lock is taken from us
	<-lock.Done()
	<-obs.done
	// Output:
	// lost report reason: taken taken by: someone-else
}
