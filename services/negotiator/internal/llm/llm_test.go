package llm_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/negotiator/internal/llm"
	"github.com/parleyhq/parley/services/negotiator/negotiatortest/llmtest"
)

func startFake(t *testing.T, respond func(llmtest.Call) llmtest.Reply) *llmtest.FakeServer {
	t.Helper()
	f, err := llmtest.NewFakeServer(respond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

type sleepLog struct{ waits []time.Duration }

func (s *sleepLog) sleep(_ context.Context, d time.Duration) error {
	s.waits = append(s.waits, d)
	return nil
}

var providerNames = []string{"openai", "anthropic"}

func providers(f *llmtest.FakeServer) map[string]llm.Provider {
	return map[string]llm.Provider{
		"openai":    &llm.OpenAI{BaseURL: f.URL + "/v1", APIKey: "sk-test"},
		"anthropic": &llm.Anthropic{BaseURL: f.URL, APIKey: "sk-ant-test"},
	}
}

func TestClient_weatherNegotiationTurns(t *testing.T) {
	for _, name := range providerNames {
		t.Run(name, func(t *testing.T) {
			f := startFake(t, nil)
			f.Enqueue(llmtest.WeatherNegotiation()...)
			c := llm.NewClient(providers(f)[name], llmtest.Options(llm.Options{DefaultModel: "gpt-4o", Models: map[llm.Role]string{llm.RoleNegotiation: "llama-3-405b"}}))
			schema := json.RawMessage(`{"type":"object","properties":{"action":{"type":"string"}},"required":["action"]}`)
			var want []string
			for _, r := range llmtest.WeatherNegotiation() {
				want = append(want, r.Text)
			}
			var prompt, completion int64
			for i := range 3 {
				resp, err := c.Complete(t.Context(), llm.Request{Role: llm.RoleNegotiation, System: "negotiate", Messages: []llm.Message{{Role: "user", Content: "turn"}}, JSONSchema: schema})
				if err != nil {
					t.Fatalf("Complete turn %d: %v", i, err)
				}
				var got, wantObj map[string]any
				if err := json.Unmarshal([]byte(resp.Text), &got); err != nil {
					t.Fatalf("turn %d text %q is not JSON: %v", i, resp.Text, err)
				}
				_ = json.Unmarshal([]byte(want[i]), &wantObj)
				if got["action"] != wantObj["action"] || got["protocol"] != wantObj["protocol"] {
					t.Errorf("turn %d = %v, want %v", i, got, wantObj)
				}
				if resp.Model != "llama-3-405b" {
					t.Errorf("turn %d model = %q, want the negotiation model", i, resp.Model)
				}
				if resp.PromptTokens <= 0 || resp.CompletionTokens <= 0 {
					t.Errorf("turn %d tokens = %d/%d, want positive", i, resp.PromptTokens, resp.CompletionTokens)
				}
				prompt += resp.PromptTokens
				completion += resp.CompletionTokens
			}
			calls := f.Calls()
			if len(calls) != 3 {
				t.Fatalf("fake saw %d calls, want 3", len(calls))
			}
			fp, fc := f.Tokens()
			if fp != prompt || fc != completion {
				t.Errorf("fake counted %d/%d tokens, client saw %d/%d", fp, fc, prompt, completion)
			}
			if !calls[0].Structured || calls[0].System != "negotiate" {
				t.Errorf("call = %+v, want structured with the system prompt", calls[0])
			}
			switch name {
			case "openai":
				if got := calls[0].Header.Get("Authorization"); got != "Bearer sk-test" {
					t.Errorf("Authorization = %q", got)
				}
			case "anthropic":
				if got := calls[0].Header.Get("X-Api-Key"); got != "sk-ant-test" {
					t.Errorf("x-api-key = %q", got)
				}
				if got := calls[0].Header.Get("Anthropic-Version"); got != llm.AnthropicVersion {
					t.Errorf("anthropic-version = %q", got)
				}
			}
		})
	}
}

func TestClient_retries(t *testing.T) {
	tests := []struct {
		name      string
		script    []llmtest.Reply
		wantErr   bool
		wantCalls int
		wantWaits []time.Duration
	}{
		{
			name:      "429 honours Retry-After",
			script:    []llmtest.Reply{{Status: 429, RetryAfter: "2"}, {Text: "ok"}},
			wantCalls: 2,
			wantWaits: []time.Duration{2 * time.Second},
		},
		{
			name:      "5xx backs off exponentially",
			script:    []llmtest.Reply{{Status: 503}, {Status: 500}, {Status: 502}, {Text: "ok"}},
			wantCalls: 4,
			// Jitter returns n-1, so each wait is the full ceiling.
			wantWaits: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond},
		},
		{
			name:      "gives up after MaxRetries",
			script:    []llmtest.Reply{{Status: 503}, {Status: 503}, {Status: 503}, {Status: 503}, {Text: "late"}},
			wantErr:   true,
			wantCalls: 4,
			wantWaits: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond},
		},
		{
			name:      "Retry-After capped by MaxBackoff",
			script:    []llmtest.Reply{{Status: 429, RetryAfter: "3600"}, {Text: "ok"}},
			wantCalls: 2,
			wantWaits: []time.Duration{5 * time.Second},
		},
		{
			name:      "400 is not retried",
			script:    []llmtest.Reply{{Status: 400}, {Text: "ok"}},
			wantErr:   true,
			wantCalls: 1,
		},
	}
	for _, tt := range tests {
		for _, pname := range providerNames {
			t.Run(tt.name+"/"+pname, func(t *testing.T) {
				f := startFake(t, nil)
				f.Enqueue(tt.script...)
				sl := &sleepLog{}
				c := llm.NewClient(providers(f)[pname], llmtest.Options(llm.Options{
					DefaultModel: "m", MaxRetries: 3, BaseBackoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second,
					Sleep: sl.sleep, Jitter: func(n int64) int64 { return n - 1 },
				}))
				_, err := c.Complete(t.Context(), llm.Request{Messages: []llm.Message{{Role: "user", Content: "hi"}}})
				if (err != nil) != tt.wantErr {
					t.Fatalf("Complete() error = %v, wantErr %v", err, tt.wantErr)
				}
				if got := len(f.Calls()); got != tt.wantCalls {
					t.Errorf("calls = %d, want %d", got, tt.wantCalls)
				}
				if len(sl.waits) != len(tt.wantWaits) {
					t.Fatalf("waits = %v, want %v", sl.waits, tt.wantWaits)
				}
				for i := range sl.waits {
					if sl.waits[i] != tt.wantWaits[i] {
						t.Errorf("wait %d = %v, want %v", i, sl.waits[i], tt.wantWaits[i])
					}
				}
				var he *llm.HTTPError
				if tt.wantErr && !errors.As(err, &he) {
					t.Errorf("error %v is not an *HTTPError", err)
				}
			})
		}
	}
}

func TestClient_notConfigured(t *testing.T) {
	for name, c := range map[string]*llm.Client{"nil": nil, "no provider": llm.NewClient(nil, llmtest.Options(llm.Options{}))} {
		if _, err := c.Complete(t.Context(), llm.Request{}); !errors.Is(err, llm.ErrNotConfigured) {
			t.Errorf("%s: Complete() = %v, want ErrNotConfigured", name, err)
		}
		if c.Configured() {
			t.Errorf("%s: Configured() = true", name)
		}
	}
}

func TestClient_concurrencyLimit(t *testing.T) {
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	f := startFake(t, func(llmtest.Call) llmtest.Reply {
		entered <- struct{}{}
		<-release
		return llmtest.Reply{Text: "ok"}
	})
	c := llm.NewClient(&llm.OpenAI{BaseURL: f.URL + "/v1"}, llmtest.Options(llm.Options{DefaultModel: "m", MaxConcurrent: 1}))
	done := make(chan error, 1)
	go func() {
		_, err := c.Complete(context.Background(), llm.Request{})
		done <- err
	}()
	<-entered
	// The only slot is taken: a second call waits, and gives up with its
	// context instead of reaching the server.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := c.Complete(ctx, llm.Request{}); !errors.Is(err, context.Canceled) {
		t.Errorf("second Complete() = %v, want context.Canceled", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Errorf("first Complete() = %v", err)
	}
	if got := len(f.Calls()); got != 1 {
		t.Errorf("server saw %d calls, want 1", got)
	}
}

func TestAnthropic_plainTextWithoutSchema(t *testing.T) {
	f := startFake(t, nil)
	f.Enqueue(llmtest.Reply{Text: "It will be sunny."})
	c := llm.NewClient(&llm.Anthropic{BaseURL: f.URL}, llmtest.Options(llm.Options{DefaultModel: "claude"}))
	resp, err := c.Complete(t.Context(), llm.Request{Messages: []llm.Message{{Role: "user", Content: "weather?"}}})
	if err != nil || resp.Text != "It will be sunny." {
		t.Fatalf("Complete() = %+v, %v", resp, err)
	}
	if f.Calls()[0].Structured {
		t.Error("request without schema was sent with a forced tool")
	}
}
