package boltdb

import (
	"os"
	"syscall"
)

// fdatasync writes f's data to disk, and its metadata only as far as
// reading the data back needs (not its times), as bbolt does on Linux.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) } //nolint:gosec // a file descriptor
