package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/parleyhq/parley/e2e/parleytest"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

// `parley demo market --json` against a running `parley serve` process
// (access control on, the operator's token): twice on the same server,
// each run with fresh agents it deletes at the end. Each run forms the
// allocate order with steady and the paid, approved transact order with
// premium after picky's rejection, fickle's revocation and slow's lapse.
func TestDemoMarket_onServer(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the market story twice, several seconds of deadlines each")
	}
	srv := parleytest.Start(t, "")
	for run := range 2 {
		cmd := exec.Command(parleytest.Binary(t), "demo", "market", "--json", "--window", "3s", "--server", srv.GRPCAddr)
		cmd.Env = append(os.Environ(), "PARLEY_TOKEN="+parleytest.OperatorToken(t))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("run %d: parley demo market: %v\n%s\nserver log:\n%s", run, err, out, srv.Log)
		}
		var s struct {
			Orders []struct {
				Protocol, Supplier, State string
				Paid, Approved            bool
				Trail                     []string
			}
			Fallbacks []struct{ Supplier, Reason string }
			Payments  []struct{ State, Payee string }
			Refusals  []struct{ Supplier, Detail string }
		}
		if err := json.Unmarshal(out, &s); err != nil {
			t.Fatalf("run %d: summary %s: %v", run, out, err)
		}
		var orders []string
		for _, o := range s.Orders {
			orders = append(orders, o.Protocol+" "+o.Supplier+" "+o.State+" "+strings.Join(o.Trail, ">"))
		}
		want := []string{
			"allocate steady SUCCEEDED accept_offer>order_complete>confirm_success",
			"transact premium SUCCEEDED accept_offer>payment_confirmed>order_complete>confirm_success",
		}
		if !slices.Equal(orders, want) {
			t.Errorf("run %d: orders = %q, want %q", run, orders, want)
		}
		if len(s.Orders) == 2 && (!s.Orders[1].Paid || !s.Orders[1].Approved) {
			t.Errorf("run %d: transact order %+v, want paid and approved", run, s.Orders[1])
		}
		var fallbacks []string
		for _, f := range s.Fallbacks {
			fallbacks = append(fallbacks, f.Supplier+" "+f.Reason)
		}
		if want := []string{"picky rejected", "fickle revoked", "slow lapsed"}; !slices.Equal(fallbacks, want) {
			t.Errorf("run %d: fallbacks = %q, want %q", run, fallbacks, want)
		}
		if len(s.Payments) != 1 || s.Payments[0].State != "CAPTURED" || s.Payments[0].Payee != "premium" {
			t.Errorf("run %d: payments = %+v, want one captured by premium", run, s.Payments)
		}
		if len(s.Refusals) != 2 || !strings.Contains(s.Refusals[0].Detail, "invite_offer_timeout") {
			t.Errorf("run %d: refusals = %+v, want slow's two late offers refused naming invite_offer_timeout", run, s.Refusals)
		}
	}
	conn, err := grpc.NewClient(srv.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(parleytest.Bearer(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	res, err := registryv1.NewRegistryServiceClient(conn).ListAgents(t.Context(), &registryv1.ListAgentsRequest{Parent: "clients/market"})
	if err != nil {
		t.Fatalf("ListAgents(clients/market) error = %v", err)
	}
	if len(res.GetAgents()) != 0 {
		t.Errorf("the demo left agents: %v", res.GetAgents())
	}
}
