//go:build boltdb_record

package boltdb

// recordByDefault: see record_default.go.
const recordByDefault = true
