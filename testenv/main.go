package testenv

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Main runs the tests of a package, stops the shared servers, then fails the
// binary if goroutines leaked. Use it as the whole of TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
func Main(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	StopShared()
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
