// Command weather is a complete Parley agent written with the SDK, meant to
// be copied out of the repository as the start of your own (the SDK README
// shows the go.mod it needs). It connects to a running `parley serve`,
// answers Agora envelopes of the weather protocol, natural-language
// envelopes and Agent Protocol steps, and reconnects when the stream
// breaks.
//
//	go run . --server 127.0.0.1:9090 --agent clients/acme/agents/weather
//
// PARLEY_TOKEN holds the agent's key (parley_ak_…), which the server asks
// for when it runs with --auth. A refused key stops the agent instead of
// reconnecting for ever.
//
// Create the agent first (`parley agent create acme:weather`): the
// dispatcher refuses streams for agents the registry does not know.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/parleyhq/parley/sdk"
)

// weatherProtocol is the SHA-1 of the Agora weather protocol document used
// in Parley's README walkthrough.
const weatherProtocol = "3a732bde0e63d2e838d1a722feebf3d67b52b211"

func main() {
	server := flag.String("server", "127.0.0.1:9090", "gRPC address of the Parley server")
	agent := flag.String("agent", "clients/acme/agents/weather", "the agent's resource name")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, logger, *server, *agent, os.Getenv("PARLEY_TOKEN")); err != nil {
		logger.ErrorContext(ctx, "agent stopped", slog.Any("err", err))
		os.Exit(1)
	}
}

// run connects until ctx ends, waiting a little longer after each broken
// stream (up to 30 s) so that a restarting server is not hammered.
func run(ctx context.Context, logger *slog.Logger, server, agent, key string) error {
	conn, err := grpc.NewClient(server, append(sdk.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return err
	}
	defer conn.Close()
	wait := time.Second
	for {
		err := sdk.Connect(ctx, conn, agent,
			sdk.Protocol(weatherProtocol, forecast),
			sdk.NaturalLanguage(chat),
			sdk.Steps(step),
			sdk.OnReady(func() { logger.InfoContext(ctx, "connected", slog.String("agent", agent)) }),
			sdk.Key(key),
		)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, sdk.ErrNotAuthorized) {
			return err // another try with the same key would fail the same way
		}
		logger.WarnContext(ctx, "stream broken; reconnecting", slog.Any("err", err), slog.Duration("in", wait))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// forecast answers the weather protocol: the body is
// {"date": "YYYY-MM-DD", "location": "..."}, or that object as a JSON
// string. A returned error becomes an Agora failure for the sender.
func forecast(_ context.Context, e sdk.Envelope) (json.RawMessage, error) {
	body := []byte(e.Body)
	var s string
	if json.Unmarshal(body, &s) == nil {
		body = []byte(s)
	}
	var q struct {
		Date     string `json:"date"`
		Location string `json:"location"`
	}
	if err := json.Unmarshal(body, &q); err != nil {
		return nil, fmt.Errorf("want {\"date\", \"location\"}: %w", err)
	}
	if !strings.EqualFold(q.Location, "Paris") {
		return json.Marshal(map[string]string{"error": "Unsupported location"})
	}
	return json.Marshal(map[string]any{"temperature": 18, "precipitation": 0, "weatherCondition": "sunny"})
}

// chat answers natural-language envelopes, which have no protocol.
func chat(_ context.Context, _ sdk.Envelope) (json.RawMessage, error) {
	return json.Marshal("Ask me with the weather protocol " + weatherProtocol + ".")
}

// step executes an Agent Protocol step of a task sent to this agent.
func step(_ context.Context, s sdk.Step) (sdk.StepResult, error) {
	if s.Input == "" {
		return sdk.StepResult{}, errors.New("empty step input: say a city")
	}
	return sdk.StepResult{
		Output: "Forecast for " + s.Input + ": ask with the weather protocol for numbers.",
		IsLast: true,
	}, nil
}
