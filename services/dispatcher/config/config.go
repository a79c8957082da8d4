// Package config loads the dispatcher's configuration from flags, with
// PARLEY_* environment variables as fallbacks.
package config

import (
	"errors"
	"flag"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/parleyhq/parley/platform/envflag"
	"github.com/parleyhq/parley/platform/serve"
)

// Config is the dispatcher's configuration.
type Config struct {
	serve.Flags

	// RegistryAddr is the registry gRPC address (one-service binary only;
	// `parley serve` connects in-process).
	RegistryAddr string
	// NegotiatorAddr is the negotiator gRPC address (one-service binary only;
	// `parley serve` connects in-process).
	NegotiatorAddr string

	ConversationTTL         time.Duration
	MaxConversationsPerPeer int
	RoutineMaxSteps         uint64
	RoutineTimeout          time.Duration
	RoutineMaxOutputBytes   int
	RoutineMaxToolCalls     int
	RoutineMaxAllocBytes    int64
	RoutineWorkers          int
	// Each routine worker process: its memory cap above its start size,
	// how long past its budget a run may go before the worker is killed,
	// and the CPU time it may use in its life.
	RoutineMemoryBytes int64
	RoutineKillMargin  time.Duration
	RoutineWorkerCPU   time.Duration

	QuarantineAfter int
	HandlerTimeout  time.Duration
	// HandlerQueue bounds each connected SDK agent's queue of requests not
	// yet written to its stream.
	HandlerQueue      int
	CacheTTL          time.Duration
	NegativeCacheTTL  time.Duration
	AgoraMaxBodyBytes int64
	AgoraPeerHeader   string
	// AgoraPeerDialects is "peer=dialect,..." as given on the command line.
	AgoraPeerDialects string
	SendTimeout       time.Duration
	SendRetries       int
	SendAllowPrivate  bool
	// SendMaxListed and SendMaxJudgeCalls bound what one Send spends on a
	// target's well-known document.
	SendMaxListed     int
	SendMaxJudgeCalls int
	// MessageMaxBodyBytes and MessageTimeout bound one message of the
	// agent network (SendMessage, ReplyMessage, BroadcastMessage).
	MessageMaxBodyBytes int64
	MessageTimeout      time.Duration
	// DialogueRetention is how long a closed dialogue is kept.
	DialogueRetention time.Duration
	// PaymentMaxOpen bounds each payer's open (not captured) payments of
	// the ledger provider.
	PaymentMaxOpen int
	// PaymentRetention is how long a ledger payment not reserved is kept
	// after its last change, and the spend records of a UTC day after it
	// ended (today's and yesterday's always).
	PaymentRetention time.Duration

	// Mailboxes (durable delivery of network messages).
	MailboxMaxMessages int64         // unacknowledged messages per agent
	MailboxMaxBytes    int64         // their body bytes per agent
	MailboxRetention   time.Duration // acknowledged messages kept this long
	// NotificationRetryFor is how long a network notification that a full
	// mailbox refused (or whose append failed) is retried before it is
	// given up.
	NotificationRetryFor time.Duration
	// Receive streams (gRPC and SSE).
	MailboxStreamBatch        int
	MailboxStreamKeepalive    time.Duration
	MailboxStreamMaxDuration  time.Duration
	MailboxStreamWriteTimeout time.Duration

	// Journal makes dispatcher.db's commits durable through its
	// write-ahead journal, dispatcher.db-journal (platform/boltdb, ADR
	// 0008): one fdatasync of an append per commit. Off, bbolt syncs each
	// commit itself (two fdatasyncs of the changed pages). bbolt only.
	Journal bool
}

// RegisterFlags adds the dispatcher's own flags (not the shared serving flags)
// to fs. The all-in-one `parley serve` calls it too, so names must not clash
// with other services' flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.ConversationTTL, "conversation-ttl", 5*time.Minute, "sliding lifetime of an Agora multiround conversation")
	fs.IntVar(&c.MaxConversationsPerPeer, "conversation-max-per-peer", 100, "open conversations allowed per peer")
	fs.Uint64Var(&c.RoutineMaxSteps, "routine-max-steps", 1_000_000, "Starlark execution steps per routine run")
	fs.DurationVar(&c.RoutineTimeout, "routine-timeout", time.Second, "wall time per routine run")
	fs.IntVar(&c.RoutineMaxOutputBytes, "routine-max-output-bytes", 64<<10, "largest routine result (and conversation memory), JSON bytes")
	fs.IntVar(&c.RoutineMaxToolCalls, "routine-max-tool-calls", 100, "tool calls per routine run")
	fs.Int64Var(&c.RoutineMaxAllocBytes, "routine-max-alloc-bytes", 64<<20, "allocation budget per routine run, bytes (see the README for what it covers)")
	fs.IntVar(&c.RoutineWorkers, "routine-workers", 2*runtime.GOMAXPROCS(0), "routine runs executing at once; more wait up to --routine-timeout")
	fs.Int64Var(&c.RoutineMemoryBytes, "routine-memory-bytes", 256<<20, "memory cap of each routine worker process above its start size, bytes")
	fs.DurationVar(&c.RoutineKillMargin, "routine-kill-margin", 250*time.Millisecond, "how long past its budget a routine run may go before its worker is killed")
	fs.DurationVar(&c.RoutineWorkerCPU, "routine-worker-cpu", 10*time.Minute, "CPU time one routine worker may use in its life (at least 4s); it is replaced at half")
	fs.IntVar(&c.QuarantineAfter, "routine-quarantine-after", 3, "consecutive failures that quarantine a routine")
	fs.DurationVar(&c.HandlerTimeout, "handler-timeout", 10*time.Second, "how long a connected SDK agent has to answer an envelope or step")
	fs.IntVar(&c.HandlerQueue, "handler-queue", 64, "requests queued per connected SDK agent before more fail at once")
	fs.DurationVar(&c.CacheTTL, "dispatcher-cache-ttl", 5*time.Second, "how long the dispatcher caches agents and routines (protocols: at least 1m)")
	fs.DurationVar(&c.NegativeCacheTTL, "dispatcher-negative-cache-ttl", 2*time.Second, "how long an agent the registry does not know stays unknown without asking again (0: ask every time)")
	c.RegisterGatewayFlags(fs)
	fs.StringVar(&c.AgoraPeerDialects, "agora-peer-dialects", "", "reply dialect per peer: comma-separated peer=spec2024|std|pylib")
	fs.DurationVar(&c.SendTimeout, "send-timeout", 10*time.Second, "time-out of one outbound Agora request")
	fs.IntVar(&c.SendRetries, "send-retries", 2, "retries of an outbound request that cannot have reached the target")
	fs.BoolVar(&c.SendAllowPrivate, "send-allow-private", false, "let Send reach loopback and private addresses (tests, labs)")
	fs.IntVar(&c.SendMaxListed, "send-max-listed-protocols", 5, "protocols of a target's well-known document Send resolves at most")
	fs.IntVar(&c.SendMaxJudgeCalls, "send-max-judge-calls", 2, "LLM calls one Send may spend judging whether a listed protocol fits")
	fs.Int64Var(&c.MessageMaxBodyBytes, "message-max-body-bytes", 64<<10, "largest body_json of an agent-network message (send, reply, broadcast)")
	fs.DurationVar(&c.MessageTimeout, "message-timeout", 10*time.Second, "time limit of one agent-network send, reply, broadcast or close")
	fs.DurationVar(&c.DialogueRetention, "dialogue-retention", 30*24*time.Hour, "how long a dialogue is kept once its initiator closed it (a broadcast: once sent); the periodic sweep then removes it")
	fs.IntVar(&c.PaymentMaxOpen, "payment-max-open", 100, "open (authorized or reserved, not captured) ledger payments one payer may hold; CreatePayment past it is RESOURCE_EXHAUSTED")
	fs.DurationVar(&c.PaymentRetention, "payment-retention", 30*24*time.Hour, "how long a ledger payment not reserved (captured, or authorized and never used) is kept after its last change, and the daily spend records after their UTC day ended (today's and yesterday's always); the periodic sweep then removes them")
	fs.Int64Var(&c.MailboxMaxMessages, "mailbox-max-messages", 10_000, "unacknowledged messages an agent's mailbox holds; a send past it is refused for that agent")
	fs.Int64Var(&c.MailboxMaxBytes, "mailbox-max-bytes", 64<<20, "body bytes of the unacknowledged messages an agent's mailbox holds")
	fs.DurationVar(&c.MailboxRetention, "mailbox-retention", 24*time.Hour, "how long an acknowledged message stays in its mailbox before compaction")
	fs.DurationVar(&c.NotificationRetryFor, "notification-retry-for", time.Hour, "how long a network notification a full mailbox refused, or whose append failed, is retried (with backoff) before it is given up")
	fs.IntVar(&c.MailboxStreamBatch, "mailbox-stream-batch", 100, "most messages one receive-stream response carries")
	fs.DurationVar(&c.MailboxStreamKeepalive, "mailbox-stream-keepalive", 30*time.Second, "silence after which a receive stream sends a keepalive")
	fs.DurationVar(&c.MailboxStreamMaxDuration, "mailbox-stream-max-duration", time.Hour, "a receive stream open this long ends (DEADLINE_EXCEEDED) and the client reconnects")
	fs.BoolVar(&c.Journal, "dispatcher-journal", true, "make dispatcher.db's commits durable through its write-ahead journal, dispatcher.db-journal (part of the database: copy both); false: bbolt syncs every commit itself")
}

// RegisterGatewayFlags adds the flags of the hand-written routes, which a
// gateway process (`parley gateway`) serves too: --agora-max-body-bytes,
// --agora-peer-header (the Agora routes) and --mailbox-stream-write-timeout
// (the mailboxes' SSE route). RegisterFlags includes them.
func (c *Config) RegisterGatewayFlags(fs *flag.FlagSet) {
	fs.Int64Var(&c.AgoraMaxBodyBytes, "agora-max-body-bytes", 1<<20, "largest Agora request body")
	fs.StringVar(&c.AgoraPeerHeader, "agora-peer-header", "", "header set by a trusted proxy that identifies the Agora caller (e.g. X-Forwarded-For); default: the remote IP")
	fs.DurationVar(&c.MailboxStreamWriteTimeout, "mailbox-stream-write-timeout", 30*time.Second, "an SSE receive stream whose client does not take one write within this is cut off")
}

// ValidateGateway reports the bad values among the flags of
// RegisterGatewayFlags.
func (c *Config) ValidateGateway() error {
	var errs []error
	if c.AgoraMaxBodyBytes <= 0 {
		errs = append(errs, errors.New("--agora-max-body-bytes must be positive"))
	}
	if c.MailboxStreamWriteTimeout <= 0 {
		errs = append(errs, errors.New("--mailbox-stream-write-timeout must be positive"))
	}
	return errors.Join(errs...)
}

// PeerDialects parses AgoraPeerDialects into peer → dialect name.
func (c *Config) PeerDialects() (map[string]string, error) {
	out := map[string]string{}
	for _, item := range strings.Split(c.AgoraPeerDialects, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		peer, d, ok := strings.Cut(item, "=")
		switch d {
		case "spec2024", "std", "pylib":
		default:
			ok = false
		}
		if !ok || peer == "" {
			return nil, fmt.Errorf("--agora-peer-dialects: %q is not peer=spec2024|std|pylib", item)
		}
		out[peer] = d
	}
	return out, nil
}

// Validate reports every bad value at once.
func (c *Config) Validate() error {
	errs := []error{c.ValidateGateway()}
	if c.DataDir == "" {
		errs = append(errs, errors.New("--data must not be empty"))
	}
	positive := []struct {
		name string
		ok   bool
	}{
		{"--conversation-ttl", c.ConversationTTL > 0},
		{"--conversation-max-per-peer", c.MaxConversationsPerPeer > 0},
		{"--routine-max-steps", c.RoutineMaxSteps > 0},
		{"--routine-timeout", c.RoutineTimeout > 0},
		{"--routine-max-output-bytes", c.RoutineMaxOutputBytes > 0},
		{"--routine-max-tool-calls", c.RoutineMaxToolCalls > 0},
		{"--routine-max-alloc-bytes", c.RoutineMaxAllocBytes > 0},
		{"--routine-workers", c.RoutineWorkers > 0},
		{"--routine-memory-bytes", c.RoutineMemoryBytes > 0},
		{"--routine-kill-margin", c.RoutineKillMargin > 0},
		{"--routine-worker-cpu", c.RoutineWorkerCPU > 0},
		{"--routine-quarantine-after", c.QuarantineAfter > 0},
		{"--handler-timeout", c.HandlerTimeout > 0},
		{"--handler-queue", c.HandlerQueue > 0},
		{"--dispatcher-cache-ttl", c.CacheTTL > 0},
		{"--send-timeout", c.SendTimeout > 0},
		{"--send-retries", c.SendRetries >= 0},
		{"--send-max-listed-protocols", c.SendMaxListed > 0},
		{"--send-max-judge-calls", c.SendMaxJudgeCalls >= 0},
		{"--dispatcher-negative-cache-ttl", c.NegativeCacheTTL >= 0},
		{"--message-max-body-bytes", c.MessageMaxBodyBytes > 0},
		{"--message-timeout", c.MessageTimeout > 0},
		{"--dialogue-retention", c.DialogueRetention > 0},
		{"--payment-max-open", c.PaymentMaxOpen > 0},
		{"--payment-retention", c.PaymentRetention > 0},
		{"--mailbox-max-messages", c.MailboxMaxMessages > 0},
		{"--mailbox-max-bytes", c.MailboxMaxBytes > 0},
		{"--mailbox-retention", c.MailboxRetention > 0},
		{"--notification-retry-for", c.NotificationRetryFor > 0},
		{"--mailbox-stream-batch", c.MailboxStreamBatch > 0 && c.MailboxStreamBatch <= 1000},
		{"--mailbox-stream-keepalive", c.MailboxStreamKeepalive > 0},
		{"--mailbox-stream-max-duration", c.MailboxStreamMaxDuration > 0},
	}
	for _, p := range positive {
		if !p.ok {
			errs = append(errs, fmt.Errorf("%s must be positive", p.name))
		}
	}
	if c.RoutineWorkerCPU > 0 && c.RoutineWorkerCPU < 4*time.Second {
		// A worker's life must hold a run's soft limit (its budget plus
		// one to two seconds) with room to spare.
		errs = append(errs, fmt.Errorf("--routine-worker-cpu must be at least 4s, got %s", c.RoutineWorkerCPU))
	}
	if _, err := c.PeerDialects(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// doc is the one-service binary's --help.
var doc = envflag.Doc{
	Usage:   "dispatcher [flags]",
	Summary: "Run the Parley dispatcher alone: Agora envelopes in and out, routines, SDK agent streams and Agent Protocol steps. It calls the registry and the negotiator.",
	Examples: []string{
		"dispatcher --operator-token-file /run/parley/operator.token --registry-addr dns:///registry:9090 --negotiator-addr dns:///negotiator:9090",
		"dispatcher --data ./data/dispatcher --operator-token-file ./data/operator.token --grpc-addr 127.0.0.1:9091 --http-addr 127.0.0.1:8081 --registry-addr 127.0.0.1:9090 --negotiator-addr 127.0.0.1:9092",
	},
	Prefix: "PARLEY_",
}

// Load parses the one-service binary's flags from args, falling back to the
// environment (PARLEY_GRPC_ADDR, PARLEY_DATA, ...).
func Load(args []string, getenv func(string) string) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("dispatcher", flag.ContinueOnError)
	c.Flags.Register(fs, ":9090", ":8080", "/var/lib/parley")
	c.RegisterFlags(fs)
	fs.StringVar(&c.RegistryAddr, "registry-addr", "dns:///registry:9090", "registry gRPC address")
	fs.StringVar(&c.NegotiatorAddr, "negotiator-addr", "dns:///negotiator:9090", "negotiator gRPC address")
	pos, err := doc.ParseArgs(fs, args, getenv)
	if err != nil {
		return c, err
	}
	if len(pos) > 0 {
		return c, fmt.Errorf("dispatcher takes no arguments, got %q", pos)
	}
	return c, c.Validate()
}
