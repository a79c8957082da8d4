// Package negotiatortest is test support, not product code (no production
// package imports it: e2e/arch_test.go). Start runs a negotiator inside the
// current process, on loopback gRPC with a temporary data directory, for
// tests and the network benchmark (bench/negotiator). Its subpackages are
// the scripted LLM fixture (llmtest) and a stand-in for the dispatcher's
// routine runtime (routinetest).
package negotiatortest

import (
	"context"
	"log/slog"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/negotiator/app"
	"github.com/parleyhq/parley/services/negotiator/config"
)

// Negotiator is a running in-process negotiator.
type Negotiator struct {
	Client  negotiatorv1.NegotiatorServiceClient
	closers []func()
	dir     string
}

// Close stops the negotiator and removes its data directory.
func (n *Negotiator) Close() {
	for i := len(n.closers) - 1; i >= 0; i-- {
		n.closers[i]()
	}
	_ = os.RemoveAll(n.dir)
}

// Start runs a negotiator configured with the flag defaults plus the set
// fields of llmCfg. tweak, when given, edits the configuration last.
func Start(ctx context.Context, llmCfg config.LLM, tweak ...func(*config.Config)) (_ *Negotiator, err error) {
	dir, err := os.MkdirTemp("", "parley-negotiator-")
	if err != nil {
		return nil, err
	}
	n := &Negotiator{dir: dir}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	cfg, err := config.Load(nil, func(string) string { return "" })
	if err != nil {
		return nil, err
	}
	cfg.DataDir = dir
	overlayLLM(&cfg.LLM, llmCfg)
	for _, t := range tweak {
		t(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := slog.New(slog.DiscardHandler)
	grpcLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	httpLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		grpcLis.Close()
		return nil, err
	}
	conn, err := grpc.NewClient(grpcLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		grpcLis.Close()
		httpLis.Close()
		return nil, err
	}
	n.closers = append(n.closers, func() { _ = conn.Close() })
	a, err := app.New(cfg, logger)
	if err != nil {
		grpcLis.Close()
		httpLis.Close()
		return nil, err
	}
	n.closers = append(n.closers, func() { _ = a.Close() })
	srv, err := serve.New(serve.Options{Logger: logger})
	if err != nil {
		grpcLis.Close()
		httpLis.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	n.closers = append(n.closers, cancel)
	if err := a.Register(rctx, srv); err != nil {
		grpcLis.Close()
		httpLis.Close()
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(rctx, grpcLis, httpLis) }()
	n.closers = append(n.closers, func() {
		cancel()
		if err := <-done; err != nil {
			logger.WarnContext(ctx, "in-process negotiator stopped", slog.Any("err", err))
		}
	})
	n.Client = negotiatorv1.NewNegotiatorServiceClient(conn)
	return n, nil
}

// overlayLLM copies the set fields of src over dst, which holds the flag
// defaults.
func overlayLLM(dst *config.LLM, src config.LLM) {
	for _, f := range []struct{ d, s *string }{
		{&dst.Provider, &src.Provider}, {&dst.BaseURL, &src.BaseURL}, {&dst.Model, &src.Model}, {&dst.APIKey, &src.APIKey},
		{&dst.ModelNegotiation, &src.ModelNegotiation}, {&dst.ModelProgramming, &src.ModelProgramming},
		{&dst.ModelChecking, &src.ModelChecking}, {&dst.ModelConversation, &src.ModelConversation},
		{&dst.Structured, &src.Structured}, {&dst.Prices, &src.Prices},
	} {
		if *f.s != "" {
			*f.d = *f.s
		}
	}
	if src.Timeout > 0 {
		dst.Timeout = src.Timeout
	}
	if src.MaxRetries > 0 {
		dst.MaxRetries = src.MaxRetries
	}
	if src.MaxConcurrent > 0 {
		dst.MaxConcurrent = src.MaxConcurrent
	}
	if src.BudgetAgentUSD > 0 {
		dst.BudgetAgentUSD = src.BudgetAgentUSD
	}
	if src.BudgetPeerUSD > 0 {
		dst.BudgetPeerUSD = src.BudgetPeerUSD
	}
}
