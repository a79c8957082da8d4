package deploycheck

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

const imageRepoPrefix = "ghcr.io/parleyhq/parley-"

// manifests are the rendered resources of one kustomization, by name.
type manifests struct {
	deployments map[string]*appsv1.Deployment
	services    map[string]*corev1.Service
	claims      map[string]*corev1.PersistentVolumeClaim
	budgets     map[string]*policyv1.PodDisruptionBudget
}

// strictDecoder decodes YAML into the typed Kubernetes objects and fails on
// unknown or duplicate fields. Field names match case-sensitively, so
// readOnlyRootFileSystem is as wrong as replica (encoding/json alone would
// take the former).
var strictDecoder = func() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{appsv1.AddToScheme, corev1.AddToScheme, policyv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	return kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme,
		kjson.SerializerOptions{Yaml: true, Strict: true})
}()

// renderKustomization builds the kustomization in dir, as `kubectl kustomize`
// does, and decodes every resource strictly. Only Deployments, Services,
// PersistentVolumeClaims and PodDisruptionBudgets are expected.
func renderKustomization(dir string) (*manifests, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resources, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	m := &manifests{
		deployments: map[string]*appsv1.Deployment{},
		services:    map[string]*corev1.Service{},
		claims:      map[string]*corev1.PersistentVolumeClaim{},
		budgets:     map[string]*policyv1.PodDisruptionBudget{},
	}
	var errs []error
	for _, r := range resources.Resources() {
		id := r.GetKind() + " " + r.GetName()
		data, err := r.AsYAML()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", id, err))
			continue
		}
		obj, _, err := strictDecoder.Decode(data, nil, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", id, err))
			continue
		}
		switch o := obj.(type) {
		case *appsv1.Deployment:
			m.deployments[o.Name] = o
		case *corev1.Service:
			m.services[o.Name] = o
		case *corev1.PersistentVolumeClaim:
			m.claims[o.Name] = o
		case *policyv1.PodDisruptionBudget:
			m.budgets[o.Name] = o
		default:
			errs = append(errs, fmt.Errorf("%s: unexpected kind %T", id, obj))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	return m, nil
}

// checkKustomization renders dir and holds the result to the deployment
// rules. A non-empty imageTag is the tag every image must carry.
func checkKustomization(dir, imageTag string) error {
	m, err := renderKustomization(dir)
	if err != nil {
		return err
	}
	return checkManifests(m, imageTag)
}

func checkManifests(m *manifests, imageTag string) error {
	var errs []error
	if got, want := slices.Sorted(maps.Keys(m.deployments)), serviceNames(); !slices.Equal(got, want) {
		errs = append(errs, fmt.Errorf("Deployments = %v, want %v", got, want))
	}
	if got, want := slices.Sorted(maps.Keys(m.services)), serviceNames(); !slices.Equal(got, want) {
		errs = append(errs, fmt.Errorf("Services = %v, want %v", got, want))
	}
	var wantClaims []string
	for _, s := range parleyServices {
		if s.stateful {
			wantClaims = append(wantClaims, s.name+"-data")
		}
	}
	slices.Sort(wantClaims)
	if got := slices.Sorted(maps.Keys(m.claims)); !slices.Equal(got, wantClaims) {
		errs = append(errs, fmt.Errorf("PersistentVolumeClaims = %v, want %v", got, wantClaims))
	}
	for _, want := range parleyServices {
		if d, ok := m.deployments[want.name]; ok {
			for _, err := range checkDeployment(d, want, imageTag) {
				errs = append(errs, fmt.Errorf("Deployment %s: %w", want.name, err))
			}
			if s, ok := m.services[want.name]; ok {
				for _, err := range checkService(s, d, want) {
					errs = append(errs, fmt.Errorf("Service %s: %w", want.name, err))
				}
			}
		}
		if c, ok := m.claims[want.name+"-data"]; ok {
			if !slices.Equal(c.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}) {
				errs = append(errs, fmt.Errorf("PersistentVolumeClaim %s: accessModes = %v, want [ReadWriteOnce]", c.Name, c.Spec.AccessModes))
			}
			if _, ok := c.Spec.Resources.Requests[corev1.ResourceStorage]; !ok {
				errs = append(errs, fmt.Errorf("PersistentVolumeClaim %s: no storage request", c.Name))
			}
		}
	}
	return errors.Join(errs...)
}

func checkDeployment(d *appsv1.Deployment, want parleyService, imageTag string) []error {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(format, args...))
	}
	spec := d.Spec.Template.Spec

	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		fail("replicas = %s, want 1", ptrString(d.Spec.Replicas))
	}
	if want.stateful && d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		fail("strategy = %q, want %q: bbolt allows one writer", d.Spec.Strategy.Type, appsv1.RecreateDeploymentStrategyType)
	}
	if sel := d.Spec.Selector; sel == nil || len(sel.MatchLabels) == 0 {
		fail("no selector matchLabels")
	} else {
		for k, v := range sel.MatchLabels {
			if d.Spec.Template.Labels[k] != v {
				fail("pod template label %s = %q, want %q from the selector", k, d.Spec.Template.Labels[k], v)
			}
		}
	}
	if len(spec.Containers) != 1 || spec.Containers[0].Name != want.name {
		var names []string
		for _, c := range spec.Containers {
			names = append(names, c.Name)
		}
		fail("containers = %v, want [%s]", names, want.name)
		return errs
	}
	c := spec.Containers[0]

	// Image.
	repo, tag, _ := strings.Cut(c.Image, ":")
	if repo != imageRepoPrefix+want.name {
		fail("image = %q, want %s%s", c.Image, imageRepoPrefix, want.name)
	}
	if imageTag != "" && tag != imageTag {
		fail("image = %q, want tag %q", c.Image, imageTag)
	}

	// Settings come from the environment, not the command line.
	if c.Command != nil {
		fail("command = %q, want none: the image's entrypoint runs", c.Command)
	}
	if got, want := c.Args, wantArgs(want); !slices.Equal(got, want) {
		fail("args = %q, want %q", got, want)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		if _, dup := env[e.Name]; dup {
			fail("env %s set twice", e.Name)
		}
		env[e.Name] = e.Value
	}
	for _, peer := range want.peers {
		if got := env[peerEnv(peer)]; got != peerAddr(peer) {
			fail("env %s = %q, want %q", peerEnv(peer), got, peerAddr(peer))
		}
	}

	// Shutdown: the kubelet must wait longer than the service drains.
	timeoutValue, timeoutSet := env["PARLEY_SHUTDOWN_TIMEOUT"]
	timeout, err := shutdownTimeout(timeoutValue, timeoutSet)
	if err != nil {
		fail("env PARLEY_SHUTDOWN_TIMEOUT: %v", err)
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= timeout {
		fail("terminationGracePeriodSeconds = %s, want more than the %v shutdown timeout", ptrString(g), timeout)
	}

	// Ports and probes.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	wantPorts := map[string]int32{"grpc": 9090, "http": 8080}
	if want.grpcService == "" {
		wantPorts = map[string]int32{"http": 8080}
	}
	if !maps.Equal(ports, wantPorts) {
		fail("container ports = %v, want %v", ports, wantPorts)
	}
	if want.grpcService != "" {
		checkGRPCProbe := func(kind string, p *corev1.Probe, service string) {
			switch {
			case p == nil:
				fail("no %s probe", kind)
			case p.GRPC == nil:
				fail("%s probe is not a grpc probe", kind)
			case p.GRPC.Port != 9090:
				fail("%s probe port = %d, want 9090", kind, p.GRPC.Port)
			case service != "" && ptrString(p.GRPC.Service) != service:
				fail("%s probe service = %s, want %s", kind, ptrString(p.GRPC.Service), service)
			}
		}
		checkGRPCProbe("readiness", c.ReadinessProbe, want.grpcService)
		checkGRPCProbe("liveness", c.LivenessProbe, "")
		// A service opens its store before it listens: a schema upgrade
		// (the dispatcher's moves every mailbox row, in batches) or a
		// large file's first open can take minutes, and the liveness
		// probe alone would restart it every 40 s, each restart starting
		// over on whatever the last batch left. The startup probe holds
		// the other two off until the service answers.
		checkGRPCProbe("startup", c.StartupProbe, "")
		if p := c.StartupProbe; p != nil {
			if d := time.Duration(p.PeriodSeconds*p.FailureThreshold) * time.Second; d < minStartup {
				fail("startup probe allows %v (periodSeconds × failureThreshold), want at least %v for a store's upgrade", d, minStartup)
			}
		}
	} else {
		checkHTTPProbe := func(kind string, p *corev1.Probe, path string) {
			switch {
			case p == nil:
				fail("no %s probe", kind)
			case p.HTTPGet == nil:
				fail("%s probe is not an httpGet probe", kind)
			case p.HTTPGet.Path != path:
				fail("%s probe path = %q, want %q", kind, p.HTTPGet.Path, path)
			case p.HTTPGet.Port != intstr.FromString("http") && p.HTTPGet.Port != intstr.FromInt32(8080):
				fail("%s probe port = %s, want http (8080)", kind, p.HTTPGet.Port.String())
			}
		}
		checkHTTPProbe("readiness", c.ReadinessProbe, "/readyz")
		checkHTTPProbe("liveness", c.LivenessProbe, "/healthz")
	}

	// Resources.
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			fail("no %s request", r)
		}
		if _, ok := c.Resources.Limits[r]; !ok {
			fail("no %s limit", r)
		}
	}

	// Security: container settings override the pod's.
	pod := spec.SecurityContext
	if pod == nil {
		pod = &corev1.PodSecurityContext{}
	}
	sc := c.SecurityContext
	if sc == nil {
		sc = &corev1.SecurityContext{}
	}
	if v := firstNonNil(sc.RunAsNonRoot, pod.RunAsNonRoot); v == nil || !*v {
		fail("runAsNonRoot = %s, want true", ptrString(v))
	}
	if v := firstNonNil(sc.RunAsUser, pod.RunAsUser); v == nil || *v != nonrootUID {
		fail("runAsUser = %s, want %d", ptrString(v), nonrootUID)
	}
	if v := sc.ReadOnlyRootFilesystem; v == nil || !*v {
		fail("readOnlyRootFilesystem = %s, want true", ptrString(v))
	}
	if v := sc.AllowPrivilegeEscalation; v == nil || *v {
		fail("allowPrivilegeEscalation = %s, want false", ptrString(v))
	}
	if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
		fail("capabilities = %+v, want drop [ALL] and no add", sc.Capabilities)
	}
	if sc.Privileged != nil && *sc.Privileged {
		fail("privileged = true, want false")
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil {
		seccomp = pod.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		fail("seccompProfile = %+v, want RuntimeDefault", seccomp)
	}

	// State: the claim mounted at the data directory, which is what the
	// service is told to use.
	if want.stateful {
		claimVolume := ""
		for _, v := range spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == want.name+"-data" {
				claimVolume = v.Name
			}
		}
		mounted := false
		for _, vm := range c.VolumeMounts {
			if vm.MountPath == dataDir && vm.Name == claimVolume && claimVolume != "" && !vm.ReadOnly {
				mounted = true
			}
		}
		if !mounted {
			fail("PersistentVolumeClaim %s-data not mounted read-write at %s", want.name, dataDir)
		}
		if got := env["PARLEY_DATA"]; got != dataDir {
			fail("env PARLEY_DATA = %q, want %q", got, dataDir)
		}
	}

	// Access control is on: every service and the gateway read the
	// operator token from the one Secret they share.
	{
		secretVolume := ""
		for _, v := range spec.Volumes {
			if v.Secret != nil && v.Secret.SecretName == tokenSecret {
				secretVolume = v.Name
			}
		}
		mounted := false
		for _, vm := range c.VolumeMounts {
			mounted = mounted || (secretVolume != "" && vm.Name == secretVolume && env[tokenEnv] != "" && path.Dir(env[tokenEnv]) == vm.MountPath)
		}
		if !mounted {
			fail("env %s = %q is not in the Secret %s", tokenEnv, env[tokenEnv], tokenSecret)
		}
	}
	return errs
}

// tokenSecret is the Secret holding the operator token every service
// shares (key token).
const tokenSecret = "parley-operator-token"

func checkService(s *corev1.Service, d *appsv1.Deployment, want parleyService) []error {
	var errs []error
	if len(s.Spec.Selector) == 0 {
		errs = append(errs, errors.New("no selector"))
	}
	for k, v := range s.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			errs = append(errs, fmt.Errorf("selector %s=%s does not match Deployment %s's pods", k, v, d.Name))
		}
	}
	ports := map[string]int32{}
	for _, p := range s.Spec.Ports {
		ports[p.Name] = p.Port
		if p.TargetPort != intstr.FromString(p.Name) {
			errs = append(errs, fmt.Errorf("port %s: targetPort = %s, want %s", p.Name, p.TargetPort.String(), p.Name))
		}
	}
	wantPorts := map[string]int32{"grpc": 9090, "http": 8080}
	if want.grpcService == "" {
		wantPorts = map[string]int32{"http": 8080}
	}
	if !maps.Equal(ports, wantPorts) {
		errs = append(errs, fmt.Errorf("ports = %v, want %v", ports, wantPorts))
	}
	return errs
}

// checkOverlayChangesOnlyEnv compares an overlay's rendering with its base's:
// they may differ only in container env and image tags.
func checkOverlayChangesOnlyEnv(base, overlay *manifests) error {
	var errs []error
	strip := func(d *appsv1.Deployment) *appsv1.Deployment {
		d = d.DeepCopy()
		for i := range d.Spec.Template.Spec.Containers {
			c := &d.Spec.Template.Spec.Containers[i]
			c.Env = nil
			c.Image, _, _ = strings.Cut(c.Image, ":")
		}
		return d
	}
	if !maps.EqualFunc(base.deployments, overlay.deployments, func(a, b *appsv1.Deployment) bool {
		return semanticEqual(strip(a), strip(b))
	}) {
		errs = append(errs, errors.New("Deployments differ from base beyond env and image tags"))
	}
	if !maps.EqualFunc(base.services, overlay.services, semanticEqual) {
		errs = append(errs, errors.New("Services differ from base"))
	}
	if !maps.EqualFunc(base.claims, overlay.claims, semanticEqual) {
		errs = append(errs, errors.New("PersistentVolumeClaims differ from base"))
	}
	return errors.Join(errs...)
}

// checkK8sTree checks base and the dev overlay of a deploy/k8s tree.
func checkK8sTree(root string) error {
	base, err := renderKustomization(filepath.Join(root, "base"))
	if err != nil {
		return err
	}
	dev, err := renderKustomization(filepath.Join(root, "overlays", "dev"))
	if err != nil {
		return err
	}
	var errs []error
	if err := checkManifests(base, ""); err != nil {
		errs = append(errs, fmt.Errorf("base: %w", err))
	}
	if err := checkManifests(dev, "dev"); err != nil {
		errs = append(errs, fmt.Errorf("overlays/dev: %w", err))
	}
	if err := checkOverlayChangesOnlyEnv(base, dev); err != nil {
		errs = append(errs, fmt.Errorf("overlays/dev against base: %w", err))
	}
	return errors.Join(errs...)
}

// semanticEqual compares API objects as the API server would, e.g. 1Gi and
// 1024Mi are equal.
func semanticEqual[T any](a, b T) bool { return equality.Semantic.DeepEqual(a, b) }

func firstNonNil[T any](ptrs ...*T) *T {
	for _, p := range ptrs {
		if p != nil {
			return p
		}
	}
	return nil
}

// minStartup is the least time a service's startup probe gives it to
// open its store (docs/benchmarks.md: the dispatcher's schema-13 upgrade
// moves about 30,000 dialogues a second on the CI machines).
const minStartup = 30 * time.Minute

func ptrString[T any](p *T) string {
	if p == nil {
		return "<unset>"
	}
	return fmt.Sprint(*p)
}

func TestKustomize_devOverlayFollowsPolicy(t *testing.T) {
	dir := filepath.Join(k8sDir, "overlays", "dev")
	if err := checkKustomization(dir, "dev"); err != nil {
		t.Errorf("checkKustomization(%q, %q) = %v, want nil", dir, "dev", err)
	}
}

func TestKustomize_baseFollowsPolicy(t *testing.T) {
	dir := filepath.Join(k8sDir, "base")
	if err := checkKustomization(dir, ""); err != nil {
		t.Errorf("checkKustomization(%q, %q) = %v, want nil", dir, "", err)
	}
}

func TestKustomize_devOverlayChangesOnlyEnv(t *testing.T) {
	base, err := renderKustomization(filepath.Join(k8sDir, "base"))
	if err != nil {
		t.Fatalf("renderKustomization(base) error = %v, want nil", err)
	}
	dev, err := renderKustomization(filepath.Join(k8sDir, "overlays", "dev"))
	if err != nil {
		t.Fatalf("renderKustomization(dev) error = %v, want nil", err)
	}
	if err := checkOverlayChangesOnlyEnv(base, dev); err != nil {
		t.Errorf("checkOverlayChangesOnlyEnv(base, dev) = %v, want nil", err)
	}
	for name, d := range dev.deployments {
		for _, e := range d.Spec.Template.Spec.Containers[0].Env {
			if e.Name == "PARLEY_LOG_LEVEL" && e.Value != "debug" {
				t.Errorf("dev Deployment %s: PARLEY_LOG_LEVEL = %q, want %q", name, e.Value, "debug")
			}
		}
	}
}

func TestKustomize_rejectsBrokenTree(t *testing.T) {
	const (
		registry   = "base/registry/deployment.yaml"
		negotiator = "base/negotiator/deployment.yaml"
		dispatcher = "base/dispatcher/deployment.yaml"
		tasks      = "base/tasks/deployment.yaml"
		gateway    = "base/gateway/deployment.yaml"
		baseKust   = "base/kustomization.yaml"
		devKust    = "overlays/dev/kustomization.yaml"
		devEnv     = "overlays/dev/env.yaml"
	)
	tests := []struct {
		name    string
		edit    edit
		wantErr string
	}{
		{
			name:    "misspelled replicas",
			edit:    edit{file: registry, old: "  replicas: 1\n", new: "  replica: 1\n"},
			wantErr: `unknown field "spec.replica"`,
		},
		{
			name:    "wrong case in readOnlyRootFilesystem",
			edit:    edit{file: dispatcher, old: "readOnlyRootFilesystem: true", new: "readOnlyRootFileSystem: true"},
			wantErr: `unknown field "spec.template.spec.containers[0].securityContext.readOnlyRootFileSystem"`,
		},
		{
			name:    "unknown field in an overlay patch",
			edit:    edit{file: devEnv, old: "              value: debug\n", new: "              valeu: debug\n"},
			wantErr: `unknown field "spec.template.spec.containers[0].env[0].valeu"`,
		},
		{
			name:    "two replicas of a bbolt service",
			edit:    edit{file: tasks, old: "  replicas: 1\n", new: "  replicas: 2\n"},
			wantErr: "Deployment tasks: replicas = 2, want 1",
		},
		{
			name:    "rolling update of a bbolt service",
			edit:    edit{file: registry, old: "    type: Recreate\n", new: "    type: RollingUpdate\n"},
			wantErr: `Deployment registry: strategy = "RollingUpdate"`,
		},
		{
			name:    "no claim for a bbolt service",
			edit:    edit{file: baseKust, old: "  - dispatcher/pvc.yaml\n", new: ""},
			wantErr: "PersistentVolumeClaims = [negotiator-data registry-data tasks-data]",
		},
		{
			name:    "claim not mounted",
			edit:    edit{file: tasks, old: "              mountPath: /var/lib/parley\n", new: "              mountPath: /data\n"},
			wantErr: "Deployment tasks: PersistentVolumeClaim tasks-data not mounted",
		},
		{
			name:    "operator token not from the shared Secret",
			edit:    edit{file: negotiator, old: "secretName: parley-operator-token", new: "secretName: negotiator-token"},
			wantErr: "Deployment negotiator: env PARLEY_OPERATOR_TOKEN_FILE = \"/run/parley/token\" is not in the Secret parley-operator-token",
		},
		{
			name:    "shared claim",
			edit:    edit{file: dispatcher, old: "claimName: dispatcher-data", new: "claimName: registry-data"},
			wantErr: "Deployment dispatcher: PersistentVolumeClaim dispatcher-data not mounted",
		},
		{
			name:    "http liveness probe",
			edit:    edit{file: negotiator, old: "          livenessProbe:\n            grpc:\n              port: 9090\n", new: "          livenessProbe:\n            tcpSocket:\n              port: 9090\n"},
			wantErr: "Deployment negotiator: liveness probe is not a grpc probe",
		},
		{
			name:    "short grace period",
			edit:    edit{file: gateway, old: "terminationGracePeriodSeconds: 15", new: "terminationGracePeriodSeconds: 10"},
			wantErr: "Deployment gateway: terminationGracePeriodSeconds = 10",
		},
		{
			name:    "shutdown timeout raised past the grace period",
			edit:    edit{file: devEnv, old: "              value: debug\n", new: "              value: debug\n            - name: PARLEY_SHUTDOWN_TIMEOUT\n              value: 30s\n"},
			wantErr: "Deployment registry: terminationGracePeriodSeconds = 15, want more than the 30s",
		},
		{
			name:    "capabilities kept",
			edit:    edit{file: gateway, old: "drop: [ALL]", new: "drop: [NET_RAW]"},
			wantErr: "Deployment gateway: capabilities",
		},
		{
			name:    "root allowed",
			edit:    edit{file: registry, old: "runAsNonRoot: true", new: "runAsNonRoot: false", all: true},
			wantErr: "Deployment registry: runAsNonRoot = false",
		},
		{
			name:    "no memory limit",
			edit:    edit{file: tasks, old: "              cpu: 500m\n              memory: 256Mi\n", new: "              cpu: 500m\n"},
			wantErr: "Deployment tasks: no memory limit",
		},
		{
			name:    "wrong image tag",
			edit:    edit{file: devKust, old: "newTag: dev", new: "newTag: latest"},
			wantErr: `Deployment registry: image = "ghcr.io/parleyhq/parley-registry:latest", want tag "dev"`,
		},
		{
			name:    "overlay changes more than env",
			edit:    edit{file: devEnv, old: "          env:\n", new: "          workingDir: /tmp\n          env:\n"},
			wantErr: "Deployments differ from base beyond env and image tags",
		},
		{
			name:    "settings on the command line",
			edit:    edit{file: gateway, old: "args: [gateway]", new: "args: [gateway, --http=:9000]"},
			wantErr: `Deployment gateway: args = ["gateway" "--http=:9000"], want ["gateway"]`,
		},
		{
			name:    "wrong peer address",
			edit:    edit{file: tasks, old: "value: dns:///dispatcher:9090", new: "value: dispatcher:9090"},
			wantErr: `Deployment tasks: env PARLEY_DISPATCHER_ADDR = "dispatcher:9090"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			if err := copyTree(k8sDir, root); err != nil {
				t.Fatalf("copyTree(%q, %q): %v", k8sDir, root, err)
			}
			tt.edit.apply(t, root)

			err := checkK8sTree(root)
			if err == nil {
				t.Fatalf("checkK8sTree(broken: %s) = nil, want an error containing %q", tt.name, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("checkK8sTree(broken: %s) = %v, want an error containing %q", tt.name, err, tt.wantErr)
			}
			t.Logf("checkK8sTree(broken: %s) = %v", tt.name, err)
		})
	}
}

func TestKustomize_treeFollowsPolicy(t *testing.T) {
	// The same function as the broken-tree cases, on the real tree.
	if err := checkK8sTree(k8sDir); err != nil {
		t.Errorf("checkK8sTree(%q) = %v, want nil", k8sDir, err)
	}
}
