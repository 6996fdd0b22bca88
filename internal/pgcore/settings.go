package pgcore

import "github.com/fencelock/fencelock/pgstore"

// Settings is what a Store's options set, the same for both stores
// (package pgstore's Option and With… functions).
type Settings = pgstore.Settings

// Core and Run are what pgstore's interfaces describe.
var (
	_ pgstore.Core     = (*Core)(nil)
	_ pgstore.Run[any] = Run[any]{}
)
