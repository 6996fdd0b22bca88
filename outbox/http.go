package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/fencelock/fencelock/guard"
)

// HTTPSender delivers effects as HTTP requests: the payload as the body,
// to the effect's Destination (an http or https URL), with the effect's
// headers and four more:
//
//	Idempotency-Key:  the effect's Key
//	Fencing-Token:    the token of the transaction that recorded it
//	Fencing-Resource: its resource (lock name)
//	Fencing-Holder:   its holder
//
// A 2xx answer is delivered; with Fencing-Outcome: already_applied (as
// [Receive] answers a redelivery) Send returns guard.ErrAlreadyApplied,
// which the relay counts as delivered before. 409 means the receiver has
// seen a newer token
// (ErrSuperseded: the row is deleted); any other 4xx, a redirect, or a
// destination that is not an http(s) URL is terminal (ErrTerminal: the row
// goes dead with the reason); 5xx and network errors are retried.
//
// The zero value is ready to use.
type HTTPSender struct {
	// Client sends the requests; nil means a client of its own that does
	// not follow redirects. Timeouts come from the relay's send timeout.
	Client *http.Client
	// Method is the request method; "" means POST.
	Method string
}

var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// maxReason is how much of an error answer's body the reason keeps.
const maxReason = 512

// Send delivers d.
func (s *HTTPSender) Send(ctx context.Context, d Delivery) error {
	u, err := url.Parse(d.Destination)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Terminal(fmt.Errorf("destination %q is not an http(s) URL", d.Destination))
	}
	method := s.Method
	if method == "" {
		method = http.MethodPost
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), bytes.NewReader(d.Payload))
	if err != nil {
		return Terminal(err)
	}
	for name, values := range d.Header {
		req.Header[name] = values
	}
	if req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	req.Header.Set(HeaderIdempotencyKey, d.Key)
	req.Header.Set(HeaderFencingToken, strconv.FormatInt(d.Token, 10))
	req.Header.Set(HeaderFencingResource, d.Resource)
	req.Header.Set(HeaderFencingHolder, d.Holder)
	if !validHeaderValue(d.Resource) || !validHeaderValue(d.Holder) {
		return Terminal(fmt.Errorf("resource %q or holder %q has control characters and cannot travel in a header", d.Resource, d.Holder))
	}
	client := s.Client
	if client == nil {
		client = noRedirects
	}
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s %s: %w", method, u.Redacted(), context.Cause(ctx))
		}
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return fmt.Errorf("%s %s: %w", method, u.Redacted(), err)
	}
	defer resp.Body.Close()
	reason, _ := io.ReadAll(io.LimitReader(resp.Body, maxReason))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // reuse the connection
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if resp.Header.Get(HeaderFencingOutcome) == string(guard.ReasonAlreadyApplied) {
			return fmt.Errorf("%s %s: %s: %w", method, u.Redacted(), resp.Status, guard.ErrAlreadyApplied)
		}
		return nil
	}
	err = fmt.Errorf("%s %s: %s%s", method, u.Redacted(), resp.Status, answer(reason))
	switch {
	case resp.StatusCode == http.StatusConflict:
		return fmt.Errorf("%w: %w", ErrSuperseded, err)
	case resp.StatusCode >= 300 && resp.StatusCode < 500 && resp.StatusCode != http.StatusRequestTimeout && resp.StatusCode != http.StatusTooManyRequests:
		return Terminal(err)
	}
	return err
}

// answer is the start of an error answer's body, on one line.
func answer(b []byte) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if s == "" {
		return ""
	}
	return ": " + s
}
