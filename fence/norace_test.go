//go:build !race

package fence_test

// raceSlack is 0 without the race detector: allocsPinned holds exactly.
const raceSlack = 0
