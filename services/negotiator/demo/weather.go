// Package demo replays the Agora weather story with Parley's negotiator:
// Alice, a tour-booking agent, needs forecasts; Bob, a weather service,
// answers them with a tool reading a small dataset shipped here.
//
// Phases: natural-language queries (only with an LLM configured), a
// deterministic negotiation through two negotiators over gRPC on loopback
// (Alice's and Bob's, each with its own store, as two separate servers
// would be), routine synthesis on both sides, then N structured queries
// answered by the routines with no LLM.
//
// The structured queries run through the negotiator's Starlark sandbox via
// the Transport interface, in process: the Agora HTTP path (envelopes,
// conversations, routines installed in the dispatcher) belongs to the
// dispatcher. Swap Transport for one that sends envelopes through a real
// `parley serve` once the dispatcher's Send exists.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/services/negotiator/config"
	"github.com/parleyhq/parley/services/negotiator/internal/inproc"
	"github.com/parleyhq/parley/services/negotiator/internal/ledger"
	"github.com/parleyhq/parley/services/negotiator/internal/sandbox"
)

// The demo's agents.
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

// LookupForecast is Bob's tool over the dataset: JSON arguments in, JSON
// result out.
func LookupForecast(_ context.Context, name string, args []byte) ([]byte, error) {
	if name != Tool.GetName() {
		return nil, fmt.Errorf("unknown tool %q", name)
	}
	var a struct{ Date, Location string }
	if err := json.Unmarshal(args, &a); err != nil {
		return nil, err
	}
	for _, f := range dataset {
		if f.Location == a.Location && f.Date == a.Date {
			return json.Marshal(map[string]any{"temperature": f.Temperature, "precipitation": f.Precipitation, "weather_condition": f.Condition})
		}
	}
	return json.Marshal(map[string]string{"error": "Unsupported location"})
}

// Transport carries Alice's structured query body to Bob and returns his
// reply body.
type Transport interface {
	Exchange(ctx context.Context, body []byte) ([]byte, error)
}

// routineTransport answers with Bob's routine in the sandbox, in process.
type routineTransport struct{ routine string }

func (r routineTransport) Exchange(ctx context.Context, body []byte) ([]byte, error) {
	return sandbox.Call(ctx, r.routine, "reply", []json.RawMessage{body, json.RawMessage(`{}`)}, LookupForecast, sandbox.Limits{})
}

// Options configure a run.
type Options struct {
	// LLM configures both negotiators; no provider skips the
	// natural-language phase.
	LLM config.LLM
	// NLQueries is the number of natural-language queries (3 when zero).
	NLQueries int
	// StructuredQueries is the number of structured queries (10 when zero).
	StructuredQueries int
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// Transport overrides the in-process routine transport.
	Transport Transport
}

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

// meter reads new ledger entries of both negotiators after each phase.
type meter struct {
	handles []*inproc.Negotiator
	seen    []int
}

func (m *meter) phase(ctx context.Context, name string) (Phase, error) {
	p := Phase{Name: name}
	prices := ledger.DefaultPrices()
	for i, h := range m.handles {
		var entries []*negotiatorv1.LedgerEntry
		token := ""
		for {
			resp, err := h.Client.ListLedgerEntries(ctx, &negotiatorv1.ListLedgerEntriesRequest{PageSize: 1000, PageToken: token})
			if err != nil {
				return p, err
			}
			entries = append(entries, resp.GetLedgerEntries()...)
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
		}
		for _, e := range entries[m.seen[i]:] {
			p.LLMCalls++
			p.PromptTokens += e.GetPromptTokens()
			p.CompletionTokens += e.GetCompletionTokens()
			price, ok := prices.Lookup(e.GetModel())
			if !ok {
				price = prices["gpt-4o"]
			}
			p.CostUSD += float64(price.CostMicroUSD(e.GetPromptTokens(), e.GetCompletionTokens())) / 1e6
		}
		m.seen[i] = len(entries)
	}
	return p, nil
}

func logf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
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
	aliceN, err := inproc.Start(ctx, opts.LLM)
	if err != nil {
		return sum, fmt.Errorf("start Alice's negotiator: %w", err)
	}
	defer aliceN.Close()
	bobN, err := inproc.Start(ctx, opts.LLM)
	if err != nil {
		return sum, fmt.Errorf("start Bob's negotiator: %w", err)
	}
	defer bobN.Close()
	m := &meter{handles: []*inproc.Negotiator{aliceN, bobN}, seen: []int{0, 0}}
	alice, bob := aliceN.Client, bobN.Client

	// Phase 1: natural language.
	nl := Phase{Name: "natural-language", Queries: opts.NLQueries}
	if opts.LLM.Provider == "" {
		nl.Skipped, nl.Queries = true, 0
		nl.Note = "no LLM configured (--llm-provider); natural-language queries skipped"
		logf(opts.Log, "phase 1, natural language: skipped, no LLM is configured")
	} else {
		for i := range opts.NLQueries {
			if err := nlQuery(ctx, alice, bob, dataset[i%len(dataset)]); err != nil {
				return sum, fmt.Errorf("natural-language query %d: %w", i+1, err)
			}
		}
		p, err := m.phase(ctx, nl.Name)
		if err != nil {
			return sum, err
		}
		p.Queries = opts.NLQueries
		nl = p
		logf(opts.Log, "phase 1, natural language: %d queries, %d LLM calls, %.4f USD", nl.Queries, nl.LLMCalls, nl.CostUSD)
	}
	sum.Phases = append(sum.Phases, nl)

	// Phase 2: negotiation, relayed between the two negotiators.
	sender, receiver, err := negotiate(ctx, alice, bob)
	if err != nil {
		return sum, err
	}
	neg, err := m.phase(ctx, "negotiation")
	if err != nil {
		return sum, err
	}
	neg.Note = fmt.Sprintf("%d messages, %s", sender.GetRounds(), sender.GetMode())
	sum.Phases = append(sum.Phases, neg)
	sum.Protocol.AliceSHA1 = sender.GetProtocolSha1Hex()
	sum.Protocol.BobSHA1 = receiver.GetProtocolSha1Hex()
	sum.Protocol.SameHash = sum.Protocol.AliceSHA1 != "" && sum.Protocol.AliceSHA1 == sum.Protocol.BobSHA1
	sum.Protocol.SHA256 = sender.GetProtocolSha256Hex()
	sum.Protocol.SizeBytes = len(sender.GetProtocol())
	sum.Protocol.Name = Task.GetName()
	sum.Protocol.Derivation = "deterministic, from Alice's task schemas; Bob's tool schemas checked"
	logf(opts.Log, "phase 2, negotiation: Alice holds %s, Bob holds %s", sum.Protocol.AliceSHA1, sum.Protocol.BobSHA1)
	if !sum.Protocol.SameHash {
		return sum, errors.New("Alice and Bob hold different protocol hashes")
	}

	// Phase 3: routines on both sides.
	aliceRoutine, err := alice.SynthesizeRoutine(ctx, &negotiatorv1.SynthesizeRoutineRequest{Agent: Alice, Peer: Bob, Protocol: sender.GetProtocol(), Side: negotiatorv1.RoutineSide_ROUTINE_SIDE_SENDER, Task: Task})
	if err != nil {
		return sum, fmt.Errorf("Alice's routine: %w", err)
	}
	bobRoutine, err := bob.SynthesizeRoutine(ctx, &negotiatorv1.SynthesizeRoutineRequest{Agent: Bob, Peer: Alice, Protocol: receiver.GetProtocol(), Side: negotiatorv1.RoutineSide_ROUTINE_SIDE_RECEIVER, Tools: []*negotiatorv1.ToolSpec{Tool}})
	if err != nil {
		return sum, fmt.Errorf("Bob's routine: %w", err)
	}
	rt, err := m.phase(ctx, "routines")
	if err != nil {
		return sum, err
	}
	rt.Note = fmt.Sprintf("Alice %s %s (%d examples), Bob %s %s (%d examples)",
		aliceRoutine.GetOrigin(), aliceRoutine.GetState(), aliceRoutine.GetExamplesPassed(),
		bobRoutine.GetOrigin(), bobRoutine.GetState(), bobRoutine.GetExamplesPassed())
	sum.Phases = append(sum.Phases, rt)
	logf(opts.Log, "phase 3, routines: %s", rt.Note)

	// Phase 4: structured queries through the routines.
	transport := opts.Transport
	sum.Transport = "in-process: Alice's and Bob's routines in the negotiator's Starlark sandbox (the Agora HTTP path needs the dispatcher)"
	if transport == nil {
		transport = routineTransport{routine: bobRoutine.GetSource()}
	} else {
		sum.Transport = "custom"
	}
	st := Phase{Name: "structured", Queries: opts.StructuredQueries}
	for i := range opts.StructuredQueries {
		ok, err := structuredQuery(ctx, aliceRoutine.GetSource(), transport, dataset[i%len(dataset)])
		if err != nil {
			return sum, fmt.Errorf("structured query %d: %w", i+1, err)
		}
		if ok {
			st.Correct++
		}
	}
	p, err := m.phase(ctx, st.Name)
	if err != nil {
		return sum, err
	}
	st.LLMCalls, st.PromptTokens, st.CompletionTokens, st.CostUSD = p.LLMCalls, p.PromptTokens, p.CompletionTokens, p.CostUSD
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

func inputOf(f forecast) []byte {
	b, _ := json.Marshal(map[string]string{"date": f.Date, "location": f.Location})
	return b
}

// nlQuery is one natural-language exchange: Alice's LLM writes the query,
// Bob's LLM answers it (calling his tool when it asks to), Alice's LLM
// parses the answer into her task's output.
func nlQuery(ctx context.Context, alice, bob negotiatorv1.NegotiatorServiceClient, f forecast) error {
	q, err := alice.ComposeQuery(ctx, &negotiatorv1.ComposeQueryRequest{Agent: Alice, Peer: Bob, Task: Task, TaskInputJson: inputOf(f)})
	if err != nil {
		return fmt.Errorf("compose: %w", err)
	}
	var results []*negotiatorv1.ToolResult
	var body []byte
	for range 6 {
		r, err := bob.ReplyNaturalLanguage(ctx, &negotiatorv1.ReplyNaturalLanguageRequest{
			Agent: Bob, Peer: Alice, Instructions: "You are Bob, a weather service. Answer forecast questions using your tool.",
			Query: q.GetBody(), Tools: []*negotiatorv1.ToolSpec{Tool}, ToolResults: results,
		})
		if err != nil {
			return fmt.Errorf("reply: %w", err)
		}
		if call := r.GetToolCall(); call != nil {
			res, err := LookupForecast(ctx, call.GetName(), call.GetArgumentsJson())
			if err != nil {
				res, _ = json.Marshal(map[string]string{"error": err.Error()})
			}
			results = append(results, &negotiatorv1.ToolResult{Name: call.GetName(), ArgumentsJson: call.GetArgumentsJson(), ResultJson: res})
			continue
		}
		body = r.GetBody()
		break
	}
	if body == nil {
		return errors.New("Bob's LLM kept calling tools")
	}
	if _, err := alice.ParseReply(ctx, &negotiatorv1.ParseReplyRequest{Agent: Alice, Peer: Bob, Task: Task, Reply: body}); err != nil {
		return fmt.Errorf("parse: %w", err)
	}
	return nil
}

// negotiate relays the negotiation between Alice's and Bob's negotiators
// as their dispatchers would.
func negotiate(ctx context.Context, alice, bob negotiatorv1.NegotiatorServiceClient) (sender, receiver *negotiatorv1.Negotiation, err error) {
	sender, err = alice.StartNegotiation(ctx, &negotiatorv1.StartNegotiationRequest{Agent: Alice, Peer: Bob, Task: Task})
	if err != nil {
		return nil, nil, fmt.Errorf("start negotiation: %w", err)
	}
	receiver, err = bob.ReceiveNegotiationMessage(ctx, &negotiatorv1.ReceiveNegotiationMessageRequest{Agent: Bob, Peer: Alice, BodyJson: sender.GetOutboundMessageJson(), Tools: []*negotiatorv1.ToolSpec{Tool}})
	if err != nil {
		return nil, nil, fmt.Errorf("Bob receives: %w", err)
	}
	open := negotiatorv1.NegotiationState_NEGOTIATION_STATE_OPEN
	for range 10 {
		if len(receiver.GetOutboundMessageJson()) == 0 {
			break
		}
		if sender, err = alice.ReceiveNegotiationMessage(ctx, &negotiatorv1.ReceiveNegotiationMessageRequest{Name: sender.GetName(), BodyJson: receiver.GetOutboundMessageJson()}); err != nil {
			return nil, nil, fmt.Errorf("Alice receives: %w", err)
		}
		if sender.GetState() != open || len(sender.GetOutboundMessageJson()) == 0 || receiver.GetState() != open {
			break
		}
		if receiver, err = bob.ReceiveNegotiationMessage(ctx, &negotiatorv1.ReceiveNegotiationMessageRequest{Name: receiver.GetName(), BodyJson: sender.GetOutboundMessageJson()}); err != nil {
			return nil, nil, fmt.Errorf("Bob receives: %w", err)
		}
	}
	accepted := negotiatorv1.NegotiationState_NEGOTIATION_STATE_ACCEPTED
	if sender.GetState() != accepted || receiver.GetState() != accepted {
		return nil, nil, fmt.Errorf("negotiation ended %v / %v: %s %s", sender.GetState(), receiver.GetState(), sender.GetFailureReason(), receiver.GetFailureReason())
	}
	return sender, receiver, nil
}

// structuredQuery sends one query with Alice's routine and checks the
// parsed answer against the dataset.
func structuredQuery(ctx context.Context, aliceRoutine string, t Transport, f forecast) (bool, error) {
	body, err := sandbox.Call(ctx, aliceRoutine, "send", []json.RawMessage{inputOf(f)}, nil, sandbox.Limits{})
	if err != nil {
		return false, fmt.Errorf("send: %w", err)
	}
	reply, err := t.Exchange(ctx, body)
	if err != nil {
		return false, fmt.Errorf("exchange: %w", err)
	}
	out, err := sandbox.Call(ctx, aliceRoutine, "parse", []json.RawMessage{reply}, nil, sandbox.Limits{})
	if err != nil {
		return false, fmt.Errorf("parse: %w", err)
	}
	var got struct {
		Temperature      float64 `json:"temperature"`
		Precipitation    float64 `json:"precipitation"`
		WeatherCondition string  `json:"weatherCondition"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		return false, err
	}
	return got.Temperature == f.Temperature && got.Precipitation == f.Precipitation && got.WeatherCondition == f.Condition, nil
}
