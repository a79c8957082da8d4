package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/parleyhq/parley/platform/envflag"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/platform/telemetry"
	dispatcherapp "github.com/parleyhq/parley/services/dispatcher/app"
	dispatcherconfig "github.com/parleyhq/parley/services/dispatcher/config"
	negotiatorapp "github.com/parleyhq/parley/services/negotiator/app"
	negotiatorconfig "github.com/parleyhq/parley/services/negotiator/config"
	registryapp "github.com/parleyhq/parley/services/registry/app"
	registryconfig "github.com/parleyhq/parley/services/registry/config"
	tasksapp "github.com/parleyhq/parley/services/tasks/app"
	tasksconfig "github.com/parleyhq/parley/services/tasks/config"
)

// suiteConfig is the configuration of `parley serve`: the shared serving
// flags plus every service's own flags, on one flag set.
type suiteConfig struct {
	serve.Flags
	registry   registryconfig.Config
	dispatcher dispatcherconfig.Config
	negotiator negotiatorconfig.Config
	tasks      tasksconfig.Config
	// tune, when set, adjusts the serving options (tests only).
	tune func(*serve.Options)
}

// serveDoc is the help of `parley serve`.
var serveDoc = envflag.Doc{
	Usage:   "parley serve [flags]",
	Summary: "Run the registry, dispatcher, negotiator and tasks services and the REST gateway in one process, keeping their data under --data. Stop it with Ctrl-C (SIGINT) or SIGTERM.",
	Prefix:  "PARLEY_",
	Examples: []string{
		"parley serve --data ./data",
		"PARLEY_LLM_PROVIDER=openai PARLEY_LLM_MODEL=llama3.2 parley serve --llm-base-url http://127.0.0.1:11434/v1",
		"parley serve --grpc-addr :9090 --http-addr :8080 --tls-cert cert.pem --tls-key key.pem --public-url https://parley.example.com",
	},
}

// loadSuiteConfig parses the flags of `parley serve` (help goes to
// e.stdout) and the PARLEY_* environment.
func loadSuiteConfig(e env, args []string) (suiteConfig, error) {
	var c suiteConfig
	fs := flag.NewFlagSet("parley serve", flag.ContinueOnError)
	fs.SetOutput(e.stdout)
	c.Flags.Register(fs, "127.0.0.1:9090", "127.0.0.1:8080", "./data")
	c.registry.RegisterFlags(fs)
	c.dispatcher.RegisterFlags(fs)
	c.negotiator.RegisterFlags(fs)
	c.tasks.RegisterFlags(fs)
	pos, err := serveDoc.ParseArgs(fs, args, e.getenv)
	if err != nil {
		return c, err
	}
	if len(pos) > 0 {
		return c, usageErrorf("parley serve takes no arguments, got %q", pos)
	}
	c.registry.Flags = c.Flags
	c.dispatcher.Flags = c.Flags
	c.negotiator.Flags = c.Flags
	c.tasks.Flags = c.Flags
	return c, errors.Join(c.registry.Validate(), c.dispatcher.Validate(), c.negotiator.Validate(), c.tasks.Validate())
}

// suite is every service assembled in one process, sharing one gRPC server,
// one HTTP server and an in-process gRPC connection for service-to-service
// calls.
type suite struct {
	srv     *serve.Server
	conn    *serve.InProcessConn // in-process, to the suite's own services
	logger  *slog.Logger
	closers []func() error
}

// newSuite builds the services on one serve.Server. The caller must Close
// it after Run returns, and on error nothing is left open.
func newSuite(ctx context.Context, cfg suiteConfig) (_ *suite, err error) {
	logger := telemetry.NewLogger(os.Stderr, "parley", cfg.LogLevel)
	opts := cfg.Flags.Options(logger)
	if cfg.tune != nil {
		cfg.tune(&opts)
	}
	srv, err := serve.New(opts)
	if err != nil {
		return nil, err
	}
	s := &suite{srv: srv, logger: logger}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	conn, err := srv.InProcessConn()
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, conn.Close)
	s.conn = conn

	regPeers, err := registryapp.DialPeers(cfg.registry)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, regPeers.Close)
	reg, err := registryapp.New(cfg.registry, logger.With("component", "registry"), regPeers)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, reg.Close)
	disp, err := dispatcherapp.New(cfg.dispatcher, logger.With("component", "dispatcher"), dispatcherapp.Peers{Registry: conn, Negotiator: conn})
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, disp.Close)
	neg, err := negotiatorapp.New(cfg.negotiator, logger.With("component", "negotiator"))
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, neg.Close)
	tasks, err := tasksapp.New(cfg.tasks, logger.With("component", "tasks"), tasksapp.Peers{Dispatcher: conn, Registry: conn})
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, tasks.Close)

	for _, register := range []func(context.Context, *serve.Server) error{reg.Register, disp.Register, neg.Register, tasks.Register} {
		if err := register(ctx, srv); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Close closes every service in reverse order of opening.
func (s *suite) Close() error {
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		errs = append(errs, s.closers[i]())
	}
	return errors.Join(errs...)
}

func runServe(e env, args []string) error {
	cfg, err := loadSuiteConfig(e, args)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := newSuite(ctx, cfg)
	if err != nil {
		return err
	}
	runErr := serve.ListenAndRun(ctx, s.srv, cfg.Flags, func(ctx context.Context) {
		ensureDefaultAgent(ctx, s.conn, cfg.tasks.AgentName(), s.logger)
	})
	return errors.Join(runErr, s.Close())
}
