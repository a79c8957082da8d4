package routine

import (
	"os"
	"testing"
)

// TestMain lets this test binary serve as the pool's worker, so the tests
// run routines behind the real boundary.
func TestMain(m *testing.M) {
	if IsWorker() {
		os.Exit(ServeWorker())
	}
	os.Exit(m.Run())
}

// newTestPool is a pool of worker processes closed with the test.
func newTestPool(t testing.TB, o PoolOptions) *Pool {
	t.Helper()
	p := NewPoolWith(o)
	t.Cleanup(func() { _ = p.Close() })
	return p
}
