package pgcore

import "sync"

// CacheCap bounds the cache of advanced claims: one entry per resource,
// so it only fills up in a process that guards many thousands of
// resources; then an arbitrary entry goes, and that resource's next
// transaction sends advance again (correct, one statement dearer).
const CacheCap = 4096

// Cache remembers, per resource, the (token, holder) this Store has
// seen recorded in the fence row: advance committed it, or Advance
// claimed it. A guarded transaction of that same claim skips the advance
// statement at begin. That is safe because the stored token of a resource
// only ever rises: advance with the stored token would only read, and if
// a newer holder has advanced since, open refuses at begin and the
// claim at commit, exactly as after an advance. (Deleting fence rows by
// hand, or restoring the database to a point before the token was stored,
// breaks that premise, as it breaks fencing itself: use a new Store.)
type Cache struct {
	mu sync.Mutex
	m  map[string]claim
}

type claim struct {
	token  int64
	holder string
}

// Has reports whether the claim is known to be stored already.
func (a *Cache) Has(resource string, token int64, holder string) bool {
	a.mu.Lock()
	c, ok := a.m[resource]
	a.mu.Unlock()
	return ok && c.token == token && c.holder == holder
}

// Add records that the claim is stored. A lower token never replaces a
// higher one (a late call of an older lease).
func (a *Cache) Add(resource string, token int64, holder string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c, ok := a.m[resource]; ok {
		if c.token > token {
			return
		}
	} else if len(a.m) >= CacheCap {
		for k := range a.m {
			delete(a.m, k)
			break
		}
	}
	if a.m == nil {
		a.m = make(map[string]claim)
	}
	a.m[resource] = claim{token: token, holder: holder}
}
