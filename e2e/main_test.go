package e2e

import (
	"fmt"
	"os"
	"testing"

	"github.com/parleyhq/parley/e2e/parleytest"
)

// TestMain removes the binaries the tests built once they have all run.
func TestMain(m *testing.M) {
	code := m.Run()
	if err := parleytest.RemoveBuilds(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: removing built binaries:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
