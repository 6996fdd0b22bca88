package fence

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidateName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, want string
	}{
		{"", "empty"},
		{strings.Repeat("x", MaxNameLen+1), "513 bytes"},
		{"a{b", "'{' or '}'"},
		{"a}b", "'{' or '}'"},
		{"{}", "'{' or '}'"},
		{"a\x00b", "contains a control character (U+0000 at byte 1); use printable UTF-8 text"},
		{"line\nbreak", "control character (U+000A at byte 4)"},
		{"del\x7f", "control character (U+007F at byte 3)"},
		{"c1\u0085", "control character (U+0085 at byte 2)"},
		{"\x00\xff", "control character (U+0000 at byte 0)"},
		{"ok\xff", "is not valid UTF-8 (at byte 2)"},
		{"\xed\xa0\x80", "is not valid UTF-8 (at byte 0)"}, // a UTF-16 surrogate
	} {
		err := validateName(tc.name)
		require.ErrorIs(t, err, ErrInvalidName, "%q", tc.name)
		assert.Contains(t, err.Error(), tc.want)
	}
	for _, ok := range []string{"a", "stock-sync:warehouse/7", "ünïcødé", "with space", strings.Repeat("x", MaxNameLen), "\uFFFD", "no\u00a0break"} {
		assert.NoError(t, validateName(ok), "%q", ok)
	}
}

// hashTag is the Redis Cluster rule: the part between the first '{' and
// the first '}' after it, if non-empty; otherwise the whole key.
func hashTag(key string) string {
	s := strings.IndexByte(key, '{')
	if s < 0 {
		return key
	}
	e := strings.IndexByte(key[s+1:], '}')
	if e <= 0 {
		return key
	}
	return key[s+1 : s+1+e]
}

func FuzzName(f *testing.F) {
	for _, s := range []string{"", "a", "job{1}", "}{", "a:b:c", strings.Repeat("z", 600), "\xff\xfe"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := validateName(name)
		bad := name == "" || len(name) > MaxNameLen || strings.ContainsAny(name, "{}") || !utf8.ValidString(name) ||
			strings.ContainsFunc(name, unicode.IsControl)
		if bad != (err != nil) {
			t.Fatalf("validateName(%q) = %v, want bad=%v", name, err, bad)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidName) || !strings.HasPrefix(err.Error(), "fence: ") {
				t.Fatalf("error %v is not a fence ErrInvalidName", err)
			}
			if !utf8.ValidString(err.Error()) {
				t.Fatalf("error message is not valid UTF-8: %q", err.Error())
			}
			return
		}
		k := keysFor(DefaultPrefix, name)
		// All keys of one name share one hash tag: the name itself.
		for _, key := range []string{k.lock, k.seq, k.queue, k.waiters, k.channel} {
			if tag := hashTag(key); tag != name {
				t.Fatalf("key %q has hash tag %q, want %q", key, tag, name)
			}
		}
		all := []string{k.lock, k.seq, k.queue, k.waiters, k.channel}
		slices.Sort(all)
		if len(slices.Compact(all)) != 5 {
			t.Fatalf("keys collide: %+v", k)
		}
		if want := DefaultPrefix + "{" + name + "}"; k.lock != want || k.seq != want+":seq" || k.queue != want+":q" ||
			k.waiters != want+":w" || k.channel != want+":ch" {
			t.Fatalf("keys %+v for %q", k, name)
		}
	})
}
