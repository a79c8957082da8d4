package config_test

import (
	"strings"
	"testing"

	"github.com/parleyhq/parley/services/negotiator/config"
)

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr []string
	}{
		{name: "no LLM is fine"},
		{name: "env fallback", env: map[string]string{"PARLEY_LLM_PROVIDER": "openai", "PARLEY_LLM_MODEL": "gpt-4o", "PARLEY_LLM_API_KEY": "sk-secret"}},
		{
			name:    "every bad value at once",
			args:    []string{"--llm-provider=gemini", "--llm-base-url=ftp://x", "--llm-structured=xml", "--llm-prices=a=1", "--negotiation-thresholds=x", "--negotiation-max-rounds=1"},
			wantErr: []string{"--llm-provider", "--llm-base-url", "--llm-structured", "--llm-prices", "--negotiation-thresholds", "--negotiation-max-rounds"},
		},
		{
			name:    "non-positive LLM limits",
			args:    []string{"--llm-timeout=0", "--llm-max-concurrent=0", "--llm-base-backoff=0", "--llm-max-backoff=-1s"},
			wantErr: []string{"--llm-timeout", "--llm-max-concurrent", "--llm-base-backoff", "--llm-max-backoff"},
		},
		{name: "env fallback for the backoffs", env: map[string]string{"PARLEY_LLM_BASE_BACKOFF": "0s"}, wantErr: []string{"--llm-base-backoff"}},
		{name: "model required", args: []string{"--llm-provider=anthropic"}, wantErr: []string{"--llm-model"}},
		{name: "budget with an unpriced default model", args: []string{"--llm-provider=openai", "--llm-model=mystery-1", "--llm-budget-agent-usd=1"}, wantErr: []string{`--llm-model "mystery-1" has no price`, "--llm-prices"}},
		{name: "budget with an unpriced role model", args: []string{"--llm-provider=openai", "--llm-model=gpt-4o", "--llm-model-checking=mini-2", "--llm-budget-peer-usd=1"}, wantErr: []string{`--llm-model-checking "mini-2"`}},
		{name: "budget with a model priced by flag", args: []string{"--llm-provider=openai", "--llm-model=mystery-1", "--llm-prices=mystery-1=1/2", "--llm-budget-agent-usd=1"}},
		{name: "no budget, unpriced model is fine", args: []string{"--llm-provider=openai", "--llm-model=mystery-1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := config.Load(tt.args, func(k string) string { return tt.env[k] })
			if len(tt.wantErr) == 0 && err != nil {
				t.Fatalf("Load() = %v", err)
			}
			for _, w := range tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("Load() error = %v, want it to mention %s", err, w)
				}
			}
			if strings.Contains(c.LLM.String(), "sk-secret") {
				t.Errorf("LLM.String() = %q leaks the key", c.LLM.String())
			}
		})
	}
}

// TestLoad_registryAddrIsAcceptedAndIgnored proves old command lines still
// start the negotiator, which no longer dials the registry.
func TestLoad_registryAddrIsAcceptedAndIgnored(t *testing.T) {
	if _, err := config.Load([]string{"--registry-addr", "dns:///registry:9090"}, func(string) string { return "" }); err != nil {
		t.Errorf("Load(--registry-addr) = %v, want nil", err)
	}
}
