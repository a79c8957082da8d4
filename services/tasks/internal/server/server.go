// Package server implements parley.tasks.v1.TasksService.
package server

import (
	"log/slog"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/services/tasks/internal/store"
)

// Domain is the ErrorInfo domain of the tasks's errors.
const Domain = "tasks.parley.dev"

// Server implements the tasks's gRPC API.
type Server struct {
	tasksv1.UnimplementedTasksServiceServer

	store  store.Store
	logger *slog.Logger
}

var _ tasksv1.TasksServiceServer = (*Server)(nil)

// New returns a Server over st.
func New(st store.Store, logger *slog.Logger) *Server {
	return &Server{store: st, logger: logger}
}
