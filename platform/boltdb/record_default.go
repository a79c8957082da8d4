//go:build !boltdb_record

package boltdb

// recordByDefault is DB.record's value on Open. Building with the tag
// boltdb_record turns recording on everywhere, to measure its cost in
// stores' benchmarks (docs/benchmarks.md); nothing ships with it.
const recordByDefault = false
