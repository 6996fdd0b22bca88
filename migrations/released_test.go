package migrations_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"testing"

	"github.com/fencelock/fencelock/migrations"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// released are the SHA-256 of every migration that has landed on main. A
// database may have applied any of them, and goose never applies a version
// twice, so an edit would reach new databases only: the others keep the
// old body under the same version.
var released = map[string]string{
	"00001_tables.sql":         "0f88f2c368110066832cfe350e334828523bd06340f2d40de70170cff9ef52fe",
	"00002_functions.sql":      "570b5a6546583a3b3c4103aaf99a043d2469f656f218d811a6c43919e0d8f41c",
	"00003_outbox.sql":         "5050144833b87087393c2de497eebc0c9c5bce3324a2540c28564fbe3c473e06",
	"00004_fence_lock.sql":     "11d357c75984e1c749401da895e408042dd7dd9f0f45d02deb4b90a1e0e731a2",
	"00005_outbox_bounded.sql": "54ccf741efb8a7497983a9062be69733a14f3f97e97dec551572f2efb629de73",
}

// testdata/88937a5 holds 00001 and 00002 as that landing released them
// (git show 88937a5:migrations/<file>), before they were edited in place:
// the state upgrade_test.go starts from.
var released88937a5 = map[string]string{
	"00001_tables.sql":    "a4ea89c1b95e0ad9c5b9414cb77a56a2dc5eafa0621e39860b7967824d0bf91c",
	"00002_functions.sql": "b78a7e6ea1def963c51e9e8a5ebb212340453e0999aeac87d1f5c74f21a4f9ed",
}

func sha256Hex(t *testing.T, fsys fs.FS, name string) string {
	t.Helper()
	b, err := fs.ReadFile(fsys, name)
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// A released migration never changes, and every migration is pinned here
// when it lands: a change is a new migration that repeats each changed
// function whole, and whose Down restores what it replaced.
func TestReleasedMigrationsUnchanged(t *testing.T) {
	files, err := fs.Glob(migrations.FS(), "*.sql")
	require.NoError(t, err)
	for _, f := range files {
		sum := sha256Hex(t, migrations.FS(), f)
		want, ok := released[f]
		if !ok {
			t.Errorf("migrations/%s is not pinned: a migration is released when it lands; add %q: %q to released in released_test.go in the commit that lands it", f, f, sum)
			continue
		}
		assert.Equal(t, want, sum, "migrations/%s has changed since it was released, and databases have applied it: restore it (git checkout main -- migrations/%s) "+
			"and put the change in a new migration (%05d_<what>.sql) that repeats each changed function whole and whose Down restores what it replaced",
			f, f, lastVersion(t)+1)
	}
	for f := range released {
		assert.Contains(t, files, f, "a released migration is never removed")
	}
	for f, want := range released88937a5 {
		assert.Equal(t, want, sha256Hex(t, os.DirFS("testdata/88937a5"), f), fmt.Sprintf("testdata/88937a5/%s is the released file: git show 88937a5:migrations/%s", f, f))
	}
}
