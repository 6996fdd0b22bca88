package fence

import (
	"crypto/rand"
	"encoding/base64"
	"os"
	"strconv"
	"strings"
)

// Default holder ids name the process that holds or waits, so that an
// operator who sees a lock held (fencectl locks list, a waiter's "still
// waiting" line) can find the process behind it: "<host>:<pid>:<random>",
// such as "inventory-sync-7c9d8f6b5-x2x9z:4127:Zp3q0k9Hf1s". The random
// part (64 bits) tells apart the acquisitions of one process and a pid
// that a restarted host reused.
//
// Every waiter stores its id twice in Redis (the queue's entry and its
// hash field), so the id's length is most of what a waiter costs there:
// the host part is capped at maxHostPart bytes (pod names run to 63) so
// that a queued waiter stays under 200 bytes (TestQueueFootprint).
const maxHostPart = 32

// processPart is "<host>:<pid>" of this process, made once.
var processPart = hostPart(hostname()) + ":" + strconv.Itoa(os.Getpid())

func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown-host"
	}
	return h
}

// hostPart is a host name as a holder id carries it: its first label (a
// domain adds no information within one deployment), bytes other than
// letters, digits, '-' and '_' as '_', and a name longer than maxHostPart
// cut in its middle ("~" marks the cut), keeping its start and its end:
// the end is what tells pods of one workload apart.
func hostPart(h string) string {
	if i := strings.IndexByte(h, '.'); i > 0 {
		h = h[:i]
	}
	b := []byte(h)
	for i, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			b[i] = '_'
		}
	}
	if len(b) > maxHostPart {
		head := (maxHostPart - 1) / 2
		tail := maxHostPart - 1 - head
		b = append(append(b[:head:head], '~'), b[len(b)-tail:]...)
	}
	return string(b)
}

// newHolderID is a default holder id: the process part and 64 random
// bits in 11 characters of unpadded base64url (A-Z, a-z, 0-9, '-', '_').
func newHolderID() string {
	return holderID(processPart)
}

func holderID(process string) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go ≥ 1.24)
	var enc [11]byte       // base64.RawURLEncoding.EncodedLen(8)
	base64.RawURLEncoding.Encode(enc[:], b[:])
	// One allocation per acquisition call: the id's own.
	var id strings.Builder
	id.Grow(len(process) + 1 + len(enc))
	id.WriteString(process)
	id.WriteByte(':')
	id.Write(enc[:])
	return id.String()
}
