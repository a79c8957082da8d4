// Package demo replays the Agora weather story through real Agora
// envelopes: Alice, a tour-booking agent, needs forecasts; Bob, a weather
// service, answers them with a table tool holding a small dataset shipped
// here. Each lives on a Parley server (registry, dispatcher, negotiator);
// the two may be one server.
//
// Phases: natural-language queries (Alice's Send with no protocol: her LLM
// writes the query, Bob's LLM answers with his tool; skipped when the
// servers have no LLM), negotiation (Alice's first Send with her task's
// JSON Schemas negotiates a PD with Bob over Agora, deterministically),
// routines (each side's derived routine, installed by the negotiation), then
// N structured queries (Alice's Send, answered by routines on both sides).
// LLM use per phase is read from both negotiators' ledgers.
//
// With Options.Negotiation "llm" Alice's task has no schemas: the
// natural-language queries go on until the servers' negotiate threshold,
// where the two LLMs negotiate the PD over Agora and each side's
// programming LLM writes its routine (tested on its dispatcher); the
// negotiation and routines phases then carry those LLM costs.
package demo

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

// The demo's agents (before Options.AgentSuffix).
const (
	Alice = "clients/tours/agents/alice"
	Bob   = "clients/weather/agents/bob"
)

// PaperNLCostUSD is the paper's cost of one natural-language weather
// exchange, and PaperBreakEvenQuery the use from which its negotiated
// protocol paid off (specs/agora.md section 14).
const (
	PaperNLCostUSD      = 0.020
	PaperBreakEvenQuery = 3
)

// Task is Alice's task, with JSON Schemas so negotiation needs no LLM.
var Task = &negotiatorv1.TaskSpec{
	Name:             "weather-forecast",
	Description:      "Get the weather forecast for a date and a city.",
	InputSchemaJson:  []byte(`{"type":"object","required":["date","location"],"properties":{"date":{"type":"string","format":"date","description":"Day of the forecast, YYYY-MM-DD."},"location":{"type":"string","description":"City name."}}}`),
	OutputSchemaJson: []byte(`{"type":"object","required":["temperature","precipitation","weatherCondition"],"properties":{"temperature":{"type":"number","description":"Degrees Celsius."},"precipitation":{"type":"number","description":"Millimetres."},"weatherCondition":{"enum":["sunny","cloudy","rainy","snowy"]}}}`),
}

// Tool is Bob's tool. Its result names differ from Alice's in case
// (weather_condition): derivation maps them.
var Tool = &negotiatorv1.ToolSpec{
	Name:             "forecast_lookup",
	Description:      "Look up the forecast of a city on a date.",
	InputSchemaJson:  []byte(`{"type":"object","required":["date","location"],"properties":{"date":{"type":"string"},"location":{"type":"string"}}}`),
	OutputSchemaJson: []byte(`{"type":"object","properties":{"temperature":{"type":"number"},"precipitation":{"type":"number"},"weather_condition":{"enum":["sunny","cloudy","rainy","snowy"]},"error":{"type":"string"}}}`),
}

// nlTask is the task name of the natural-language phase: no PD names it,
// so those Sends go out in natural language.
const nlTask = "weather-question"

// TableEntries returns Bob's dataset as a table tool's entries: the
// canonical JSON of the arguments {"date","location"} to the result.
func TableEntries() string {
	m := map[string]any{}
	for _, f := range dataset {
		k, _ := json.Marshal(map[string]string{"date": f.Date, "location": f.Location})
		m[string(k)] = map[string]any{"temperature": f.Temperature, "precipitation": f.Precipitation, "weather_condition": f.Condition}
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// Endpoint is one side's Parley server.
type Endpoint struct {
	// Conn reaches its gRPC services (registry, dispatcher, negotiator).
	Conn grpc.ClientConnInterface
	// HTTPURL is its HTTP base URL (where /agora/... is served), as the
	// other side can reach it.
	HTTPURL string
}

// Options configure a run.
type Options struct {
	// Alice and Bob are the two sides' servers; they may be the same.
	Alice, Bob Endpoint
	// AgentSuffix is appended to the agent ids, so that a run on a server
	// that already ran the demo starts from fresh agents.
	AgentSuffix string
	// NLQueries is the number of natural-language queries (3 when zero).
	NLQueries int
	// StructuredQueries is the number of structured queries (10 when zero).
	StructuredQueries int
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// Transport describes where the envelopes travel, for the summary.
	Transport string
	// Negotiation is NegotiationDeterministic (the default: Alice's task
	// has JSON Schemas) or NegotiationLLM (it has none; the servers' LLMs
	// negotiate once the NLQueries reach their negotiate threshold, which
	// must be NLQueries+1, and write the routines, promoted at once).
	Negotiation string
}

// Options.Negotiation values.
const (
	NegotiationDeterministic = "deterministic"
	NegotiationLLM           = "llm"
)

// Phase is what one phase cost.
type Phase struct {
	Name             string  `json:"name"`
	Skipped          bool    `json:"skipped,omitempty"`
	Note             string  `json:"note,omitempty"`
	Queries          int     `json:"queries,omitempty"`
	LLMCalls         int64   `json:"llmCalls"`
	PromptTokens     int64   `json:"promptTokens"`
	CompletionTokens int64   `json:"completionTokens"`
	CostUSD          float64 `json:"costUsd"`
	// Correct counts structured answers that match the dataset.
	Correct int `json:"correct,omitempty"`
}

// Summary is the result of a run, printed by `parley demo weather --json`.
type Summary struct {
	Protocol struct {
		Name       string `json:"name"`
		AliceSHA1  string `json:"aliceSha1"`
		BobSHA1    string `json:"bobSha1"`
		SameHash   bool   `json:"sameHash"`
		SHA256     string `json:"sha256"`
		SizeBytes  int    `json:"sizeBytes"`
		Derivation string `json:"derivation"`
	} `json:"protocol"`
	Phases []Phase `json:"phases"`
	// BreakEvenQuery is the query number from which Parley's total cost is
	// at most natural language's; 0 if it never is.
	BreakEvenQuery int `json:"breakEvenQuery"`
	// BreakEvenBasis says where the natural-language cost per query came
	// from: "measured" (NL phase) or "paper" (0.020 USD).
	BreakEvenBasis      string  `json:"breakEvenBasis"`
	NLCostPerQueryUSD   float64 `json:"nlCostPerQueryUsd"`
	PaperBreakEvenQuery int     `json:"paperBreakEvenQuery"`
	Prices              string  `json:"prices"`
	Transport           string  `json:"transport"`
}

// side is one agent on its server.
type side struct {
	agent string
	reg   registryv1.RegistryServiceClient
	disp  dispatcherv1.DispatcherServiceClient
	neg   negotiatorv1.NegotiatorServiceClient
	seen  int // ledger entries already counted
}

func newSide(agent string, e Endpoint) *side {
	return &side{
		agent: agent,
		reg:   registryv1.NewRegistryServiceClient(e.Conn),
		disp:  dispatcherv1.NewDispatcherServiceClient(e.Conn),
		neg:   negotiatorv1.NewNegotiatorServiceClient(e.Conn),
	}
}

// ledger returns this agent's ledger entries.
func (s *side) ledger(ctx context.Context) ([]*negotiatorv1.LedgerEntry, error) {
	var entries []*negotiatorv1.LedgerEntry
	token := ""
	for {
		resp, err := s.neg.ListLedgerEntries(ctx, &negotiatorv1.ListLedgerEntriesRequest{Agent: s.agent, PageSize: 1000, PageToken: token})
		if err != nil {
			return nil, fmt.Errorf("ledger of %s: %w", s.agent, err)
		}
		entries = append(entries, resp.GetLedgerEntries()...)
		if token = resp.GetNextPageToken(); token == "" {
			return entries, nil
		}
	}
}

// phase adds the ledger entries both sides made since the last phase,
// priced at the paper's prices.
func phase(ctx context.Context, name string, sides ...*side) (Phase, error) {
	p, _, err := phases(ctx, name, "", "", sides...)
	return p, err
}

// phases is phase with the entries of role split off into a second phase
// named splitName (role "" splits nothing).
func phases(ctx context.Context, name, role, splitName string, sides ...*side) (Phase, Phase, error) {
	p, q := Phase{Name: name}, Phase{Name: splitName}
	for _, s := range sides {
		entries, err := s.ledger(ctx)
		if err != nil {
			return p, q, err
		}
		for _, e := range entries[min(s.seen, len(entries)):] {
			to := &p
			if role != "" && e.GetRole() == role {
				to = &q
			}
			to.LLMCalls++
			to.PromptTokens += e.GetPromptTokens()
			to.CompletionTokens += e.GetCompletionTokens()
			to.CostUSD += costUSD(e)
		}
		s.seen = len(entries)
	}
	return p, q, nil
}

// Paper prices of gpt-4o, in USD per million tokens, for entries of a model
// the negotiator has no price for.
const (
	paperPromptUSD     = 5
	paperCompletionUSD = 15
)

// costUSD is what the negotiator's ledger charged for e, or, for a model it
// has no price for, e's tokens at the paper's gpt-4o prices.
func costUSD(e *negotiatorv1.LedgerEntry) float64 {
	if c := e.GetCostMicroUsd(); c > 0 {
		return float64(c) / 1e6
	}
	return (float64(e.GetPromptTokens())*paperPromptUSD + float64(e.GetCompletionTokens())*paperCompletionUSD) / 1e6
}

func logf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

func inputOf(f forecast) string {
	b, _ := json.Marshal(map[string]string{"date": f.Date, "location": f.Location})
	return string(b)
}

func ignoreExists(err error) error {
	if status.Code(err) == codes.AlreadyExists {
		return nil
	}
	return err
}

// setUp creates both agents and Bob's tool.
func setUp(ctx context.Context, alice, bob *side) error {
	for _, s := range []*side{alice, bob} {
		parent, id, _ := strings.Cut(strings.TrimPrefix(s.agent, "clients/"), "/agents/")
		_, err := s.reg.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/" + parent, AgentId: id, Agent: &registryv1.Agent{DisplayName: id}})
		if err := ignoreExists(err); err != nil {
			return fmt.Errorf("create %s: %w", s.agent, err)
		}
	}
	_, err := bob.disp.SetTool(ctx, &dispatcherv1.SetToolRequest{Tool: &dispatcherv1.Tool{
		Name:             bob.agent + "/tools/" + Tool.GetName(),
		Description:      Tool.GetDescription(),
		Kind:             &dispatcherv1.Tool_Table{Table: &dispatcherv1.TableTool{EntriesJson: TableEntries()}},
		InputSchemaJson:  string(Tool.GetInputSchemaJson()),
		OutputSchemaJson: string(Tool.GetOutputSchemaJson()),
	}})
	if err != nil {
		return fmt.Errorf("set Bob's tool: %w", err)
	}
	return nil
}

// sendStructured sends Alice's task for f, with its schemas unless
// schemaless (the LLM negotiation's task).
func (s *side) sendStructured(ctx context.Context, target string, f forecast, schemaless bool) (*dispatcherv1.SendResponse, bool, error) {
	req := &dispatcherv1.SendRequest{
		Agent: s.agent, TargetUrl: target, Task: Task.GetName(), TaskDescription: Task.GetDescription(), TaskDataJson: inputOf(f),
		InputSchemaJson: string(Task.GetInputSchemaJson()), OutputSchemaJson: string(Task.GetOutputSchemaJson()),
	}
	if schemaless {
		req.InputSchemaJson, req.OutputSchemaJson = "", ""
	}
	r, err := s.disp.Send(ctx, req)
	if err != nil {
		return nil, false, err
	}
	if r.GetStatus() != "success" {
		return r, false, fmt.Errorf("bob answered %s: %s", r.GetStatus(), r.GetError())
	}
	var got struct {
		Temperature      float64 `json:"temperature"`
		Precipitation    float64 `json:"precipitation"`
		WeatherCondition string  `json:"weatherCondition"`
	}
	ok := json.Unmarshal([]byte(r.GetResultJson()), &got) == nil &&
		got.Temperature == f.Temperature && got.Precipitation == f.Precipitation && got.WeatherCondition == f.Condition
	return r, ok, nil
}

// heldHash returns the SHA-1 of the PD bytes s's registry holds for hash.
func (s *side) heldHash(ctx context.Context, hash string) (string, []byte, error) {
	pd, err := s.reg.GetProtocol(ctx, &registryv1.GetProtocolRequest{Name: "protocols/" + hash})
	if err != nil {
		return "", nil, fmt.Errorf("%s's registry: %w", s.agent, err)
	}
	sum := sha1.Sum(pd.GetContent())
	return hex.EncodeToString(sum[:]), pd.GetContent(), nil
}

// Weather runs the demo.
func Weather(ctx context.Context, opts Options) (Summary, error) {
	var sum Summary
	if opts.NLQueries <= 0 {
		opts.NLQueries = 3
	}
	if opts.StructuredQueries <= 0 {
		opts.StructuredQueries = 10
	}
	llmNeg := opts.Negotiation == NegotiationLLM
	if opts.Negotiation != "" && opts.Negotiation != NegotiationDeterministic && !llmNeg {
		return sum, fmt.Errorf("negotiation %q: want %s or %s", opts.Negotiation, NegotiationDeterministic, NegotiationLLM)
	}
	// The NL phase's task: with an LLM negotiation it is Alice's task (no
	// schemas), so its Sends count towards the negotiate threshold.
	task := nlTask
	if llmNeg {
		task = Task.GetName()
	}
	alice, bob := newSide(Alice+opts.AgentSuffix, opts.Alice), newSide(Bob+opts.AgentSuffix, opts.Bob)
	if err := setUp(ctx, alice, bob); err != nil {
		return sum, err
	}
	if _, err := phase(ctx, "start", alice, bob); err != nil {
		return sum, err
	}
	target := strings.TrimSuffix(opts.Bob.HTTPURL, "/") + "/agora/weather/" + strings.TrimPrefix(bob.agent, "clients/weather/agents/")
	sum.Transport = opts.Transport
	logf(opts.Log, "Alice (%s) sends to Bob at %s", alice.agent, target)

	// Phase 1: natural language.
	nl := Phase{Name: "natural-language", Queries: opts.NLQueries}
	for i := range opts.NLQueries {
		r, err := alice.disp.Send(ctx, &dispatcherv1.SendRequest{Agent: alice.agent, TargetUrl: target, Task: task, TaskDescription: Task.GetDescription(), TaskDataJson: inputOf(dataset[i%len(dataset)])})
		if err != nil {
			return sum, fmt.Errorf("natural-language query %d: %w", i+1, err)
		}
		if r.GetNegotiation() != "" {
			return sum, fmt.Errorf("natural-language query %d already negotiated: the servers' negotiate threshold must be %d (--negotiation-thresholds '*@*=1/%d/10')", i+1, opts.NLQueries+1, opts.NLQueries+1)
		}
		if r.GetStatus() != "success" {
			if llmNeg {
				return sum, fmt.Errorf("natural-language query %d: Bob answered %s: %s (an LLM negotiation needs an LLM on both servers)", i+1, r.GetStatus(), r.GetError())
			}
			if i == 0 && strings.Contains(r.GetError(), "no LLM is configured") {
				nl.Skipped, nl.Queries = true, 0
				nl.Note = "no LLM configured (--llm-provider); natural-language queries skipped"
				break
			}
			return sum, fmt.Errorf("natural-language query %d: Bob answered %s: %s", i+1, r.GetStatus(), r.GetError())
		}
	}
	p, err := phase(ctx, nl.Name, alice, bob)
	if err != nil {
		return sum, err
	}
	if !nl.Skipped {
		p.Queries = nl.Queries
		nl = p
		logf(opts.Log, "phase 1, natural language: %d queries, %d LLM calls, %.4f USD", nl.Queries, nl.LLMCalls, nl.CostUSD)
	} else {
		logf(opts.Log, "phase 1, natural language: skipped, no LLM is configured")
	}
	sum.Phases = append(sum.Phases, nl)

	// Phase 2: negotiation, run by Alice's first structured Send.
	first, _, err := alice.sendStructured(ctx, target, dataset[0], llmNeg)
	if err != nil {
		return sum, fmt.Errorf("first structured query: %w", err)
	}
	if first.GetNegotiation() == "" || first.GetProtocolHash() == "" {
		return sum, fmt.Errorf("the first structured query negotiated nothing (path %s, protocol %q, negotiation %q)", first.GetPath(), first.GetProtocolHash(), first.GetNegotiation())
	}
	n, err := alice.neg.GetNegotiation(ctx, &negotiatorv1.GetNegotiationRequest{Name: first.GetNegotiation()})
	if err != nil {
		return sum, err
	}
	// The routines an LLM negotiation has the programming LLMs write, at
	// acceptance, belong to the routines phase.
	neg, written, err := phases(ctx, "negotiation", "programming", "routines", alice, bob)
	if err != nil {
		return sum, err
	}
	neg.Queries = 1
	neg.Note = fmt.Sprintf("%s, %d messages over Agora, then the first query", n.GetMode(), n.GetRounds())
	sum.Phases = append(sum.Phases, neg)
	hash := first.GetProtocolHash()
	aliceHash, pd, err := alice.heldHash(ctx, hash)
	if err != nil {
		return sum, err
	}
	bobHash, _, err := bob.heldHash(ctx, hash)
	if err != nil {
		return sum, err
	}
	sum.Protocol.Name = Task.GetName()
	sum.Protocol.AliceSHA1, sum.Protocol.BobSHA1 = aliceHash, bobHash
	sum.Protocol.SameHash = aliceHash == hash && bobHash == hash
	sum.Protocol.SHA256 = n.GetProtocolSha256Hex()
	sum.Protocol.SizeBytes = len(pd)
	sum.Protocol.Derivation = "deterministic, from Alice's task schemas; Bob's tool schemas checked"
	if n.GetMode() != negotiatorv1.NegotiationMode_NEGOTIATION_MODE_DETERMINISTIC {
		sum.Protocol.Derivation = n.GetMode().String()
	}
	logf(opts.Log, "phase 2, negotiation: Alice holds %s, Bob holds %s", aliceHash, bobHash)
	if !sum.Protocol.SameHash {
		return sum, errors.New("alice and Bob hold different protocol hashes")
	}

	// Phase 3: the routines the negotiation installed on both sides.
	ar, err := alice.disp.GetRoutine(ctx, &dispatcherv1.GetRoutineRequest{Name: alice.agent + "/routines/" + hash})
	if err != nil {
		return sum, fmt.Errorf("alice's routine: %w", err)
	}
	br, err := bob.disp.GetRoutine(ctx, &dispatcherv1.GetRoutineRequest{Name: bob.agent + "/routines/" + hash})
	if err != nil {
		return sum, fmt.Errorf("bob's routine: %w", err)
	}
	rt, err := phase(ctx, "routines", alice, bob)
	if err != nil {
		return sum, err
	}
	rt.LLMCalls += written.LLMCalls
	rt.PromptTokens += written.PromptTokens
	rt.CompletionTokens += written.CompletionTokens
	rt.CostUSD += written.CostUSD
	how := "derived from the schemas"
	if llmNeg {
		how = "written by the programming LLMs, tested on each dispatcher,"
	}
	rt.Note = fmt.Sprintf("%s and installed by the negotiation: Alice send/parse (%d bytes, v%d), Bob reply (%d bytes, v%d)",
		how, len(ar.GetSource()), ar.GetVersion(), len(br.GetSource()), br.GetVersion())
	sum.Phases = append(sum.Phases, rt)
	logf(opts.Log, "phase 3, routines: %s", rt.Note)

	// Phase 4: structured queries, answered by routines on both sides.
	st := Phase{Name: "structured", Queries: opts.StructuredQueries}
	byRoutine := 0
	for i := range opts.StructuredQueries {
		r, ok, err := alice.sendStructured(ctx, target, dataset[(i+1)%len(dataset)], llmNeg)
		if err != nil {
			return sum, fmt.Errorf("structured query %d: %w", i+1, err)
		}
		if r.GetProtocolHash() != hash {
			return sum, fmt.Errorf("structured query %d used protocol %q, not %s", i+1, r.GetProtocolHash(), hash)
		}
		if ok {
			st.Correct++
		}
		if r.GetPath() == "routine" {
			byRoutine++
		}
	}
	p, err = phase(ctx, st.Name, alice, bob)
	if err != nil {
		return sum, err
	}
	st.LLMCalls, st.PromptTokens, st.CompletionTokens, st.CostUSD = p.LLMCalls, p.PromptTokens, p.CompletionTokens, p.CostUSD
	st.Note = fmt.Sprintf("%d of %d sent and read by Alice's routine", byRoutine, st.Queries)
	sum.Phases = append(sum.Phases, st)
	logf(opts.Log, "phase 4, structured: %d queries, %d correct, %d LLM calls", st.Queries, st.Correct, st.LLMCalls)

	// Break-even: the first query k where k NL exchanges cost at least the
	// one-time Parley cost plus k structured queries.
	sum.PaperBreakEvenQuery = PaperBreakEvenQuery
	sum.Prices = "USD per 1M tokens in/out: gpt-4o 5/15, llama-3-405b 5/10, gemini-1.5-pro 3.5/10.5 (other models at gpt-4o's)"
	sum.NLCostPerQueryUSD, sum.BreakEvenBasis = PaperNLCostUSD, "paper"
	if !nl.Skipped && nl.Queries > 0 && nl.CostUSD > 0 {
		sum.NLCostPerQueryUSD, sum.BreakEvenBasis = nl.CostUSD/float64(nl.Queries), "measured"
	}
	oneTime := neg.CostUSD + rt.CostUSD
	perQuery := st.CostUSD / float64(st.Queries)
	if sum.NLCostPerQueryUSD > perQuery {
		for k := 1; k <= 1_000_000; k++ {
			if float64(k)*sum.NLCostPerQueryUSD >= oneTime+float64(k)*perQuery {
				sum.BreakEvenQuery = k
				break
			}
		}
	}
	logf(opts.Log, "break-even: query %d (%s NL cost %.4f USD per query)", sum.BreakEvenQuery, sum.BreakEvenBasis, sum.NLCostPerQueryUSD)
	return sum, nil
}
