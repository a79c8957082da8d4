package app

import (
	"context"
	"errors"
	"fmt"
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
			a.serviceProtocolsErr.Store(nil)
			a.logger.InfoContext(ctx, "service protocols registered")
			return
		}
		a.serviceProtocolsErr.Store(&err)
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

// serviceProtocolsReady is the readiness check of the built-in service
// PDs: until registerServiceProtocols has stored them, NewRequest under
// them answers UNAVAILABLE, so the dispatcher is not ready (/readyz 503,
// its gRPC health NOT_SERVING) and a balancer sends it no traffic.
func (a *App) serviceProtocolsReady(context.Context) error {
	if a.serviceProtocols.Load() {
		return nil
	}
	if err := a.serviceProtocolsErr.Load(); err != nil {
		return fmt.Errorf("the built-in service protocols are not registered yet (retrying): %w", *err)
	}
	return errors.New("the built-in service protocols are not registered yet")
}
