//go:build !unix

package boltdb

import (
	"errors"
	"os"
	"time"
)

// lockFile refuses: the journal locks its file with flock(2).
func lockFile(*os.File, time.Duration) error {
	return errors.New("the journal is supported on Unix systems only")
}
