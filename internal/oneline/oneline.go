// Package oneline joins errors the way errors.Join does, but with a message
// on one line, so that a log line stays one line. fence and guard return
// such errors wherever one call fails for more than one reason.
package oneline

import "strings"

// Error is a set of errors with a one-line message; errors.Is and
// errors.As see every one of them.
type Error []error

func (m Error) Error() string {
	msgs := make([]string, len(m))
	for i, err := range m {
		msgs[i] = Fold(err.Error())
	}
	return strings.Join(msgs, "; ")
}

func (m Error) Unwrap() []error { return m }

// Join is errors.Join with a one-line message; nil errors are dropped,
// and a single error is returned as it is.
func Join(errs ...error) error {
	var m Error
	for _, err := range errs {
		if err != nil {
			m = append(m, err)
		}
	}
	switch len(m) {
	case 0:
		return nil
	case 1:
		return m[0]
	}
	return m
}

// Fold folds the line breaks of a message (a wrapped errors.Join's among
// them) into "; ".
func Fold(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' }), "; ")
}
