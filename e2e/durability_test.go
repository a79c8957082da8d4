package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/parleyhq/parley/e2e/parleytest"
)

// TestServe_kill9UnderLoadLosesNoAcknowledgedWrite runs the shipped
// `parley serve`, writes PDs, agents, routines, conversations and LLM
// calls (the negotiator's ledger) from concurrent clients, SIGKILLs the
// process group while writes are in flight, restarts on the same data
// directory, and checks that every write the server acknowledged is there.
//
// A kill -9 keeps the page cache, so it proves acknowledgement after
// commit, not fsync; the boltstores' TestWrites_returnOnlyAfterASyncedCommit
// covers fsync.
func TestServe_kill9UnderLoadLosesNoAcknowledgedWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("builds parley and runs it under load twice")
	}
	bin := filepath.Join(t.TempDir(), "parley")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/parleyhq/parley/cmd/parley").CombinedOutput(); err != nil {
		t.Fatalf("go build parley: %v\n%s", err, out)
	}
	fake := startFake(t)
	flags := llmShadowFlags(fake)
	dataDir := t.TempDir()

	first := startGroup(t, bin, dataDir, flags...)
	srv := first.server
	createAgent(t, srv, "acme", "counter", `,"supportPolicy":"SUPPORT_POLICY_IMPLEMENTED"`)
	setRoutine(t, srv, "clients/acme/agents/counter", sha1Hex([]byte(counterPD)), counterRoutine)
	createAgent(t, srv, "acme", "weather", "")

	// Writers run until the kill; each records only what got a 200.
	var (
		mu    sync.Mutex
		acked = map[string][]string{} // kind -> what to look up after restart
	)
	ack := func(kind, v string) {
		mu.Lock()
		defer mu.Unlock()
		acked[kind] = append(acked[kind], v)
	}
	count := func(kind string) int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked[kind])
	}
	client := &http.Client{Timeout: 30 * time.Second}
	token := parleytest.OperatorToken(t)
	post := func(method, path string, body any) (map[string]any, bool) {
		b, _ := json.Marshal(body)
		if s, ok := body.(string); ok {
			b = []byte(s)
		}
		req, err := http.NewRequest(method, srv.URL(path), bytes.NewReader(b))
		if err != nil {
			return nil, false
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			return nil, false
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var m map[string]any
		if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &m) != nil {
			return nil, false
		}
		return m, true
	}
	writers := map[string]func(w, i int){
		"pd": func(w, i int) {
			pd := fmt.Sprintf("---\nname: Load %d-%d\ndescription: a PD written under load\nmultiround: false\n---\n\nBody %d-%d.", w, i, w, i)
			if m, ok := post("POST", "/v1/protocols", map[string]any{"content": []byte(pd)}); ok {
				ack("pd", fmt.Sprint(m["sha1Hex"]))
			}
		},
		"agent": func(w, i int) {
			id := fmt.Sprintf("w%d-%d", w, i)
			if _, ok := post("POST", "/v1/clients/load/agents?agent_id="+id, map[string]any{"displayName": id}); ok {
				ack("agent", "clients/load/agents/"+id)
			}
		},
		"routine": func(w, i int) {
			name := "clients/acme/agents/counter/routines/" + sha1Hex(fmt.Appendf(nil, "routine %d-%d", w, i))
			if _, ok := post("PUT", "/v1/"+name, map[string]any{"source": counterRoutine}); ok {
				ack("routine", name)
			}
		},
		"conversation": func(w, i int) {
			m, ok := post("POST", "/agora/acme/counter", pylibEnvelope(t, `{"q": "un"}`))
			if id, _ := m["conversationId"].(string); ok && m["status"] == "success" && id != "" {
				ack("conversation", id)
			}
		},
		"llm": func(w, i int) {
			m, ok := post("POST", "/agora/acme/weather", `{"body":"What will the weather be in Paris on 1 May 2024?"}`)
			if ok && m["status"] == "success" {
				ack("llm", "")
			}
		},
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, write := range writers {
		for w := range 3 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					write(w, i)
				}
			})
		}
	}
	// Kill once every kind has acknowledged writes, with the writers still
	// going. The deadline only bounds a broken run.
	const enough = 8
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ready := true
		for kind := range writers {
			ready = ready && count(kind) >= enough
		}
		if ready {
			break
		}
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			t.Fatalf("after 2 minutes of load, acknowledged writes per kind: %v; want %d of each\n%s", counts(&mu, acked), enough, srv.Log)
		}
		time.Sleep(20 * time.Millisecond) // polling the writers' progress
	}
	first.kill(t)
	close(stop)
	wg.Wait()
	t.Logf("acknowledged before SIGKILL: %v", counts(&mu, acked))

	second := startGroup(t, bin, dataDir, flags...)
	srv = second.server
	for _, sha := range acked["pd"] {
		if code, raw := api(t, "GET", srv.URL("/v1/protocols/"+sha), ""); code != http.StatusOK {
			t.Errorf("after restart, GET protocols/%s = %d %s; it was acknowledged", sha, code, raw)
		}
	}
	for _, name := range acked["agent"] {
		if code, raw := api(t, "GET", srv.URL("/v1/"+name), ""); code != http.StatusOK {
			t.Errorf("after restart, GET %s = %d %s; it was acknowledged", name, code, raw)
		}
	}
	for _, name := range acked["routine"] {
		if code, raw := api(t, "GET", srv.URL("/v1/"+name), ""); code != http.StatusOK {
			t.Errorf("after restart, GET %s = %d %s; it was acknowledged", name, code, raw)
		}
	}
	// A conversation's memory came back with it: the count goes on at 2.
	for _, id := range acked["conversation"] {
		pylibPost(t, srv.URL("/agora/acme/counter/conversations/"+id), 2)
	}
	// Each acknowledged LLM answer recorded at least one ledger entry first.
	if got, want := ledgerTotals(t, srv).Calls, len(acked["llm"]); got < want {
		t.Errorf("after restart, the ledger totals %d LLM calls; %d answers were acknowledged", got, want)
	}
	if got, want := len(ledgerEntries(t, srv, "")), min(len(acked["llm"]), 1000); got < want {
		t.Errorf("after restart, the ledger lists %d entries; %d LLM answers were acknowledged", got, want)
	}
}

func counts(mu *sync.Mutex, acked map[string][]string) map[string]int {
	mu.Lock()
	defer mu.Unlock()
	out := map[string]int{}
	for k, v := range acked {
		out[k] = len(v)
	}
	return out
}

// group is a `parley serve` in its own process group.
type group struct {
	server *parleytest.Server
}

// startGroup runs `bin serve` on dataDir in a new process group and waits
// for its "listening" line. The group is killed when the test ends.
func startGroup(t *testing.T, bin, dataDir string, extra ...string) *group {
	t.Helper()
	args := append([]string{"serve", "--data", dataDir, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--operator-token-file", parleytest.OperatorTokenFile(t)}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "PARLEY_LOG_LEVEL=info")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second // an orphan holding stderr cannot hang Wait
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &parleytest.Server{Cmd: cmd, DataDir: dataDir, Log: &parleytest.SyncBuffer{}, Exited: make(chan struct{})}
	g := &group{server: s}
	addrs := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			s.Log.WriteLine(sc.Text())
			var rec struct{ Msg, GRPC, HTTP string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "listening" {
				addrs <- [2]string{rec.GRPC, rec.HTTP}
			}
		}
	}()
	go func() {
		s.ExitErr = cmd.Wait()
		close(s.Exited)
	}()
	t.Cleanup(func() { g.kill(t) })
	select {
	case a := <-addrs:
		s.GRPCAddr, s.HTTPAddr = a[0], a[1]
	case <-s.Exited:
		t.Fatalf("parley serve exited before listening: %v\n%s", s.ExitErr, s.Log)
	case <-time.After(60 * time.Second):
		t.Fatalf("parley serve did not log its addresses within 60s\n%s", s.Log)
	}
	return g
}

// kill SIGKILLs the whole process group and waits for the process to go.
func (g *group) kill(t *testing.T) {
	t.Helper()
	select {
	case <-g.server.Exited:
		return
	default:
	}
	if err := syscall.Kill(-g.server.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Errorf("kill -9 the process group of parley serve: %v", err)
	}
	select {
	case <-g.server.Exited:
	case <-time.After(30 * time.Second):
		t.Errorf("parley serve still running 30s after SIGKILL")
	}
}
