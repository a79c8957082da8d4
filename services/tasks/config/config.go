// Package config loads the tasks's configuration from flags, with
// PARLEY_* environment variables as fallbacks.
package config

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/parleyhq/parley/platform/envflag"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/platform/serve"
)

// Config is the tasks's configuration.
type Config struct {
	serve.Flags

	// DispatcherAddr is the dispatcher gRPC address (one-service binary only;
	// `parley serve` connects in-process).
	DispatcherAddr string
	// RegistryAddr is the registry gRPC address, asked for each agent's
	// Agent Protocol access (one-service binary only); empty: every agent's
	// Agent Protocol routes are public.
	RegistryAddr string

	// Agent is the agent served at /ap/v1/agent, as client:agent.
	Agent string
	// StepWait is how long POST .../steps waits for a step to complete.
	StepWait time.Duration
	// StepTimeout bounds one ExecuteStep call.
	StepTimeout time.Duration
	// RetryMax caps the backoff between attempts at a parked step.
	RetryMax time.Duration
	// MaxPageSize is the largest page_size a list accepts.
	MaxPageSize int
	// MaxUploadBytes caps an artifact's size.
	MaxUploadBytes int64
	// MaxWatchers caps concurrent event-stream subscribers.
	MaxWatchers int
	// MaxInFlight caps concurrent ExecuteStep calls.
	MaxInFlight int
	// MaxWaitingSteps caps the steps of one agent queued, running or waiting
	// for an executor.
	MaxWaitingSteps int
	// MaxStepAttempts caps the attempts at a step failing for its own
	// reasons, after which it completes with the failure as its output.
	MaxStepAttempts int
}

// RegisterFlags adds the tasks service's own flags (not the shared serving flags)
// to fs. The all-in-one `parley serve` calls it too, so names must not clash
// with other services' flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.RegisterGatewayFlags(fs)
	fs.DurationVar(&c.StepWait, "ap-step-wait", 30*time.Second, "how long POST .../steps waits for the step to complete before returning it as stored")
	fs.DurationVar(&c.StepTimeout, "ap-step-timeout", 10*time.Minute, "how long one step execution may take before it is retried")
	fs.DurationVar(&c.RetryMax, "ap-retry-max", 5*time.Second, "longest wait between attempts at a step that has no executor yet")
	fs.IntVar(&c.MaxWatchers, "ap-max-watchers", 1024, "most concurrent task event streams")
	fs.IntVar(&c.MaxInFlight, "ap-max-in-flight", 512, "most steps executing at once")
	fs.IntVar(&c.MaxWaitingSteps, "ap-max-waiting-steps", 1000, "most steps of one agent queued, running or waiting for an executor (more get 429)")
	fs.IntVar(&c.MaxStepAttempts, "ap-max-step-attempts", 5, "attempts at a step failing for its own reasons before it completes with the failure")
}

// RegisterGatewayFlags adds the flags of the Agent Protocol routes, which
// a gateway process (`parley gateway`) serves too: --ap-agent,
// --ap-max-page-size and --ap-max-upload-bytes. RegisterFlags includes them.
func (c *Config) RegisterGatewayFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Agent, "ap-agent", "default:agent", "agent served at /ap/v1/agent, as client:agent (others are at /agents/{client}/{agent}/ap/v1/agent)")
	fs.IntVar(&c.MaxPageSize, "ap-max-page-size", 100, "largest page_size accepted by list endpoints")
	fs.Int64Var(&c.MaxUploadBytes, "ap-max-upload-bytes", 32<<20, "largest artifact accepted, in bytes (larger uploads get 413)")
}

// ValidateGateway reports every bad value among the flags of
// RegisterGatewayFlags at once.
func (c *Config) ValidateGateway() error {
	var errs []error
	if client, agent, ok := strings.Cut(c.Agent, ":"); !ok || !validID(client) || !validID(agent) {
		errs = append(errs, fmt.Errorf("--ap-agent %q must be client:agent with lowercase DNS-safe ids", c.Agent))
	}
	if c.MaxPageSize < 1 || c.MaxPageSize > 10000 {
		errs = append(errs, errors.New("--ap-max-page-size must be between 1 and 10000"))
	}
	if c.MaxUploadBytes < 1 {
		errs = append(errs, errors.New("--ap-max-upload-bytes must be positive"))
	}
	return errors.Join(errs...)
}

// validID reports whether s is a client or agent id (the one rule).
func validID(s string) bool { return resource.ValidID(s) }

// AgentName returns the resource name of the --ap-agent value.
func (c *Config) AgentName() string {
	client, agent, _ := strings.Cut(c.Agent, ":")
	return "clients/" + client + "/agents/" + agent
}

// Validate reports every bad value at once.
func (c *Config) Validate() error {
	errs := []error{c.ValidateGateway()}
	if c.DataDir == "" {
		errs = append(errs, errors.New("--data must not be empty"))
	}
	if c.StepWait < 0 {
		errs = append(errs, errors.New("--ap-step-wait must not be negative"))
	}
	if c.StepTimeout <= 0 {
		errs = append(errs, errors.New("--ap-step-timeout must be positive"))
	}
	if c.RetryMax <= 0 {
		errs = append(errs, errors.New("--ap-retry-max must be positive"))
	}
	if c.MaxWatchers < 1 {
		errs = append(errs, errors.New("--ap-max-watchers must be positive"))
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, errors.New("--ap-max-in-flight must be positive"))
	}
	if c.MaxWaitingSteps < 1 {
		errs = append(errs, errors.New("--ap-max-waiting-steps must be positive"))
	}
	if c.MaxStepAttempts < 1 {
		errs = append(errs, errors.New("--ap-max-step-attempts must be positive"))
	}
	return errors.Join(errs...)
}

// doc is the one-service binary's --help.
var doc = envflag.Doc{
	Usage:   "tasks [flags]",
	Summary: "Run the Parley tasks service alone: Agent Protocol tasks, steps and artifacts. Steps run through the dispatcher.",
	Examples: []string{
		"tasks --operator-token-file /run/parley/operator.token --dispatcher-addr dns:///dispatcher:9090",
		"tasks --data ./data/tasks --operator-token-file ./data/operator.token --grpc-addr 127.0.0.1:9093 --http-addr 127.0.0.1:8083 --dispatcher-addr 127.0.0.1:9091",
	},
	Prefix: "PARLEY_",
}

// Load parses the one-service binary's flags from args, falling back to the
// environment (PARLEY_GRPC_ADDR, PARLEY_DATA, ...).
func Load(args []string, getenv func(string) string) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("tasks", flag.ContinueOnError)
	c.Flags.Register(fs, ":9090", ":8080", "/var/lib/parley")
	c.RegisterFlags(fs)
	fs.StringVar(&c.DispatcherAddr, "dispatcher-addr", "dns:///dispatcher:9090", "dispatcher gRPC address")
	fs.StringVar(&c.RegistryAddr, "registry-addr", "dns:///registry:9090", "registry gRPC address, asked for each agent's Agent Protocol access (public or token); empty: every agent is public")
	pos, err := doc.ParseArgs(fs, args, getenv)
	if err != nil {
		return c, err
	}
	if len(pos) > 0 {
		return c, fmt.Errorf("tasks takes no arguments, got %q", pos)
	}
	return c, c.Validate()
}
