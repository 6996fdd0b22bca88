package main

import "github.com/spf13/cobra"

func (a *app) keysCmd() *cobra.Command {
	prune := a.pruneCmd("keys", "applied idempotency keys",
		`Delete applied idempotency keys (guard.WithKey) recorded longer ago than
--older-than. A batch retried after its key is pruned is applied again:
keep the age well above the longest time a retry can come (queues,
redeliveries, cron catch-up). Tokens are never pruned.`,
		`DELETE FROM fencelock.applied WHERE applied_at < now() - $1 * interval '1 microsecond' AND ($2 = '' OR resource = $2)`,
		`SELECT count(*) FROM fencelock.applied WHERE applied_at < now() - $1 * interval '1 microsecond' AND ($2 = '' OR resource = $2)`)
	return group("keys", "Prune applied idempotency keys (fencelock.applied)", prune)
}
