package main

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/cmd/parley/internal/demo"
	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

// runMarketJSON runs `parley demo market --json args...` and decodes its
// summary.
// testWindow is the suppliers' window in the tests: wide enough that the
// four prompt suppliers answer in time on a loaded machine, so that only
// slow misses its deadlines.
const testWindow = "3s"

func runMarketJSON(t *testing.T, getenv func(string) string, args ...string) demo.MarketSummary {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := run(append([]string{"demo", "market", "--json", "--window", testWindow}, args...), getenv, &out, &errOut); err != nil {
		t.Fatalf("parley demo market --json %q: %v\n%s", args, err, errOut.String())
	}
	var s demo.MarketSummary
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		t.Fatalf("summary %s: %v", out.String(), err)
	}
	return s
}

// checkMarket asserts the story every run tells, whatever the server: the
// allocate order with steady (the cheapest offer in time), the transact
// fallbacks in rank order (picky rejects, fickle revokes, slow lapses),
// premium's paid and approved order, slow's two expiries and its late
// offers refused naming the deadline, the captured payment, and each
// dialogue's final state.
func checkMarket(t *testing.T, s demo.MarketSummary) {
	t.Helper()
	type orderView struct{ Protocol, Supplier, State, Last string }
	var orders []orderView
	for _, o := range s.Orders {
		orders = append(orders, orderView{o.Protocol, o.Supplier, o.State, strings.Join(o.Trail, ">")})
	}
	want := []orderView{
		{"allocate", "steady", "SUCCEEDED", "accept_offer>order_complete>confirm_success"},
		{"transact", "premium", "SUCCEEDED", "accept_offer>payment_confirmed>order_complete>confirm_success"},
	}
	if !slices.Equal(orders, want) {
		t.Errorf("orders = %+v, want %+v", orders, want)
	}
	if len(s.Orders) == 2 && (!s.Orders[1].Paid || !s.Orders[1].Approved || s.Orders[1].Price == nil || s.Orders[1].Price.AmountMicros != 1_600_000) {
		t.Errorf("transact order = %+v, want paid and approved at 1.6 USD", s.Orders[1])
	}
	var fallbacks []string
	for _, f := range s.Fallbacks {
		fallbacks = append(fallbacks, f.Supplier+" "+f.Reason)
	}
	if want := []string{"picky rejected", "fickle revoked", "slow lapsed"}; !slices.Equal(fallbacks, want) {
		t.Errorf("fallbacks = %q, want %q", fallbacks, want)
	}
	var expiries []string
	for _, e := range s.Expiries {
		expiries = append(expiries, e.Protocol+" "+e.Supplier+" "+e.What)
	}
	slices.Sort(expiries)
	if want := []string{"allocate slow invite_offer_timeout", "transact slow invite_offer_timeout"}; !slices.Equal(expiries, want) {
		t.Errorf("expiries = %q, want %q", expiries, want)
	}
	if len(s.Refusals) != 2 {
		t.Errorf("refusals = %+v, want slow's two late offers", s.Refusals)
	}
	for _, r := range s.Refusals {
		// DEADLINE_PASSED, or PAIR_ENDED once the expiry ended the pair:
		// either way the refusal names the deadline.
		if r.Supplier != "slow" || (r.Rule != "DEADLINE_PASSED" && r.Rule != "PAIR_ENDED") || !strings.Contains(r.Detail, "invite_offer_timeout") {
			t.Errorf("refusal %+v, want slow's late offer refused naming invite_offer_timeout", r)
		}
	}
	if len(s.Revocations) != 1 || s.Revocations[0].Supplier != "fickle" || s.Revocations[0].Protocol != "transact" {
		t.Errorf("revocations = %+v, want fickle's in transact", s.Revocations)
	}
	if len(s.Payments) != 1 || s.Payments[0].State != "CAPTURED" || s.Payments[0].Payee != "premium" || s.Payments[0].Payer != "buyer" ||
		s.Payments[0].AmountMicros != 1_600_000 || len(s.Orders) < 2 || s.Payments[0].Order != s.Orders[1].Order {
		t.Errorf("payments = %+v, want one captured 1.6 USD from the buyer to premium for the transact order", s.Payments)
	}
	finals := map[string]map[string]string{}
	for _, d := range s.Dialogues {
		finals[d.Protocol] = d.Suppliers
	}
	wantFinal := map[string]map[string]string{
		"allocate": {"steady": "confirm_success", "fickle": "reject_offer", "premium": "reject_offer", "picky": "reject_task", "slow": "invite_offer_timeout_expired"},
		"transact": {"premium": "confirm_success", "picky": "reject_invite_offer", "fickle": "revoke_offer", "slow": "invite_offer_timeout_expired", "steady": "task_withdrawn"},
	}
	for kind, want := range wantFinal {
		for supplier, typ := range want {
			if got := finals[kind][supplier]; got != typ {
				t.Errorf("%s dialogue: %s's last message = %q, want %q (all: %v)", kind, supplier, got, typ, finals[kind])
			}
		}
	}
}

func TestDemoMarket_inProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the market story, several seconds of deadlines")
	}
	s := runMarketJSON(t, noEnv)
	checkMarket(t, s)
	if !strings.Contains(s.Transport, "in-process") {
		t.Errorf("transport = %q, want in-process", s.Transport)
	}
}

func TestDemoMarket_onServerLeavesNoAgents(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the market story, several seconds of deadlines")
	}
	addr, _, reg, getenv := startServe(t) // access control on, as parley serve runs by default
	s := runMarketJSON(t, getenv, "--server", addr)
	checkMarket(t, s)
	if !strings.Contains(s.Transport, addr) {
		t.Errorf("transport = %q, want the server's address %s", s.Transport, addr)
	}
	res, err := reg.ListAgents(t.Context(), &registryv1.ListAgentsRequest{Parent: "clients/" + demo.MarketClient})
	if err != nil {
		t.Fatalf("ListAgents(market) error = %v", err)
	}
	if len(res.GetAgents()) != 0 {
		t.Errorf("the demo left agents on the server: %v", res.GetAgents())
	}
}

// The narration says each step, and ends with the totals.
func TestDemoMarket_narrates(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the market story, several seconds of deadlines")
	}
	var out, errOut bytes.Buffer
	if err := run([]string{"demo", "market", "--window", testWindow}, noEnv, &out, &errOut); err != nil {
		t.Fatalf("parley demo market: %v\n%s", err, errOut.String())
	}
	for _, want := range []string{
		"allocate: the window closed; offers ranked by price: steady at 3.00 USD, fickle at 3.50 USD, premium at 4.00 USD",
		"slow -> buyer: offer, too late: the network refused it (",
		"transact: picky rejected; the buyer falls back",
		"transact: fickle revoked; the buyer falls back",
		"transact: slow lapsed; the buyer falls back",
		"premium -> buyer: payment_confirmed",
		"2 orders formed, 2 deadlines expired, 1 revocations, 1 payments",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("narration lacks %q:\n%s", want, out.String())
		}
	}
}

// The run is bounded: past --timeout it stops with an error saying so
// (in CI it once waited ten minutes for a late answer that never came).
func TestDemoMarket_timeoutStopsTheRun(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run([]string{"demo", "market", "--json", "--timeout", "1ns"}, noEnv, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "did not finish within --timeout 1ns") {
		t.Fatalf("parley demo market --timeout 1ns error = %v, want one naming the timeout", err)
	}
	if err := run([]string{"demo", "market", "--timeout", "0s"}, noEnv, &out, &errOut); err == nil || !strings.Contains(err.Error(), "--timeout must be positive") {
		t.Errorf("parley demo market --timeout 0s error = %v, want a usage error", err)
	}
}

// The in-process server the demos start is ready for service requests
// when startDemoSuite returns: the dispatcher has stored the built-in
// service protocols, so a NewRequest sent at once is not refused as
// UNAVAILABLE (SERVICE_PROTOCOLS_NOT_REGISTERED), which would fail the
// market demo on a loaded machine.
func TestStartDemoSuite_readyForServiceRequests(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	ep, stop, err := startDemoSuite(ctx, "ready", func(*suiteConfig) {})
	defer func() {
		cancel() // the server runs until ctx ends; stop waits for it
		if stop != nil {
			if err := stop(); err != nil {
				t.Errorf("stop: %v", err)
			}
		}
	}()
	if err != nil {
		t.Fatal(err)
	}
	_, err = dispatcherv1.NewDispatcherServiceClient(ep.Conn).NewRequest(t.Context(), &dispatcherv1.NewRequestRequest{
		Sender: "clients/nobody/agents/none", To: &dispatcherv1.DistributionList{Direct: []string{"clients/nobody/agents/other"}},
		Protocol: "allocate", TaskJson: `{"what":"anything"}`,
	})
	if status.Code(err) == codes.Unavailable {
		t.Fatalf("NewRequest(allocate) right after startDemoSuite: %v, want the server ready for it", err)
	}
}
