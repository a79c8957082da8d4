package app

import (
	"context"
	"log/slog"
	"time"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/serviceprotocol"
)

// registrar stores PDs with the registry's CreateProtocol, which returns the
// stored record for bytes it already holds.
type registrar struct {
	c registryv1.RegistryServiceClient
}

func (r registrar) RegisterProtocol(ctx context.Context, content []byte) error {
	_, err := r.c.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: content}})
	return err
}

// registerServiceProtocols stores the built-in service PDs in the registry,
// retrying with backoff (the registry may start after us, and in `parley
// serve` it only answers once Serve runs) until they are stored or ctx ends.
func (a *App) registerServiceProtocols(ctx context.Context, c registryv1.RegistryServiceClient) {
	wait := 100 * time.Millisecond
	for {
		callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := serviceprotocol.Register(callCtx, registrar{c})
		cancel()
		if err == nil {
			a.serviceProtocols.Store(true)
			a.logger.InfoContext(ctx, "service protocols registered")
			return
		}
		if wait >= 5*time.Second {
			a.logger.WarnContext(ctx, "service protocols not registered yet; retrying", slog.Any("err", err), slog.String("retry_in", wait.String()))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}
