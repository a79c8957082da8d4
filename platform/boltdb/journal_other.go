//go:build !linux

package boltdb

import "os"

// fdatasync is File.Sync where Linux's fdatasync(2) is missing (on macOS
// it asks the drive to flush, F_FULLFSYNC, as bbolt does).
func fdatasync(f *os.File) error { return f.Sync() }
