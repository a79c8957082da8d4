package e2e

import (
	"fmt"
	"os"
	"testing"

	"github.com/parleyhq/parley/e2e/parleytest"
)

// TestMain removes the binaries the tests built once they have all run,
// and fails the run if any server logged a secret at any level: a
// credential (every key the tests created, the operator token), a TLS
// private key or another noted secret (parleytest.CheckLogsForSecrets).
func TestMain(m *testing.M) {
	code := m.Run()
	if err := parleytest.CheckLogsForSecrets(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		code = 1
	}
	if err := parleytest.RemoveBuilds(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: removing built binaries:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
