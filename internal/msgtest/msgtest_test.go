package msgtest

import "testing"

// A layer prefix counts where it starts a word: sqlfence's and pgfence's
// prefixes end in fence's, and a message with one of each (a lease lost
// while sqlfence began its transaction) names the fence layer once.
func TestCountLayer(t *testing.T) {
	for _, c := range []struct {
		msg, p string
		want   int
	}{
		{`guard: lease lost (fence: lock lost: "x": its fixed lease ran out); sqlfence: begin`, "fence: ", 1},
		{`guard: lease lost (fence: lock lost); sqlfence: begin`, "sqlfence: ", 1},
		{`fence: a; fence: b`, "fence: ", 2},
		{`pgfence: a (fence: b) pgfence: c`, "pgfence: ", 2},
		{`pgfence: a`, "fence: ", 0},
		{``, "fence: ", 0},
	} {
		if got := countLayer(c.msg, c.p); got != c.want {
			t.Errorf("countLayer(%q, %q) = %d, want %d", c.msg, c.p, got, c.want)
		}
	}
}
