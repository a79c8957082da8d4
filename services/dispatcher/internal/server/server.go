// Package server implements parley.dispatcher.v1.DispatcherService.
package server

import (
	"log/slog"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// Domain is the ErrorInfo domain of the dispatcher's errors.
const Domain = "dispatcher.parley.dev"

// Server implements the dispatcher's gRPC API.
type Server struct {
	dispatcherv1.UnimplementedDispatcherServiceServer

	store  store.Store
	logger *slog.Logger
}

var _ dispatcherv1.DispatcherServiceServer = (*Server)(nil)

// New returns a Server over st.
func New(st store.Store, logger *slog.Logger) *Server {
	return &Server{store: st, logger: logger}
}
