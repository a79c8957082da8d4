//go:build race

package routine

// raceEnabled: the race detector needs more address space per byte.
const raceEnabled = true
