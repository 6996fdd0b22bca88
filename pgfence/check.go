package pgfence

import (
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
)

// checkClaim rejects bad input before any round trip (internal/pgcore):
// the limits are guard's (guard.MaxResourceLen and the others).
func checkClaim(c guard.Claim) error { return pgcore.CheckClaim(c) }
