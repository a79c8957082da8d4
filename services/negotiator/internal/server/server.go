// Package server implements parley.negotiator.v1.NegotiatorService.
package server

import (
	"log/slog"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
)

// Domain is the ErrorInfo domain of the negotiator's errors.
const Domain = "negotiator.parley.dev"

// Server implements the negotiator's gRPC API.
type Server struct {
	negotiatorv1.UnimplementedNegotiatorServiceServer

	logger *slog.Logger
}

var _ negotiatorv1.NegotiatorServiceServer = (*Server)(nil)

// New returns a Server.
func New(logger *slog.Logger) *Server {
	return &Server{logger: logger}
}
