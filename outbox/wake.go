package outbox

import "sync"

// The relays running in this process, woken when a transaction that added
// effects commits.
var running struct {
	sync.Mutex
	relays map[*Relay]struct{}
}

func register(r *Relay) {
	running.Lock()
	defer running.Unlock()
	if running.relays == nil {
		running.relays = map[*Relay]struct{}{}
	}
	running.relays[r] = struct{}{}
}

func unregister(r *Relay) {
	running.Lock()
	defer running.Unlock()
	delete(running.relays, r)
}

// wakeAll wakes every running relay of the process: one claim each, which
// finds nothing if the effects are another database's.
func wakeAll() {
	running.Lock()
	defer running.Unlock()
	for r := range running.relays {
		r.Wake()
	}
}
