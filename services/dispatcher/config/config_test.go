package config

import (
	"strings"
	"testing"
)

// A limit that makes no sense at zero or below is refused by name, not
// replaced by a default further down.
func TestLoad_refusesNonPositiveLimitsByFlag(t *testing.T) {
	for _, flag := range []string{
		"--conversation-ttl", "--conversation-max-per-peer", "--routine-quarantine-after",
		"--handler-timeout", "--handler-queue", "--dispatcher-cache-ttl",
		"--agora-max-body-bytes", "--send-timeout", "--send-max-listed-protocols",
		"--message-max-body-bytes", "--message-timeout", "--mailbox-stream-batch",
		"--mailbox-stream-keepalive", "--mailbox-stream-max-duration", "--mailbox-stream-write-timeout",
		"--routine-memory-bytes", "--routine-kill-margin", "--routine-worker-cpu",
		"--dialogue-retention", "--mailbox-retention", "--notification-retry-for",
	} {
		for _, v := range []string{"0", "-1"} {
			if strings.HasSuffix(flag, "ttl") || strings.HasSuffix(flag, "timeout") ||
				strings.HasSuffix(flag, "keepalive") || strings.HasSuffix(flag, "duration") ||
				strings.HasSuffix(flag, "margin") || strings.HasSuffix(flag, "cpu") ||
				strings.HasSuffix(flag, "retention") || strings.HasSuffix(flag, "-for") {
				v += "s"
			}
			_, err := Load([]string{"--data", t.TempDir(), flag, v}, func(string) string { return "" })
			if err == nil || !strings.Contains(err.Error(), flag+" must be positive") {
				t.Errorf("%s %s: got %v, want %q", flag, v, err, flag+" must be positive")
			}
		}
	}
}

func TestLoad_defaultsAreValid(t *testing.T) {
	if _, err := Load([]string{"--data", t.TempDir()}, func(string) string { return "" }); err != nil {
		t.Fatal(err)
	}
}

func TestValidateGateway_refusesZeroBodyAndWriteTimeout(t *testing.T) {
	c := Config{AgoraMaxBodyBytes: 0}
	err := c.ValidateGateway()
	for _, flag := range []string{"--agora-max-body-bytes", "--mailbox-stream-write-timeout"} {
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("ValidateGateway(zero config) = %v, want %s refused", err, flag)
		}
	}
}

// A worker needs a few seconds of CPU to be useful: a smaller life is
// refused here rather than raised further down.
func TestLoad_refusesWorkerCPUUnderFourSeconds(t *testing.T) {
	_, err := Load([]string{"--data", t.TempDir(), "--routine-worker-cpu", "3s"}, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "--routine-worker-cpu") {
		t.Errorf("--routine-worker-cpu 3s: got %v, want it refused", err)
	}
	if _, err := Load([]string{"--data", t.TempDir(), "--routine-worker-cpu", "4s"}, func(string) string { return "" }); err != nil {
		t.Errorf("--routine-worker-cpu 4s: %v", err)
	}
}

// The journal is on unless --dispatcher-journal=false or
// PARLEY_DISPATCHER_JOURNAL=false turns it off; the flag wins.
func TestLoad_dispatcherJournal(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  string
		want bool
	}{
		{"default", nil, "", true},
		{"flag off", []string{"--dispatcher-journal=false"}, "", false},
		{"env off", nil, "false", false},
		{"flag on over env off", []string{"--dispatcher-journal"}, "false", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			getenv := func(k string) string {
				if k == "PARLEY_DISPATCHER_JOURNAL" {
					return tc.env
				}
				return ""
			}
			c, err := Load(append([]string{"--data", t.TempDir()}, tc.args...), getenv)
			if err != nil {
				t.Fatal(err)
			}
			if c.Journal != tc.want {
				t.Errorf("Load(%q, PARLEY_DISPATCHER_JOURNAL=%q).Journal = %v, want %v", tc.args, tc.env, c.Journal, tc.want)
			}
		})
	}
}
