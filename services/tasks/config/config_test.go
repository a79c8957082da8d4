package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/tasks/config"
)

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr []string // substrings of the error; none means valid
	}{
		{"defaults", nil, nil, nil},
		{"agent from env", nil, map[string]string{"PARLEY_AP_AGENT": "acme:writer"}, nil},
		{"agent without colon", []string{"--ap-agent", "acme"}, nil, []string{"--ap-agent"}},
		{"agent with capitals", []string{"--ap-agent", "Acme:w"}, nil, []string{"--ap-agent"}},
		{"page size zero", []string{"--ap-max-page-size", "0"}, nil, []string{"--ap-max-page-size"}},
		{"negative wait", []string{"--ap-step-wait", "-1s"}, nil, []string{"--ap-step-wait"}},
		{"every bad value at once", []string{"--ap-max-upload-bytes", "0", "--ap-max-watchers", "0", "--ap-max-waiting-steps", "0", "--ap-max-step-attempts", "0"}, nil, []string{"--ap-max-upload-bytes", "--ap-max-watchers", "--ap-max-waiting-steps", "--ap-max-step-attempts"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Load(tc.args, func(k string) string { return tc.env[k] })
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Load(%q) = %v, want nil", tc.args, err)
				}
				return
			}
			for _, want := range tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("Load(%q) = %v, want an error naming %s", tc.args, err, want)
				}
			}
		})
	}
	cfg, err := config.Load(nil, func(k string) string {
		return map[string]string{"PARLEY_AP_AGENT": "acme:writer"}[k]
	})
	if err != nil || cfg.AgentName() != "clients/acme/agents/writer" {
		t.Errorf("AgentName() = %q, %v; want clients/acme/agents/writer", cfg.AgentName(), err)
	}
}

// TestLoad_defaults pins every default the README's config table lists.
func TestLoad_defaults(t *testing.T) {
	cfg, err := config.Load(nil, func(string) string { return "" })
	if err != nil {
		t.Fatalf("Load(nil) = %v, want nil", err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"Agent", cfg.Agent, "default:agent"},
		{"AgentName()", cfg.AgentName(), "clients/default/agents/agent"},
		{"StepWait", cfg.StepWait, 30 * time.Second},
		{"StepTimeout", cfg.StepTimeout, 10 * time.Minute},
		{"RetryMax", cfg.RetryMax, 5 * time.Second},
		{"MaxPageSize", cfg.MaxPageSize, 100},
		{"MaxUploadBytes", cfg.MaxUploadBytes, int64(32 << 20)},
		{"MaxWatchers", cfg.MaxWatchers, 1024},
		{"MaxInFlight", cfg.MaxInFlight, 512},
		{"MaxWaitingSteps", cfg.MaxWaitingSteps, 1000},
		{"MaxStepAttempts", cfg.MaxStepAttempts, 5},
		{"DispatcherAddr", cfg.DispatcherAddr, "dns:///dispatcher:9090"},
		{"RegistryAddr", cfg.RegistryAddr, "dns:///registry:9090"},
		{"DataDir", cfg.DataDir, "/var/lib/parley"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("Load(nil).%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}
