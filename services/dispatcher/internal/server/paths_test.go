package server

import "github.com/parleyhq/parley/services/dispatcher/internal/metrics"

// Paths and shadow outcomes as the tests compare them.
const (
	pathRoutine = metrics.PathRoutine
	pathLLM     = metrics.PathLLM

	shadowAgreed    = "agreed"
	shadowDisagreed = "disagreed"
	shadowPromoted  = "promoted"
	shadowSkipped   = "skipped"
	shadowError     = "error"
	shadowConflict  = "conflict"
)
