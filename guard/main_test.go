package guard_test

import (
	"testing"

	"github.com/fencelock/fencelock/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
