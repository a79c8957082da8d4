package deploycheck

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Paths of the deployment files, relative to this package's directory.
const (
	composeFile = "../../docker-compose.yml"
	k8sDir      = "../../deploy/k8s"
)

// edit is one deliberate change to a copied file: the first occurrence of old
// (or every occurrence, if all is set) becomes new.
type edit struct {
	file     string // slash-separated, relative to the copied tree
	old, new string
	all      bool
}

// apply rewrites e.file under root. It fails the test if old is not in the
// file, so that an edit never silently stops breaking anything.
func (e edit) apply(t *testing.T, root string) {
	t.Helper()
	path := filepath.Join(root, filepath.FromSlash(e.file))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("os.ReadFile(%q): %v", path, err)
	}
	text := string(data)
	if !strings.Contains(text, e.old) {
		t.Fatalf("edit of %s: %q not found; update the test case", e.file, e.old)
	}
	n := 1
	if e.all {
		n = -1
	}
	text = strings.Replace(text, e.old, e.new, n)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatalf("os.WriteFile(%q): %v", path, err)
	}
}

// copyTree copies the regular files under src into dst, keeping the layout.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type().IsRegular():
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(target, data, 0o644)
		default:
			return fmt.Errorf("%s: not a regular file or directory", path)
		}
	})
}

// parleyService is what the deployment files must say about one process.
type parleyService struct {
	name string
	// stateful services keep bbolt files under /var/lib/parley.
	stateful bool
	// grpcService is the name the service registers with grpc.health.v1;
	// empty for the gateway, which is checked over HTTP.
	grpcService string
	// peers are the services it dials, as dns:///<peer>:9090.
	peers []string
	// startsAfter are the services compose must see healthy first.
	startsAfter []string
}

var parleyServices = []parleyService{
	{
		name:        "registry",
		stateful:    true,
		grpcService: "parley.registry.v1.RegistryService",
	},
	{
		name:        "negotiator",
		stateful:    true,
		grpcService: "parley.negotiator.v1.NegotiatorService",
		startsAfter: []string{"registry"},
	},
	{
		name:        "dispatcher",
		stateful:    true,
		grpcService: "parley.dispatcher.v1.DispatcherService",
		peers:       []string{"registry", "negotiator"},
		startsAfter: []string{"registry"},
	},
	{
		name:        "tasks",
		stateful:    true,
		grpcService: "parley.tasks.v1.TasksService",
		peers:       []string{"dispatcher"},
		startsAfter: []string{"dispatcher"},
	},
	{
		name:        "gateway",
		peers:       []string{"registry", "negotiator", "dispatcher", "tasks"},
		startsAfter: []string{"registry", "negotiator", "dispatcher", "tasks"},
	},
}

const (
	dataDir = "/var/lib/parley"
	// nonrootUID is the nonroot user of the distroless base image.
	nonrootUID = 65532
	// defaultShutdownTimeout is the services' --shutdown-timeout default.
	defaultShutdownTimeout = 10 * time.Second
)

// peerAddr is how services address a peer.
func peerAddr(peer string) string { return "dns:///" + peer + ":9090" }

// peerEnv is the variable that carries the address of peer, e.g.
// PARLEY_REGISTRY_ADDR.
func peerEnv(peer string) string { return "PARLEY_" + strings.ToUpper(peer) + "_ADDR" }

// shutdownTimeout reads PARLEY_SHUTDOWN_TIMEOUT as the services do, with the
// flag's default when it is unset.
func shutdownTimeout(value string, set bool) (time.Duration, error) {
	if !set {
		return defaultShutdownTimeout, nil
	}
	return time.ParseDuration(value)
}

// wantArgs is the command line a container must be given: nothing for the
// services, whose images run the service binary, and the subcommand for the
// gateway, whose image runs the parley CLI.
func wantArgs(s parleyService) []string {
	if s.name == "gateway" {
		return []string{"gateway"}
	}
	return nil
}

func serviceNames() []string {
	names := make([]string, len(parleyServices))
	for i, s := range parleyServices {
		names[i] = s.name
	}
	slices.Sort(names)
	return names
}
