//go:build race

package fence_test

// raceSlack is how many more allocations per acquire+release the race
// detector's build makes than allocsPinned says (see allocs_test.go):
// one, measured with go-redis v9.23.
const raceSlack = 1
