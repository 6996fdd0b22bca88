package main

import (
	"bytes"
	"io"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
)

// Passwords never reach the terminal, and nothing else is masked. Two
// layers keep that promise:
//
//  1. Every address fencectl prints goes through redactAddr, which replaces
//     the password of a URL (or the password= of a keyword DSN) with xxxxx.
//  2. Everything written to stdout and stderr goes through a scrubber that
//     masks the password inside every address it finds in the text: the
//     userinfo of a URL and the password= of a DSN, and a password given in
//     the arguments or the environment ($REDIS_URL, $DATABASE_URL) where it
//     stands in an address the patterns alone would misread (an unescaped
//     '@' in it, say). This catches the addresses quoted by errors wrapped
//     from go-redis, pgx, goose or cobra. Text outside addresses is left
//     as it is: a server's reply that happens to contain the password's
//     letters (WRONGPASS, with the password WRONG) reads as the server said.

const mask = "xxxxx"

// dsnPassword matches password=... in a keyword/value DSN or a URL query.
var dsnPassword = regexp.MustCompile(`(?i)(password=)('(?:[^'\\]|\\.)*'|[^\s&]*)`)

// urlUserinfo matches scheme://user:password@ anywhere in a text.
var urlUserinfo = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s\[\]]*:)([^@\s\[\]]*)@`)

// redactAddr returns s (a URL, a keyword DSN or host:port) with any password
// replaced by xxxxx.
func redactAddr(s string) string {
	if strings.Contains(s, "://") {
		if u, err := url.Parse(s); err == nil {
			if _, has := u.User.Password(); has {
				u.User = url.UserPassword(u.User.Username(), mask)
			}
			q := u.Query()
			if q.Has("password") {
				q.Set("password", mask)
				u.RawQuery = q.Encode()
			}
			// url.URL.String would escape the mask's neighbours differently;
			// the result only has to be readable and free of the secret.
			return u.String()
		}
	}
	s = urlUserinfo.ReplaceAllString(s, "${1}"+mask+"@")
	return dsnPassword.ReplaceAllString(s, "${1}"+mask)
}

// hasPassword reports whether the address itself carries a password (a
// URL's userinfo or password=), whatever the environment adds.
func hasPassword(s string) bool {
	if strings.Contains(s, "://") {
		if u, err := url.Parse(s); err == nil {
			if _, has := u.User.Password(); has {
				return true
			}
			return u.Query().Get("password") != ""
		}
	}
	for _, m := range dsnPassword.FindAllStringSubmatch(s, -1) {
		if strings.Trim(m[2], "'") != "" {
			return true
		}
	}
	return false
}

// secretsOf returns the passwords an argument or environment value carries,
// in each spelling they may be printed in (raw, path-escaped, query-escaped).
func secretsOf(s string) []string {
	var raw []string
	if strings.Contains(s, "://") {
		if u, err := url.Parse(s); err == nil {
			if p, has := u.User.Password(); has {
				raw = append(raw, p)
			}
			if p := u.Query().Get("password"); p != "" {
				raw = append(raw, p)
			}
		}
		// A URL that does not parse may still carry user:password@.
		for _, m := range urlUserinfo.FindAllStringSubmatch(s, -1) {
			raw = append(raw, m[2])
		}
	}
	for _, m := range dsnPassword.FindAllStringSubmatch(s, -1) {
		raw = append(raw, strings.Trim(m[2], "'"))
	}
	if strings.Contains(s, "://") || strings.Contains(s, "=") {
		if cfg, err := pgconn.ParseConfig(s); err == nil && cfg.Password != "" {
			raw = append(raw, cfg.Password)
		}
	}
	var out []string
	for _, p := range raw {
		if p == "" {
			continue
		}
		out = append(out, p, url.PathEscape(p), url.QueryEscape(p), url.UserPassword("u", p).String()[2:])
	}
	return out
}

// collectSecrets gathers the passwords of every argument and of the
// environment variables fencectl reads.
func collectSecrets(args []string) []string {
	var out []string
	for _, a := range args {
		// --db=URL arrives as one argument.
		if _, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(a, "-") {
			a = v
		}
		out = append(out, secretsOf(a)...)
	}
	for _, env := range []string{"REDIS_URL", "DATABASE_URL"} {
		out = append(out, secretsOf(os.Getenv(env))...)
	}
	seen := map[string]bool{}
	var uniq []string
	for _, s := range out {
		if s != "" && s != mask && !seen[s] {
			seen[s] = true
			uniq = append(uniq, s)
		}
	}
	// Longest first, so that an escaped spelling is replaced whole.
	sort.Slice(uniq, func(i, j int) bool { return len(uniq[i]) > len(uniq[j]) })
	return uniq
}

// inAddress matches each secret where it stands as the password of an
// address: after scheme://user: and before @, or after password= (quoted
// or not).
func inAddress(secrets []string) []*regexp.Regexp {
	var out []*regexp.Regexp
	for _, sec := range secrets {
		q := regexp.QuoteMeta(sec)
		out = append(out,
			regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s\[\]]*:)`+q+`@`),
			regexp.MustCompile(`(?i)(password=)'?`+q+`'?`))
	}
	return out
}

// scrubber is an io.Writer that replaces secrets in whole lines before
// passing them on; Flush writes out a last line without a newline.
// Buffering by line means a secret split across two Write calls is still
// caught.
type scrubber struct {
	mu      sync.Mutex
	w       io.Writer
	secrets []*regexp.Regexp // inAddress of the known passwords
	buf     []byte
}

func newScrubber(w io.Writer, secrets []string) *scrubber {
	return &scrubber{w: w, secrets: inAddress(secrets)}
}

func (s *scrubber) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf = append(s.buf, p...)
	if i := bytes.LastIndexByte(s.buf, '\n'); i >= 0 {
		if _, err := io.WriteString(s.w, s.scrub(string(s.buf[:i+1]))); err != nil {
			return 0, err
		}
		s.buf = append(s.buf[:0], s.buf[i+1:]...)
	}
	return len(p), nil
}

func (s *scrubber) Flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.buf) > 0 {
		_, _ = io.WriteString(s.w, s.scrub(string(s.buf)))
		s.buf = s.buf[:0]
	}
}

func (s *scrubber) scrub(text string) string {
	// The known passwords first: one with an '@' would fool the patterns.
	for _, re := range s.secrets {
		text = re.ReplaceAllStringFunc(text, func(m string) string {
			if strings.HasPrefix(strings.ToLower(m), "password=") {
				return m[:len("password=")] + mask
			}
			return re.ReplaceAllString(m, "${1}"+mask+"@")
		})
	}
	text = urlUserinfo.ReplaceAllStringFunc(text, func(m string) string {
		// PASSWORD is the placeholder of fencectl's own address forms.
		if strings.HasSuffix(m, ":PASSWORD@") {
			return m
		}
		return urlUserinfo.ReplaceAllString(m, "${1}"+mask+"@")
	})
	return dsnPassword.ReplaceAllString(text, "${1}"+mask)
}
