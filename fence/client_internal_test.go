package fence

import (
	"context"
	"testing"

	"github.com/fencelock/fencelock/testenv"
)

// newTestClient is a Client on r, under r's prefix, closed when t ends.
func newTestClient(t testing.TB, r *testenv.Redis, opts ...ClientOption) *Client {
	t.Helper()
	c, err := New(r.Client(), append([]ClientOption{WithPrefix(r.Prefix + "fence:")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}
