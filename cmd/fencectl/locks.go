package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencelock/fencelock/fence"
)

func (a *app) locksCmd() *cobra.Command {
	inspect := &cobra.Command{
		Use:   "inspect NAME...",
		Short: "Show each lock's holder, token, TTL and token counter",
		Long: `Show each lock's holder, token, remaining TTL and token counter, read from
Redis without changing anything. On a Redis Cluster each name is read from
the master that owns it.`,
		Example: "  fencectl locks inspect stock-sync:eu --redis 127.0.0.1:6379\n  fencectl locks inspect stock-sync:eu -o json",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := needNames("lock NAME", args); err != nil {
				return err
			}
			if err := a.checkOutput(); err != nil {
				return err
			}
			rc, locks, err := a.openLocks(cmd.Context())
			if err != nil {
				return err
			}
			defer closeLocks(rc, locks)
			var infos []lockJSON
			for _, n := range args {
				info, err := locks.Inspect(cmd.Context(), n)
				if err != nil {
					return rc.explain(err)
				}
				infos = append(infos, toLockJSON(info))
			}
			return a.printLocks(infos)
		},
	}
	a.redisFlag(inspect)
	a.outputFlag(inspect)

	var force, yes bool
	release := &cobra.Command{
		Use:   "release NAME --force",
		Short: "Delete a lock whoever holds it (prints the holder, asks unless --yes)",
		Long: `Delete a lock whoever holds it, and wake its waiters. For a holder that is
gone for good (a crashed host whose lease is long, a fixed lease without a
watchdog). The holder, if it still runs, learns of the loss at its next
renewal (its context is cancelled); until then it believes it holds the
lock, and only guard (the database) stops its writes. Hence --force, and a
confirmation unless --yes. The lock is deleted only if it still has the
holder and token shown.`,
		Example: "  fencectl locks release stock-sync:eu --force\n  fencectl locks release stock-sync:eu --force --yes",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := needNames("lock NAME", args); err != nil {
				return err
			}
			if !force {
				return usageErrorf("release deletes a lock someone may still hold (only guard stops its writes then): add --force")
			}
			rc, locks, err := a.openLocks(cmd.Context())
			if err != nil {
				return err
			}
			defer closeLocks(rc, locks)
			return rc.explain(a.release(cmd.Context(), locks, args[0], yes))
		},
	}
	a.redisFlag(release)
	release.Flags().BoolVar(&force, "force", false, "required: release a lock held by someone else")
	release.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return group("locks", "List, inspect or force-release locks in Redis", a.locksListCmd(), inspect, release)
}

func (a *app) openLocks(ctx context.Context) (*redisConn, *fence.Client, error) {
	rc, err := openRedis(ctx, a.redisSrc(), a.sentinelMaster, a.prefix, a.timeout)
	if err != nil {
		return nil, nil, err
	}
	locks, err := rc.locks()
	if err != nil {
		_ = rc.Close()
		return nil, nil, err
	}
	return rc, locks, nil
}

func closeLocks(rc *redisConn, locks *fence.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = locks.Close(ctx)
	_ = rc.Close()
}

type lockJSON struct {
	Name    string `json:"name"`
	Held    bool   `json:"held"`
	Holder  string `json:"holder,omitempty"`
	Token   int64  `json:"token,omitempty"`
	TTLMs   int64  `json:"ttl_ms,omitempty"`
	Counter int64  `json:"counter"`
}

func toLockJSON(i fence.LockInfo) lockJSON {
	j := lockJSON{Name: i.Name, Held: i.Held, Counter: i.Counter}
	if i.Held {
		j.Holder, j.Token, j.TTLMs = i.Holder, i.Token, i.TTL.Milliseconds()
	}
	return j
}

func (a *app) printLocks(infos []lockJSON) error {
	if a.json() {
		return a.printJSON(infos)
	}
	var rows [][]string
	for _, i := range infos {
		holder, token, ttl := "-", "-", "-"
		if i.Held {
			holder, token = i.Holder, fmt.Sprint(i.Token)
			ttl = "no expiry"
			if i.TTLMs >= 0 {
				ttl = (time.Duration(i.TTLMs) * time.Millisecond).String()
			}
		}
		rows = append(rows, []string{i.Name, fmt.Sprint(i.Held), holder, token, ttl, fmt.Sprint(i.Counter)})
	}
	return a.table([]string{"NAME", "HELD", "HOLDER", "TOKEN", "TTL", "COUNTER"}, rows)
}

func (a *app) release(ctx context.Context, locks *fence.Client, name string, yes bool) error {
	info, err := locks.Inspect(ctx, name)
	if err != nil {
		return err
	}
	if !info.Held {
		fmt.Fprintf(a.stdout, "%s is not held: nothing to release\n", name)
		return nil
	}
	fmt.Fprintf(a.stdout, "%s is held by %s with token %d, %v left\n", name, info.Holder, info.Token, info.TTL.Round(time.Millisecond))
	if !yes {
		if err := a.confirm("Release it? The holder keeps running until it notices; only guard stops its writes."); err != nil {
			return err
		}
	}
	woken, err := locks.ForceRelease(ctx, info)
	if errors.Is(err, fence.ErrNotHeld) {
		return fmt.Errorf("release %s: the lock changed since it was shown (released, expired or taken again): nothing deleted; inspect it again", name)
	}
	if err != nil {
		return err
	}
	msg := "waiters were woken"
	if !woken {
		msg = "waiters were not told (this user may not PUBLISH): the next one takes it at its next heartbeat"
	}
	fmt.Fprintf(a.stdout, "released %s (was held by %s, token %d); %s\n", name, info.Holder, info.Token, msg)
	return nil
}

// confirm asks question with [y/N] on stdout and reads the answer from
// stdin: anything but y or yes (an empty line, end of input) is no, and
// returns errAborted.
func (a *app) confirm(question string) error {
	fmt.Fprintf(a.stdout, "%s [y/N] ", question)
	line, err := bufio.NewReader(a.stdin).ReadString('\n')
	fmt.Fprintln(a.stdout)
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	case "":
		if err != nil {
			// No terminal (a script, cron, a pipe): say how to answer there.
			return fmt.Errorf("%w: stdin ended without an answer; to go ahead without asking, add --yes", errAborted)
		}
	}
	return errAborted
}
