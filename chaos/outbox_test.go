package chaos

import (
	"context"
	"testing"
	"time"
)

// TestOutboxRelayKills is the short version of make chaos's relay trials:
// two relay processes, one SIGKILLed three times while a writer records
// effects; no effect is lost, none is applied twice at the fenced
// receiver, the unfenced one sees at most a batch of duplicates per kill,
// and no effect is sent again before its claim could have expired.
func TestOutboxRelayKills(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := RunOutbox(ctx, OutboxConfig{Trials: 1, Seed: *flagSeed, Effects: 200, Kills: 3, RelayCommand: SelfCommand})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", *rep)
	if rep.Failed() {
		t.Errorf("the outbox broke its promise: %+v", *rep)
	}
	if rep.Kills != 3 || rep.Effects != 200 {
		t.Errorf("the trial did not run as configured: %+v", *rep)
	}
}
