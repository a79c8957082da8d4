//go:build unix

package boltdb

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// errLocked reports a file another process holds locked.
var errLocked = errors.New("locked by another process (is another parley using its data directory?)")

// lockFile takes an exclusive lock on f, trying every 50 ms for up to
// timeout (zero: forever), as bbolt locks its file.
func lockFile(f *os.File, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) //nolint:gosec // a file descriptor
		if err == nil || !errors.Is(err, syscall.EWOULDBLOCK) {
			return err
		}
		if timeout > 0 && time.Now().After(deadline) {
			return errLocked
		}
		time.Sleep(50 * time.Millisecond)
	}
}
