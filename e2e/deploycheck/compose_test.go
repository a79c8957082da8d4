package deploycheck

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

// loadCompose parses, validates and normalizes a compose file the way
// `docker compose config` does. It reads only that file: no process
// environment, no .env file, no Docker daemon and no network.
func loadCompose(ctx context.Context, path string) (*types.Project, error) {
	opts, err := cli.NewProjectOptions([]string{path},
		cli.WithWorkingDirectory(filepath.Dir(path)),
		cli.WithInterpolation(true),
		cli.WithConsistency(true),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		return nil, fmt.Errorf("compose options for %s: %w", path, err)
	}
	return opts.LoadProject(ctx)
}

// checkCompose loads the compose file at path and holds it to the deployment
// rules. It returns every violation found.
func checkCompose(ctx context.Context, path string) error {
	p, err := loadCompose(ctx, path)
	if err != nil {
		return fmt.Errorf("load %s: %w", path, err)
	}
	return checkComposeProject(p)
}

func checkComposeProject(p *types.Project) error {
	var errs []error
	if got, want := slices.Sorted(maps.Keys(p.Services)), serviceNames(); !slices.Equal(got, want) {
		errs = append(errs, fmt.Errorf("services = %v, want %v", got, want))
	}
	dataVolumes := map[string]string{} // volume name -> service
	for _, want := range parleyServices {
		s, ok := p.Services[want.name]
		if !ok {
			continue
		}
		for _, err := range checkComposeService(p, s, want) {
			errs = append(errs, fmt.Errorf("service %s: %w", want.name, err))
		}
		for _, v := range s.Volumes {
			if v.Type != types.VolumeTypeVolume || v.Target != dataDir {
				continue
			}
			if other, ok := dataVolumes[v.Source]; ok {
				errs = append(errs, fmt.Errorf("services %s and %s share volume %q; bbolt allows one writer", other, want.name, v.Source))
			}
			dataVolumes[v.Source] = want.name
		}
	}
	return errors.Join(errs...)
}

func checkComposeService(p *types.Project, s types.ServiceConfig, want parleyService) []error {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(format, args...))
	}

	// Image: the root Dockerfile with SERVICE set to the service's name.
	if b := s.Build; b == nil {
		fail("no build section, want the root Dockerfile with SERVICE=%s", want.name)
	} else {
		if arg := b.Args["SERVICE"]; arg == nil || *arg != want.name {
			fail("build arg SERVICE = %s, want %q", deref(arg), want.name)
		}
		if b.Context != p.WorkingDir {
			fail("build context = %q, want the repository root %q", b.Context, p.WorkingDir)
		}
		if b.Dockerfile != "Dockerfile" {
			fail("build dockerfile = %q, want %q", b.Dockerfile, "Dockerfile")
		}
	}

	// Hardening.
	if !s.ReadOnly {
		fail("read_only = false, want true")
	}
	if uid, err := composeUID(s.User); err != nil {
		fail("user %q: %v", s.User, err)
	} else if uid == 0 {
		fail("user %q runs as root, want a non-root uid", s.User)
	}
	if !slices.Contains(s.CapDrop, "ALL") {
		fail("cap_drop = %v, want it to contain ALL", s.CapDrop)
	}

	// Shutdown: Docker must wait longer than the service drains.
	timeoutValue, timeoutSet := lookupEnv(s.Environment, "PARLEY_SHUTDOWN_TIMEOUT")
	timeout, err := shutdownTimeout(timeoutValue, timeoutSet)
	if err != nil {
		fail("PARLEY_SHUTDOWN_TIMEOUT: %v", err)
	}
	grace := 10 * time.Second // Docker's default stop timeout
	if s.StopGracePeriod != nil {
		grace = time.Duration(*s.StopGracePeriod)
	}
	if grace <= timeout {
		fail("stop_grace_period = %v, want more than the %v shutdown timeout", grace, timeout)
	}

	// Health: the parley CLI inside the image probes the service itself.
	wantTest := []string{"CMD", "/parley", "health", "--server", "127.0.0.1:9090"}
	if want.grpcService == "" {
		wantTest = []string{"CMD", "/parley", "health", "--url", "http://127.0.0.1:8080/readyz"}
	}
	switch hc := s.HealthCheck; {
	case hc == nil || hc.Disable:
		fail("no healthcheck, want test %q", wantTest)
	case !slices.Equal(hc.Test, wantTest):
		fail("healthcheck test = %q, want %q", hc.Test, wantTest)
	}

	// Start order.
	if got := slices.Sorted(maps.Keys(s.DependsOn)); !slices.Equal(got, slices.Sorted(slices.Values(want.startsAfter))) {
		fail("depends_on = %v, want %v", got, slices.Sorted(slices.Values(want.startsAfter)))
	}
	for _, name := range slices.Sorted(maps.Keys(s.DependsOn)) {
		if c := s.DependsOn[name].Condition; c != types.ServiceConditionHealthy {
			fail("depends_on %s: condition = %q, want %q", name, c, types.ServiceConditionHealthy)
		}
	}

	// Only the gateway is reachable from the host.
	var published []string
	for _, port := range s.Ports {
		published = append(published, port.Published+":"+strconv.FormatUint(uint64(port.Target), 10))
	}
	wantPorts := []string(nil)
	if want.name == "gateway" {
		wantPorts = []string{"8080:8080"}
	}
	if !slices.Equal(published, wantPorts) {
		fail("published ports = %q, want %q", published, wantPorts)
	}

	// State.
	if want.stateful {
		var found bool
		for _, v := range s.Volumes {
			if v.Target != dataDir {
				continue
			}
			found = true
			if v.Type != types.VolumeTypeVolume {
				fail("%s is a %s mount, want a named volume", dataDir, v.Type)
			} else if _, ok := p.Volumes[v.Source]; !ok {
				fail("%s: volume %q is not declared under volumes", dataDir, v.Source)
			}
		}
		if !found {
			fail("no volume at %s", dataDir)
		}
		if got, _ := lookupEnv(s.Environment, "PARLEY_DATA"); got != dataDir {
			fail("PARLEY_DATA = %q, want %q", got, dataDir)
		}
	}

	// Settings come from the environment, not the command line.
	if got, want := []string(s.Command), wantArgs(want); !slices.Equal(got, want) {
		fail("command = %q, want %q", got, want)
	}
	for _, peer := range want.peers {
		if got, _ := lookupEnv(s.Environment, peerEnv(peer)); got != peerAddr(peer) {
			fail("%s = %q, want %q", peerEnv(peer), got, peerAddr(peer))
		}
	}

	// Access control is on: the services and the gateway share one
	// operator token file, on one volume.
	{
		tokenFile, _ := lookupEnv(s.Environment, tokenEnv)
		shared := false
		for _, v := range s.Volumes {
			shared = shared || (v.Type == types.VolumeTypeVolume && v.Source == tokenVolume && tokenFile != "" && filepath.Dir(tokenFile) == v.Target)
		}
		if !shared {
			fail("%s = %q is not on the shared volume %q", tokenEnv, tokenFile, tokenVolume)
		}
	}
	return errs
}

// tokenEnv names the operator token's file; every service and the gateway
// read it from tokenVolume, which they share.
const (
	tokenEnv    = "PARLEY_OPERATOR_TOKEN_FILE"
	tokenVolume = "operator-token"
)

// composeUID returns the numeric uid of a compose `user` value ("uid" or
// "uid:gid"). Names are rejected: only a number shows that the user is not
// root without looking inside the image.
func composeUID(user string) (int, error) {
	if user == "" {
		return 0, errors.New("not set, so the image's user applies; want an explicit non-root uid")
	}
	name, _, _ := strings.Cut(user, ":")
	uid, err := strconv.Atoi(name)
	if err != nil {
		return 0, fmt.Errorf("want a numeric uid: %w", err)
	}
	return uid, nil
}

func lookupEnv(env types.MappingWithEquals, key string) (string, bool) {
	v, ok := env[key]
	if !ok || v == nil {
		return "", false
	}
	return *v, true
}

func deref(s *string) string {
	if s == nil {
		return "<unset>"
	}
	return strconv.Quote(*s)
}

func TestCompose_followsPolicy(t *testing.T) {
	if err := checkCompose(t.Context(), composeFile); err != nil {
		t.Errorf("checkCompose(%q) = %v, want nil", composeFile, err)
	}
}

func TestCompose_ignoresProcessEnvironment(t *testing.T) {
	// A developer's shell must not change what the check sees.
	t.Setenv("COMPOSE_FILE", "does-not-exist.yml")
	t.Setenv("COMPOSE_PROJECT_NAME", "other")
	p, err := loadCompose(t.Context(), composeFile)
	if err != nil {
		t.Fatalf("loadCompose(%q) error = %v, want nil", composeFile, err)
	}
	if p.Name != "parley" {
		t.Errorf("loadCompose(%q).Name = %q, want %q", composeFile, p.Name, "parley")
	}
}

func TestCompose_rejectsBrokenFile(t *testing.T) {
	const file = "docker-compose.yml"
	tests := []struct {
		name    string
		edit    edit
		wantErr string
	}{
		{
			name:    "unknown key",
			edit:    edit{file: file, old: "  read_only: true\n", new: "  readonly: true\n"},
			wantErr: "readonly",
		},
		{
			name:    "depends_on an undefined service",
			edit:    edit{file: file, old: "      dispatcher:\n        condition: service_healthy\n\n  # `parley gateway`", new: "      dispatch:\n        condition: service_healthy\n\n  # `parley gateway`"},
			wantErr: "dispatch",
		},
		{
			name:    "undeclared volume",
			edit:    edit{file: file, old: "      - tasks-data:/var/lib/parley\n", new: "      - task-data:/var/lib/parley\n"},
			wantErr: "task-data",
		},
		{
			name:    "depends_on without health",
			edit:    edit{file: file, old: "        condition: service_healthy\n", new: "        condition: service_started\n"},
			wantErr: "service_started",
		},
		{
			name:    "stateful service without a volume",
			edit:    edit{file: file, old: "      - registry-data:/var/lib/parley\n", new: ""},
			wantErr: "service registry: no volume at /var/lib/parley",
		},
		{
			name:    "stateful service without a healthcheck",
			edit:    edit{file: file, old: "      - dispatcher-data:/var/lib/parley\n      - *operator-token\n    healthcheck: *grpc-healthcheck\n", new: "      - dispatcher-data:/var/lib/parley\n      - *operator-token\n"},
			wantErr: "service dispatcher: no healthcheck",
		},
		{
			name:    "two services on one bbolt volume",
			edit:    edit{file: file, old: "      - tasks-data:/var/lib/parley\n", new: "      - dispatcher-data:/var/lib/parley\n"},
			wantErr: "share volume",
		},
		{
			name:    "service without the shared operator token",
			edit:    edit{file: file, old: "      - tasks-data:/var/lib/parley\n      - *operator-token\n", new: "      - tasks-data:/var/lib/parley\n"},
			wantErr: "service tasks: PARLEY_OPERATOR_TOKEN_FILE = \"/run/parley/operator.token\" is not on the shared volume",
		},
		{
			name:    "service port published",
			edit:    edit{file: file, old: "      - registry-data:/var/lib/parley\n      - *operator-token\n", new: "      - registry-data:/var/lib/parley\n      - *operator-token\n    ports:\n      - \"9090:9090\"\n"},
			wantErr: "service registry: published ports",
		},
		{
			name:    "root user",
			edit:    edit{file: file, old: `user: "65532:65532"`, new: `user: "0:0"`},
			wantErr: "runs as root",
		},
		{
			name:    "writable root file system",
			edit:    edit{file: file, old: "  read_only: true\n", new: "  read_only: false\n"},
			wantErr: "read_only = false",
		},
		{
			name:    "grace period not above the shutdown timeout",
			edit:    edit{file: file, old: "stop_grace_period: 15s", new: "stop_grace_period: 10s"},
			wantErr: "stop_grace_period",
		},
		{
			name:    "wrong build arg",
			edit:    edit{file: file, old: "        SERVICE: tasks\n", new: "        SERVICE: task\n"},
			wantErr: "service tasks: build arg SERVICE",
		},
		{
			name:    "gateway peer address as a bare host",
			edit:    edit{file: file, old: "      PARLEY_TASKS_ADDR: dns:///tasks:9090\n", new: "      PARLEY_TASKS_ADDR: tasks:9090\n"},
			wantErr: `service gateway: PARLEY_TASKS_ADDR = "tasks:9090"`,
		},
		{
			name:    "settings on the command line",
			edit:    edit{file: file, old: "    command: [gateway]\n", new: "    command: [gateway, --http=:9000]\n"},
			wantErr: "service gateway: command = ",
		},
		{
			name:    "missing service",
			edit:    edit{file: file, old: "  gateway:\n", new: "  api:\n"},
			wantErr: "services = ",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			data, err := os.ReadFile(composeFile)
			if err != nil {
				t.Fatalf("os.ReadFile(%q): %v", composeFile, err)
			}
			path := filepath.Join(dir, file)
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatalf("os.WriteFile(%q): %v", path, err)
			}
			tt.edit.apply(t, dir)

			err = checkCompose(t.Context(), path)
			if err == nil {
				t.Fatalf("checkCompose(broken: %s) = nil, want an error containing %q", tt.name, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("checkCompose(broken: %s) = %v, want an error containing %q", tt.name, err, tt.wantErr)
			}
			t.Logf("checkCompose(broken: %s) = %v", tt.name, err)
		})
	}
}
