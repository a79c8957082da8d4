// Package server implements parley.registry.v1.RegistryService.
package server

import (
	"log/slog"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// Domain is the ErrorInfo domain of the registry's errors.
const Domain = "registry.parley.dev"

// Server implements the registry's gRPC API.
type Server struct {
	registryv1.UnimplementedRegistryServiceServer

	store  store.Store
	logger *slog.Logger
}

var _ registryv1.RegistryServiceServer = (*Server)(nil)

// New returns a Server over st.
func New(st store.Store, logger *slog.Logger) *Server {
	return &Server{store: st, logger: logger}
}
