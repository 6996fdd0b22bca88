package guard

import "context"

// txnKey is the context key under which Exec hands fn its open
// transaction: one key per transaction type, so that a lookup is typed at
// compile time and an Exec over another store's Tx is never found.
type txnKey[Tx any] struct{}

// OpenTxn returns the transaction of the Exec (or store Run's Step) whose fn
// received ctx, or a context derived from it: the seam through which code
// that fn calls reaches the transaction's store-side state without a
// registry (package outbox finds the commit queue of a *sql.Tx this way).
// ok is false for a context that no Exec gave fn. After that Exec has
// returned, the Txn is still returned, ended: a store refuses to queue on
// it.
func OpenTxn[Tx any](ctx context.Context) (txn Txn[Tx], ok bool) {
	txn, ok = ctx.Value(txnKey[Tx]{}).(Txn[Tx])
	return txn, ok
}

// withTxn is ctx carrying txn for OpenTxn.
func withTxn[Tx any](ctx context.Context, txn Txn[Tx]) context.Context {
	return context.WithValue(ctx, txnKey[Tx]{}, txn)
}
