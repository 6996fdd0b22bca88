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
		fmt.Println("lost:", lock.Err())
	case <-time.After(10 * time.Second):
		fmt.Println("still held")
	}
	fmt.Println("release:", errors.Is(lock.Release(ctx), fence.ErrNotHeld))
	// Output:
	// lost: fence: lock lost
	// release: true
}
