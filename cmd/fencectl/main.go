// Command fencectl is the operator CLI of fencelock (migrate, inspect locks
// and tokens, doctor). It is not built yet.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "fencectl: not implemented yet")
	os.Exit(2)
}
