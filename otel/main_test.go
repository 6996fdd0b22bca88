package fencelockotel_test

import (
	"testing"

	"github.com/fencelock/fencelock/testenv"
)

// TestMain stops the shared Postgres and checks for leaked goroutines.
func TestMain(m *testing.M) { testenv.Main(m) }
