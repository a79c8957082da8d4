// Package benchnet is a benchmark harness, not part of the product. It
// replays a scaled-down version of the Agora paper's agent network (servers
// with tools, users with Pareto-distributed query budgets, three LLMs at the
// paper's prices) against in-process negotiators and the scripted LLM
// fixture llmtest.FakeServer, whose token counts come from the request and
// reply text. It compares three strategies on the same query sequence:
//
//   - nl-only: every query is a natural-language exchange (compose, reply
//     with a tool call, reply, parse);
//   - parley-paper-thresholds: natural language until the paper's
//     thresholds (look a PD up after 3 conversations per (user, server),
//     negotiate after 5), then routines;
//   - parley-first-contact: deterministic negotiation on the first
//     conversation when both sides declare schemas, then routines.
//
// Free-text servers (no schemas) stay on natural language in every
// strategy: the harness does not script LLM negotiations.
//
// bench/negotiator is its command; figures go to docs/benchmarks.md.
package benchnet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"google.golang.org/protobuf/proto"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/services/negotiator/config"
	"github.com/parleyhq/parley/services/negotiator/negotiatortest"
	"github.com/parleyhq/parley/services/negotiator/negotiatortest/llmtest"
	"github.com/parleyhq/parley/services/negotiator/negotiatortest/routinetest"
)

// Strategies, in the order they run.
const (
	NLOnly         = "nl-only"
	PaperThreshold = "parley-paper-thresholds"
	FirstContact   = "parley-first-contact"
)

// Models are the paper's three LLMs with their share of the nodes.
var Models = []struct {
	Name  string
	Share float64
}{{"gpt-4o", 0.38}, {"llama-3-405b", 0.32}, {"gemini-1.5-pro", 0.30}}

// Options configure a run. Zero values take the defaults shown.
type Options struct {
	Agents          int     // 20, servers included
	Servers         int     // 5
	FreeTextServers int     // 0: how many servers have no schemas
	Queries         int     // 300
	Seed            uint64  // 1
	ParetoAlpha     float64 // 1.16 (the 80/20 rule)
	Window          int     // 50: queries per share-of-LLM window
	Log             io.Writer
}

func (o Options) withDefaults() Options {
	if o.Agents == 0 {
		o.Agents = 20
	}
	if o.Servers == 0 {
		o.Servers = 5
	}
	if o.Queries == 0 {
		o.Queries = 300
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.ParetoAlpha == 0 {
		o.ParetoAlpha = 1.16
	}
	if o.Window == 0 {
		o.Window = 50
	}
	return o
}

// Result is one strategy's outcome.
type Result struct {
	Strategy          string             `json:"strategy"`
	CostUSD           float64            `json:"costUsd"`
	LLMCalls          int64              `json:"llmCalls"`
	PromptTokens      int64              `json:"promptTokens"`
	CompletionTokens  int64              `json:"completionTokens"`
	CostByRoleUSD     map[string]float64 `json:"costByRoleUsd"`
	QueriesNeedingLLM int                `json:"queriesNeedingLlm"`
	Negotiations      int                `json:"negotiations"`
	// LLMShareByWindow is the share of queries that made at least one LLM
	// call, per window of Options.Window queries.
	LLMShareByWindow []float64 `json:"llmShareByWindow"`
	Elapsed          string    `json:"elapsed"`
}

// Report is the outcome of a run.
type Report struct {
	Agents, Servers, FreeTextServers, Users, Queries int
	Seed                                             uint64
	// Budgets are the users' query budgets, largest first.
	Budgets []int    `json:"budgets"`
	Results []Result `json:"results"`
	// Ratio is NL-only cost over each Parley strategy's; +Inf (reported
	// as -1 in JSON) when a strategy made no LLM call.
	Ratio map[string]float64 `json:"ratio"`
}

type service struct {
	task *negotiatorv1.TaskSpec
	tool *negotiatorv1.ToolSpec
}

func (s service) typed() bool { return len(s.task.GetInputSchemaJson()) > 0 }

var typedServices = []service{
	{
		task: &negotiatorv1.TaskSpec{Name: "weather-forecast", Description: "Weather for a date and a city.",
			InputSchemaJson:  []byte(`{"type":"object","required":["date","location"],"properties":{"date":{"type":"string","format":"date"},"location":{"type":"string"}}}`),
			OutputSchemaJson: []byte(`{"type":"object","required":["temperature","precipitation","weatherCondition"],"properties":{"temperature":{"type":"number"},"precipitation":{"type":"number"},"weatherCondition":{"enum":["sunny","cloudy","rainy","snowy"]}}}`)},
		tool: &negotiatorv1.ToolSpec{Name: "forecast_lookup", Description: "Forecast of a city on a date.",
			InputSchemaJson:  []byte(`{"type":"object","required":["date","location"],"properties":{"date":{"type":"string"},"location":{"type":"string"}}}`),
			OutputSchemaJson: []byte(`{"type":"object","properties":{"temperature":{"type":"number"},"precipitation":{"type":"number"},"weather_condition":{"enum":["sunny","cloudy","rainy","snowy"]}}}`)},
	},
	{
		task: &negotiatorv1.TaskSpec{Name: "stock-level", Description: "Units of an item in a warehouse.",
			InputSchemaJson:  []byte(`{"type":"object","required":["sku"],"properties":{"sku":{"type":"string"},"warehouse":{"type":"string"}}}`),
			OutputSchemaJson: []byte(`{"type":"object","required":["inStock","quantity"],"properties":{"inStock":{"type":"boolean"},"quantity":{"type":"integer"}}}`)},
		tool: &negotiatorv1.ToolSpec{Name: "inventory", Description: "Inventory of an item.",
			InputSchemaJson:  []byte(`{"type":"object","required":["sku"],"properties":{"sku":{"type":"string"},"warehouse":{"type":"string"}}}`),
			OutputSchemaJson: []byte(`{"type":"object","properties":{"in_stock":{"type":"boolean"},"quantity":{"type":"integer"}}}`)},
	},
	{
		task: &negotiatorv1.TaskSpec{Name: "currency-conversion", Description: "Convert an amount between currencies.",
			InputSchemaJson:  []byte(`{"type":"object","required":["from","to","amount"],"properties":{"from":{"type":"string"},"to":{"type":"string"},"amount":{"type":"number"}}}`),
			OutputSchemaJson: []byte(`{"type":"object","required":["converted","rate"],"properties":{"converted":{"type":"number"},"rate":{"type":"number"}}}`)},
		tool: &negotiatorv1.ToolSpec{Name: "fx", Description: "Exchange rates.",
			InputSchemaJson:  []byte(`{"type":"object","required":["from","to","amount"],"properties":{"from":{"type":"string"},"to":{"type":"string"},"amount":{"type":"number"}}}`),
			OutputSchemaJson: []byte(`{"type":"object","properties":{"converted":{"type":"number"},"rate":{"type":"number"}}}`)},
	},
	{
		task: &negotiatorv1.TaskSpec{Name: "local-time", Description: "Local time and UTC offset of a city.",
			InputSchemaJson:  []byte(`{"type":"object","required":["city"],"properties":{"city":{"type":"string"}}}`),
			OutputSchemaJson: []byte(`{"type":"object","required":["utcOffset","localTime"],"properties":{"utcOffset":{"type":"string"},"localTime":{"type":"string"}}}`)},
		tool: &negotiatorv1.ToolSpec{Name: "tz", Description: "Time zones.",
			InputSchemaJson:  []byte(`{"type":"object","required":["city"],"properties":{"city":{"type":"string"}}}`),
			OutputSchemaJson: []byte(`{"type":"object","properties":{"utc_offset":{"type":"string"},"local_time":{"type":"string"}}}`)},
	},
}

func freeTextService(i int) service {
	return service{
		task: &negotiatorv1.TaskSpec{Name: fmt.Sprintf("advice-%d", i), Description: "Free-text travel advice."},
		tool: &negotiatorv1.ToolSpec{Name: "guidebook", Description: "Search a travel guide."},
	}
}

// world is the fixed scenario: who is who, budgets and the query sequence.
type world struct {
	services []service
	models   []string // per agent
	names    []string // per agent
	budgets  []int    // per user
	queries  []query
}

type query struct{ user, server int }

func buildWorld(o Options) (world, error) {
	if o.Servers < 1 || o.Agents <= o.Servers || o.FreeTextServers > o.Servers || o.Queries < 1 {
		return world{}, errors.New("benchnet: need 1 <= servers < agents, free-text servers <= servers, queries >= 1")
	}
	rng := rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15))
	var w world
	for i := range o.Servers {
		s := typedServices[i%len(typedServices)]
		if i >= o.Servers-o.FreeTextServers {
			s = freeTextService(i)
		} else if i >= len(typedServices) {
			t := proto.CloneOf(s.task)
			t.Name = fmt.Sprintf("%s-%d", t.Name, i)
			s.task = t
		}
		w.services = append(w.services, s)
	}
	for i := range o.Agents {
		if i < o.Servers {
			w.names = append(w.names, fmt.Sprintf("clients/net/agents/server-%d", i))
		} else {
			w.names = append(w.names, fmt.Sprintf("clients/net/agents/user-%d", i))
		}
		frac := (float64(i) + 0.5) / float64(o.Agents)
		m, acc := Models[len(Models)-1].Name, 0.0
		for _, mm := range Models {
			acc += mm.Share
			if frac < acc {
				m = mm.Name
				break
			}
		}
		w.models = append(w.models, m)
	}
	rng.Shuffle(len(w.models), func(i, j int) { w.models[i], w.models[j] = w.models[j], w.models[i] })
	users := o.Agents - o.Servers
	raw := make([]float64, users)
	total := 0.0
	for i := range raw {
		raw[i] = 1 / math.Pow(1-rng.Float64(), 1/o.ParetoAlpha)
		total += raw[i]
	}
	w.budgets = make([]int, users)
	sum := 0
	for i := range raw {
		w.budgets[i] = max(1, int(math.Round(raw[i]/total*float64(o.Queries))))
		sum += w.budgets[i]
	}
	for sum != o.Queries { // fix rounding on the largest budget
		big := 0
		for i := range w.budgets {
			if w.budgets[i] > w.budgets[big] {
				big = i
			}
		}
		if sum > o.Queries {
			w.budgets[big]--
			sum--
		} else {
			w.budgets[big]++
			sum++
		}
	}
	// Each user prefers servers in its own random order, Zipf-weighted.
	for u, b := range w.budgets {
		order := rng.Perm(o.Servers)
		weights := make([]float64, o.Servers)
		wsum := 0.0
		for k := range weights {
			weights[k] = 1 / float64(k+1)
			wsum += weights[k]
		}
		for range b {
			x := rng.Float64() * wsum
			k := 0
			for ; k < o.Servers-1 && x >= weights[k]; k++ {
				x -= weights[k]
			}
			w.queries = append(w.queries, query{user: o.Servers + u, server: order[k]})
		}
	}
	rng.Shuffle(len(w.queries), func(i, j int) { w.queries[i], w.queries[j] = w.queries[j], w.queries[i] })
	return w, nil
}

// pairState is what a (user, server) pair has agreed so far.
type pairState struct {
	conversations int
	senderRoutine string
	serverRoutine string
}

type runner struct {
	w        world
	o        Options
	strategy string
	fake     *llmtest.FakeServer
	negs     map[string]*negotiatortest.Negotiator // per model
	pairs    map[query]*pairState
	// agreed maps server → PD SHA-1 → the server's receiver routine.
	agreed       map[int]map[string]string
	pdFor        map[int][]byte // server → the PD it agreed (for look-ups)
	negotiations int
	// thresholds are the negotiators' defaults (the paper's).
	thresholds *negotiatorv1.Thresholds
}

// Run runs every strategy on the same world and reports.
func Run(ctx context.Context, o Options) (Report, error) {
	o = o.withDefaults()
	w, err := buildWorld(o)
	if err != nil {
		return Report{}, err
	}
	rep := Report{Agents: o.Agents, Servers: o.Servers, FreeTextServers: o.FreeTextServers, Users: o.Agents - o.Servers, Queries: o.Queries, Seed: o.Seed, Ratio: map[string]float64{}}
	rep.Budgets = append([]int(nil), w.budgets...)
	sort.Sort(sort.Reverse(sort.IntSlice(rep.Budgets)))
	for _, strategy := range []string{NLOnly, PaperThreshold, FirstContact} {
		res, err := runStrategy(ctx, w, o, strategy)
		if err != nil {
			return rep, fmt.Errorf("%s: %w", strategy, err)
		}
		rep.Results = append(rep.Results, res)
		if o.Log != nil {
			fmt.Fprintf(o.Log, "%s: %.4f USD, %d LLM calls, %d of %d queries needed an LLM\n", strategy, res.CostUSD, res.LLMCalls, res.QueriesNeedingLLM, o.Queries)
		}
	}
	nl := rep.Results[0].CostUSD
	for _, r := range rep.Results[1:] {
		if r.CostUSD == 0 {
			rep.Ratio[r.Strategy] = math.Inf(1)
		} else {
			rep.Ratio[r.Strategy] = nl / r.CostUSD
		}
	}
	return rep, nil
}

func runStrategy(ctx context.Context, w world, o Options, strategy string) (Result, error) {
	start := time.Now()
	fake, err := llmtest.NewFakeServer(llmtest.Conversational)
	if err != nil {
		return Result{}, err
	}
	defer fake.Close()
	r := &runner{w: w, o: o, strategy: strategy, fake: fake, negs: map[string]*negotiatortest.Negotiator{}, pairs: map[query]*pairState{}, agreed: map[int]map[string]string{}, pdFor: map[int][]byte{}}
	for _, m := range Models {
		n, err := negotiatortest.Start(ctx, config.LLM{Provider: config.ProviderOpenAI, BaseURL: fake.URL + "/v1", Model: m.Name})
		if err != nil {
			return Result{}, err
		}
		defer n.Close()
		r.negs[m.Name] = n
	}
	if r.thresholds, err = r.negs[Models[0].Name].Client.GetThresholds(ctx, &negotiatorv1.GetThresholdsRequest{Task: "bench", Target: "bench"}); err != nil {
		return Result{}, err
	}
	res := Result{Strategy: strategy, CostByRoleUSD: map[string]float64{}}
	windowLLM := 0
	for i, q := range w.queries {
		before := len(fake.Calls())
		if err := r.query(ctx, q); err != nil {
			return res, fmt.Errorf("query %d (user %d → server %d): %w", i+1, q.user, q.server, err)
		}
		if len(fake.Calls()) > before {
			res.QueriesNeedingLLM++
			windowLLM++
		}
		if (i+1)%o.Window == 0 || i == len(w.queries)-1 {
			size := (i % o.Window) + 1
			res.LLMShareByWindow = append(res.LLMShareByWindow, float64(windowLLM)/float64(size))
			windowLLM = 0
		}
	}
	for _, n := range r.negs {
		token := ""
		for {
			page, err := n.Client.ListLedgerEntries(ctx, &negotiatorv1.ListLedgerEntriesRequest{PageSize: 1000, PageToken: token})
			if err != nil {
				return res, err
			}
			for _, e := range page.GetLedgerEntries() {
				res.LLMCalls++
				res.PromptTokens += e.GetPromptTokens()
				res.CompletionTokens += e.GetCompletionTokens()
				c := float64(e.GetCostMicroUsd()) / 1e6
				res.CostUSD += c
				res.CostByRoleUSD[e.GetRole()] += c
			}
			if token = page.GetNextPageToken(); token == "" {
				break
			}
		}
	}
	res.Negotiations = r.negotiations
	res.Elapsed = time.Since(start).Round(time.Millisecond).String()
	return res, nil
}

func (r *runner) client(agent int) negotiatorv1.NegotiatorServiceClient {
	return r.negs[r.w.models[agent]].Client
}

func (r *runner) query(ctx context.Context, q query) error {
	svc := r.w.services[q.server]
	st := r.pairs[q]
	if st == nil {
		st = &pairState{}
		r.pairs[q] = st
	}
	st.conversations++
	if r.strategy == NLOnly || !svc.typed() {
		return r.nl(ctx, q, svc)
	}
	if st.senderRoutine == "" {
		th := r.thresholds
		switch {
		case r.strategy == FirstContact:
			if err := r.negotiate(ctx, q, svc, st); err != nil {
				return err
			}
		case st.conversations > int(th.GetNegotiateAfter()):
			if err := r.negotiate(ctx, q, svc, st); err != nil {
				return err
			}
		case st.conversations > int(th.GetLookUpAfter()) && r.pdFor[q.server] != nil:
			if err := r.lookUp(ctx, q, svc, st); err != nil {
				return err
			}
		}
	}
	if st.senderRoutine == "" {
		return r.nl(ctx, q, svc)
	}
	return r.structured(ctx, svc, st)
}

func example(raw []byte) []byte { return routinetest.Example(raw) }

// tools declares the service's tool, answering an example of its output
// schema.
func tools(svc service) []routinetest.Tool {
	result := json.RawMessage(`{"text":"The old town is best explored on foot in the morning."}`)
	if len(svc.tool.GetOutputSchemaJson()) > 0 {
		result = example(svc.tool.GetOutputSchemaJson())
	}
	return []routinetest.Tool{{Name: svc.tool.GetName(), Result: result}}
}

// runRoutine runs fn of src once. The network has no dispatcher, so it
// goes through routinetest, a stand-in for the dispatcher's runtime that
// follows its routine contract.
func runRoutine(_ context.Context, src, fn string, args []json.RawMessage, tools []routinetest.Tool) (json.RawMessage, error) {
	return routinetest.Run(src, fn, args, tools)
}

func (r *runner) nl(ctx context.Context, q query, svc service) error {
	user, server := r.w.names[q.user], r.w.names[q.server]
	input := []byte(`{"question":"What should I see in Lisbon in one day?"}`)
	if svc.typed() {
		input = example(svc.task.GetInputSchemaJson())
	}
	c, err := r.client(q.user).ComposeQuery(ctx, &negotiatorv1.ComposeQueryRequest{Agent: user, Peer: server, Task: svc.task, TaskInputJson: input})
	if err != nil {
		return fmt.Errorf("compose: %w", err)
	}
	var results []*negotiatorv1.ToolResult
	var body []byte
	for range 6 {
		rep, err := r.client(q.server).ReplyNaturalLanguage(ctx, &negotiatorv1.ReplyNaturalLanguageRequest{Agent: server, Peer: user, Query: c.GetBody(), Tools: []*negotiatorv1.ToolSpec{svc.tool}, ToolResults: results})
		if err != nil {
			return fmt.Errorf("reply: %w", err)
		}
		if call := rep.GetToolCall(); call != nil {
			res := tools(svc)[0].Result
			results = append(results, &negotiatorv1.ToolResult{Name: call.GetName(), ArgumentsJson: call.GetArgumentsJson(), ResultJson: []byte(res)})
			continue
		}
		body = rep.GetBody()
		break
	}
	if body == nil {
		return errors.New("the server's LLM kept calling tools")
	}
	if !svc.typed() {
		return nil // the free-text answer is the result
	}
	if _, err := r.client(q.user).ParseReply(ctx, &negotiatorv1.ParseReplyRequest{Agent: user, Peer: server, Task: svc.task, Reply: body}); err != nil {
		return fmt.Errorf("parse: %w", err)
	}
	return nil
}

// negotiate relays a negotiation between the user's and the server's
// negotiators, then has both write routines.
func (r *runner) negotiate(ctx context.Context, q query, svc service, st *pairState) error {
	user, server := r.w.names[q.user], r.w.names[q.server]
	uc, sc := r.client(q.user), r.client(q.server)
	s, err := uc.StartNegotiation(ctx, &negotiatorv1.StartNegotiationRequest{Agent: user, Peer: server, Task: svc.task})
	if err != nil {
		return fmt.Errorf("start negotiation: %w", err)
	}
	rv, err := sc.ReceiveNegotiationMessage(ctx, &negotiatorv1.ReceiveNegotiationMessageRequest{Agent: server, Peer: user, BodyJson: s.GetOutboundMessageJson(), Tools: []*negotiatorv1.ToolSpec{svc.tool}})
	if err != nil {
		return fmt.Errorf("receive proposal: %w", err)
	}
	if len(rv.GetOutboundMessageJson()) > 0 {
		if s, err = uc.ReceiveNegotiationMessage(ctx, &negotiatorv1.ReceiveNegotiationMessageRequest{Name: s.GetName(), BodyJson: rv.GetOutboundMessageJson()}); err != nil {
			return fmt.Errorf("receive answer: %w", err)
		}
	}
	r.negotiations++
	accepted := negotiatorv1.NegotiationState_NEGOTIATION_STATE_ACCEPTED
	if s.GetState() != accepted || rv.GetState() != accepted {
		return fmt.Errorf("negotiation ended %v/%v: %s", s.GetState(), rv.GetState(), s.GetFailureReason())
	}
	return r.adopt(ctx, q, svc, st, s.GetProtocol())
}

// lookUp checks the PD the server already agreed with someone else, on the
// user's side, and adopts it when it fits.
func (r *runner) lookUp(ctx context.Context, q query, svc service, st *pairState) error {
	pd := r.pdFor[q.server]
	v, err := r.client(q.user).CheckSuitability(ctx, &negotiatorv1.CheckSuitabilityRequest{Agent: r.w.names[q.user], Peer: r.w.names[q.server], Protocol: pd, Task: svc.task})
	if err != nil {
		return fmt.Errorf("check suitability: %w", err)
	}
	if !v.GetFit() {
		return nil
	}
	return r.adopt(ctx, q, svc, st, pd)
}

// adopt installs routines for pd on both sides (the server's only once).
func (r *runner) adopt(ctx context.Context, q query, svc service, st *pairState, pd []byte) error {
	user, server := r.w.names[q.user], r.w.names[q.server]
	sr, err := r.client(q.user).SynthesizeRoutine(ctx, &negotiatorv1.SynthesizeRoutineRequest{Agent: user, Peer: server, Protocol: pd, Side: negotiatorv1.RoutineSide_ROUTINE_SIDE_SENDER, Task: svc.task})
	if err != nil {
		return fmt.Errorf("sender routine: %w", err)
	}
	hash := sr.GetProtocolSha1Hex()
	if r.agreed[q.server] == nil {
		r.agreed[q.server] = map[string]string{}
	}
	recv, ok := r.agreed[q.server][hash]
	if !ok {
		rr, err := r.client(q.server).SynthesizeRoutine(ctx, &negotiatorv1.SynthesizeRoutineRequest{Agent: server, Peer: user, Protocol: pd, Side: negotiatorv1.RoutineSide_ROUTINE_SIDE_RECEIVER, Tools: []*negotiatorv1.ToolSpec{svc.tool}})
		if err != nil {
			return fmt.Errorf("receiver routine: %w", err)
		}
		recv = rr.GetSource()
		r.agreed[q.server][hash] = recv
		r.pdFor[q.server] = pd
	}
	st.senderRoutine, st.serverRoutine = sr.GetSource(), recv
	return nil
}

// structured runs one query through both routines, with no LLM.
func (r *runner) structured(ctx context.Context, svc service, st *pairState) error {
	body, err := runRoutine(ctx, st.senderRoutine, "send", []json.RawMessage{example(svc.task.GetInputSchemaJson())}, nil)
	if err != nil {
		return fmt.Errorf("send routine: %w", err)
	}
	reply, err := runRoutine(ctx, st.serverRoutine, "reply", []json.RawMessage{body, json.RawMessage(`{}`)}, tools(svc))
	if err != nil {
		return fmt.Errorf("reply routine: %w", err)
	}
	if _, err := runRoutine(ctx, st.senderRoutine, "parse", []json.RawMessage{reply}, nil); err != nil {
		return fmt.Errorf("parse routine: %w", err)
	}
	return nil
}
