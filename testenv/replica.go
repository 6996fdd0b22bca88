package testenv

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// MissWrites makes replica r miss the writes master accepts from now on: r
// is frozen (SIGSTOP) and its replication link on master is dropped (CLIENT
// KILL of that one connection). Writes to master after MissWrites returns are
// in no socket buffer of r's; if master dies before r.Resume, a failover to r
// loses them, as when a master dies before its replica got the last writes.
// If master lives, r.Resume lets r reconnect and catch up (partial resync).
//
// Freezing the replica is what keeps it from reconnecting at once; freezing
// alone would not do, since the kernel still buffers what the master sends.
func (r *Redis) MissWrites(ctx context.Context, master *Redis) error {
	if r.external || master.external {
		return ErrExternal
	}
	// The replica's end of its link: the master sees that address.
	links, err := r.adminClient().ClientList(ctx).Result()
	if err != nil {
		return fmt.Errorf("testenv: CLIENT LIST on replica %s: %w", r.Addr, err)
	}
	laddr := ""
	for _, line := range strings.Split(links, "\n") {
		f := clientFields(line)
		if strings.Contains(f["flags"], "M") && f["addr"] == master.Addr {
			laddr = f["laddr"]
		}
	}
	if laddr == "" {
		return fmt.Errorf("testenv: %s has no replication link to %s", r.Addr, master.Addr)
	}
	if err := r.Pause(); err != nil {
		return err
	}
	if err := master.adminClient().Do(ctx, "CLIENT", "KILL", "ADDR", laddr).Err(); err != nil {
		return fmt.Errorf("testenv: CLIENT KILL ADDR %s on master %s: %w", laddr, master.Addr, err)
	}
	// The master must have let go of the replica before any write the
	// caller means to lose.
	want := "port=" + strconv.Itoa(r.port) + ","
	for {
		info, err := master.adminClient().Info(ctx, "replication").Result()
		if err == nil && !strings.Contains(info, want) {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("testenv: master %s still lists replica %s", master.Addr, r.Addr), ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// clientFields splits one CLIENT LIST line into its key=value fields.
func clientFields(line string) map[string]string {
	m := map[string]string{}
	for _, kv := range strings.Fields(line) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// infoField returns one field of an INFO answer ("" when absent).
func infoField(info, key string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+":"); ok {
			return v
		}
	}
	return ""
}

// replicaSynced reports whether r is a replica whose link to its master is
// up and not in a full sync.
func (r *Redis) replicaSynced(ctx context.Context) bool {
	info, err := r.adminClient().Info(ctx, "replication").Result()
	return err == nil && infoField(info, "role") == "slave" &&
		infoField(info, "master_link_status") == "up" &&
		infoField(info, "master_sync_in_progress") == "0"
}

// role returns "master" or "slave" as the server itself reports it.
func (r *Redis) role(ctx context.Context) (string, error) {
	info, err := r.adminClient().Info(ctx, "replication").Result()
	if err != nil {
		return "", err
	}
	return infoField(info, "role"), nil
}

// poll calls cond every interval until it returns true or ctx ends; the
// error then names what was awaited and the last reason cond gave.
func poll(ctx context.Context, what string, cond func() (bool, string)) error {
	last := ""
	for {
		ok, why := cond()
		if ok {
			return nil
		}
		if why != "" {
			last = why
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("testenv: waiting for %s: %s", what, last), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
